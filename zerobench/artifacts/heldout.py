"""REPORT.md's headline on the model's transfer: its error on published runs.

Two kinds of runs, named for what they are: leave-one-source-out (each A100 source's validation
rows judged with the per-GPU constants fitted on the other sources; model choices were made while
looking at these rows, so they are validation, not held out, results/external_loso.csv), and the
frozen holdout, entered before any model change and scored once (results/external_holdout.csv);
both written by the commands in README "External validation" (fitting/write_bands.py,
fitting/external.py). The holdout runs the memory model calls out of memory (all of them trained)
are listed with their count; the regimes' bands and their leave-one-out coverage close the section.
Reads the CSVs only; no fitting import.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from zerobench.perfmodel.error_bands import BANDS, COVERAGE


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
    expressed = hold[hold.expressible.astype(str).str.strip() == "yes"]
    oom = expressed[~expressed.model_fits.astype(str).str.lower().isin(("true", "1"))]
    oom_lines = [f"- {r.source}: {r.model} on {int(r.gpus)} {r.hardware} (MP {int(r.mp)}, stage {int(r.stage)}, "
                 f"micro-batch {int(r.micro_batch)})" for r in oom.itertuples()]  # fmt: skip
    return "\n\n".join([
        "## Validation and frozen holdout: the model on published runs",
        "**Leave-one-source-out validation**: each A100 source's validation rows, predicted with the "
        "per-GPU constants fitted on the other sources' fit rows only (`results/external_loso.csv`). Model "
        "choices were made while these rows were in view, so they are validation, not held out.",
        head + "\n" + "\n".join(_rows(loso, "source")),
        f"**Frozen holdout**: {len(hold)} runs of {hold.source.nunique()} sources entered before any model change "
        f"and scored once at revision {rev} (`results/external_holdout.csv`); {len(cannot)} runs the model cannot "
        "express (pipeline stages, unstated layouts) are kept there with the reason and not scored.",
        head + "\n" + "\n".join(_rows(hold, "source")),
        f"**Out of memory, says the model, for {len(oom)} of the {len(expressed)} expressed holdout runs**, all "
        "of which trained:" + ("\n" + "\n".join(oom_lines) if oom_lines else " none."),
        _bands_table(),
    ])  # fmt: skip


def _bands_table() -> str:
    """The regimes' bands as zerobench/data/error_bands.csv holds them."""
    bands = pd.read_csv(BANDS)
    lines = [f"Every modelled figure carries its regime's band (`error_band_pct`): the {COVERAGE:.0%} prediction "
             "interval of |error| over the regime's runs above (leave-one-source-out and holdout; "
             "perfmodel/error_bands.py), `unvalidated` where they are too few for one.",
             "| regime | runs | band % | mean abs % | worst % |", "|---|---|---|---|---|"]  # fmt: skip
    for r in bands.itertuples():
        value = "unvalidated" if pd.isna(r.error_band_pct) else f"±{r.error_band_pct:.1f}"
        lines.append(f"| {r.generation}, {r.kind}, {r.scale} | {r.runs} | {value} | {r.mean_abs_pct:.1f} | "
                     f"{r.worst_pct:.1f} |")  # fmt: skip
    inside, judged = int(bands.loo_inside.sum()), int(bands.loo_judged.sum())
    lines.append(f"\nCoverage, each run judged by the band of its regime's other runs (leave-one-out): "
                 f"{inside} of {judged} inside ({inside / max(judged, 1):.0%}; declared {COVERAGE:.0%}).")  # fmt: skip
    return "\n".join(lines)
