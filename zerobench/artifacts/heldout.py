"""REPORT.md's headline on the model's transfer: its error on published runs it had not seen.

Leave-one-source-out (each A100 source judged with constants fitted on the others,
results/external_loso.csv) and the frozen holdout scored once (results/external_holdout.csv): both
written by the commands in README "External validation" (fitting/write_bands.py,
fitting/external.py). Reads the CSVs only; no fitting import.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def _rows(df: pd.DataFrame, by: str) -> list[str]:
    lines = []
    for name, sub in [*df.groupby(by, sort=True), ("all", df)]:
        err = sub.error_pct.dropna().astype(float)
        if not len(err):
            continue
        lines.append(f"| {name} | {sub.hardware.iloc[0] if name != 'all' else 'all'} | {len(err)} | "
                     f"{err.abs().mean():.1f} | {err.abs().max():.1f} | {err.mean():+.1f} |")  # fmt: skip
    return lines


def heldout_section(results: Path) -> str | None:
    """The section (markdown), or None where the two CSVs are not in `results`."""
    loso_path, hold_path = Path(results) / "external_loso.csv", Path(results) / "external_holdout.csv"
    if not (loso_path.exists() and hold_path.exists()):
        return None
    loso, hold = pd.read_csv(loso_path), pd.read_csv(hold_path)
    cannot = hold[hold.expressible.astype(str).str.strip() != "yes"]
    head = "| source | hardware | runs | mean abs error % | worst % | mean error % |\n|---|---|---|---|---|---|"
    rev = ", ".join(sorted(hold.git_rev.dropna().astype(str).unique()))
    return "\n\n".join([
        "## Held-out error: the model on published runs it had not seen",
        "**Leave-one-source-out** (the headline): each A100 source's validation rows, predicted with the "
        "per-GPU constants fitted on the other sources' fit rows only (`results/external_loso.csv`).",
        head + "\n" + "\n".join(_rows(loso, "source")),
        f"**Frozen holdout**: {len(hold)} runs of {hold.source.nunique()} sources entered before any model change "
        f"and scored once at revision {rev} (`results/external_holdout.csv`); {len(cannot)} runs the model cannot "
        "express (pipeline stages, unstated layouts) are kept there with the reason and not scored.",
        head + "\n" + "\n".join(_rows(hold, "source")),
        "Every modelled figure carries these errors as its regime's band (`error_band_pct`, "
        "zerobench/data/error_bands.csv); a regime with fewer than 3 held-out runs is `unvalidated`.",
    ])  # fmt: skip
