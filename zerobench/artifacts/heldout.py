"""REPORT.md's headline on the model's transfer: its error on published runs.

Three kinds of runs, named for what they are: leave-one-source-out (each A100 source's validation
rows judged with the per-GPU constants fitted on the other sources; model choices were made while
looking at these rows, so they are validation, not held out, results/external_loso.csv); the rows
entered as holdout before any model change on which a choice was made since (role `validation`:
megatron-lm-2021, whose profile mechanism was designed after its first scoring); and the holdout
rows no choice was made on (role `holdout`), each with its scoring history
(results/external_holdout.csv, fitting/external.py SCORINGS). The holdout runs the memory model
calls out of memory (all of them trained) are listed with their count; the regimes' bands, the
pooled band and their coverage (leave-one-out, and on the never-seen runs alone) close the section.
Reads the CSVs only; no fitting import.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from zerobench.perfmodel.error_bands import BANDS, COVERAGE, POOLED_COVERAGE, pooled


def _rows(df: pd.DataFrame, by: str, column: str = "error_pct") -> list[str]:
    lines = []
    for name, sub in [*df.groupby(by, sort=True), ("all", df)]:
        err = sub[column].dropna().astype(float)
        if not len(err):
            continue
        lines.append(f"| {name} | {sub.hardware.iloc[0] if name != 'all' else 'all'} | {len(err)} | "
                     f"{err.abs().mean():.1f} | {err.abs().max():.1f} | {err.mean():+.1f} |")  # fmt: skip
    return lines


def _scored(hold: pd.DataFrame, title: str) -> str:
    """A table of holdout-entered rows at each scoring: the first, then the current."""
    first, now = hold.assign(error_pct=hold.first_error_pct), hold
    return "\n".join([title + "\n", HEAD, *[f"| first: {line[2:]}" for line in _rows(first, "source")],
                      *[f"| now: {line[2:]}" for line in _rows(now, "source")]])  # fmt: skip


def heldout_section(results: Path) -> str | None:
    """The section (markdown), or None where the two CSVs are not in `results`."""
    loso_path, hold_path = Path(results) / "external_loso.csv", Path(results) / "external_holdout.csv"
    if not (loso_path.exists() and hold_path.exists()):
        return None
    loso, hold = pd.read_csv(loso_path), pd.read_csv(hold_path)
    cannot = hold[hold.expressible.astype(str).str.strip() != "yes"]
    head = HEAD
    expressed = hold[hold.expressible.astype(str).str.strip() == "yes"]
    seen, unseen = expressed[expressed.role == "validation"], expressed[expressed.role == "holdout"]
    history = "; ".join(sorted(hold.history.dropna().astype(str).str.split(";").str[0].unique()))
    oom = expressed[~expressed.model_fits.astype(str).str.lower().isin(("true", "1"))]
    oom_lines = [f"- {r.source}: {r.model} on {int(r.gpus)} {r.hardware} (MP {int(r.mp)}, stage {int(r.stage)}, "
                 f"micro-batch {int(r.micro_batch)})" for r in oom.itertuples()]  # fmt: skip
    return "\n\n".join([
        "## Validation and holdout: the model on published runs",
        "**Leave-one-source-out validation**: each A100 source's validation rows, predicted with the "
        "per-GPU constants fitted on the other sources' fit rows only (`results/external_loso.csv`). Model "
        "choices were made while these rows were in view, so they are validation, not held out.",
        head + "\n" + "\n".join(_rows(loso, "source")),
        f"**Entered as holdout**: {len(hold)} runs of {hold.source.nunique()} sources entered before any model "
        f"change (`results/external_holdout.csv`), every expressed one {history}: it was scored twice, not once. "
        f"{len(cannot)} runs the model cannot express (pipeline stages, unstated layouts) are kept there with the "
        "reason and not scored.",
        _scored(seen, f"**Now validation** ({len(seen)} runs: {', '.join(sorted(seen.source.unique()))}). The "
                "`deepspeed-0.3` profile's mechanism for megatron-lm-2021 (list-form host ops, a wait per gather) "
                "was designed after these runs' first scoring, with their error growing with the GPU count in view; "
                "its cost per host op is borrowed from this engine's H200 calibration (perfmodel/choices.py). These "
                "runs are validation, not holdout."),
        _scored(unseen, f"**Holdout** ({len(unseen)} runs, no choice of the model made on them): the first "
                "scoring was by a model built before they were seen; the second after the collective schedule, "
                "which was not designed on them."),
        _sensitivity(Path(results) / "external_sensitivity.csv"),
        f"**Out of memory, says the model, for {len(oom)} of the {len(expressed)} expressed holdout runs**, all "
        "of which trained:" + ("\n" + "\n".join(oom_lines) if oom_lines else " none."),
        _bands_table(),
    ])  # fmt: skip


def _sensitivity(path: Path) -> str:
    """The validation rows' mean |error| with each fragile term of their profile at its assumed range
    (results/external_sensitivity.csv, fitting/external.py `sensitivity`)."""
    if not path.exists():
        return ""
    df = pd.read_csv(path)
    point = df.drop_duplicates(["source", "model", "gpus"]).error_pct.abs().mean()
    parts = [f"{v}: {sub.variant_error_pct.abs().mean():.1f} %" for v, sub in df.groupby("variant", sort=False)]
    names = ", ".join(sorted(df.implementation.unique()))
    return (
        f"**Sensitivity of the `{names}` rows** (perfmodel/implementation.py SENSITIVITY; an assumed range, "
        f"no such host op was timed): mean |error| {point:.1f} % as priced; " + "; ".join(parts) + "."
    )


HEAD = "| source | hardware | runs | mean abs error % | worst % | mean error % |\n|---|---|---|---|---|---|"


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
    unseen_in, unseen = int(bands.unseen_inside.sum()), int(bands.unseen_judged.sum())
    pct, runs = pooled()
    lines.append(f"\nCoverage, each run judged by the band of its regime's other runs (leave-one-out): "
                 f"{inside} of {judged} inside ({inside / max(judged, 1):.0%}; declared {COVERAGE:.0%}); "
                 f"{judged - unseen} of them were in view while the model was built. On the never-seen runs "
                 f"alone (holdout rows no choice was made on, that have a band): {unseen_in} of {unseen} inside "
                 f"(n = {unseen}).\n\nA judged row of the paper's artifacts whose regime has no band takes the "
                 f"pooled band: ±{pct:.1f} %, the {POOLED_COVERAGE:.0%} interval of all {runs} runs above "
                 "(error_bands.POOLED).")  # fmt: skip
    return "\n".join(lines)
