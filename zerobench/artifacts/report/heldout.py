"""REPORT.md's headline on the model's transfer: its error on published runs.

Three kinds of runs, named for what they are: leave-one-source-out (each A100 source's validation
rows judged with the per-GPU constants fitted on the other sources; model choices were made while
looking at these rows, so they are validation, not held out, results/external_loso.csv); the rows
entered as holdout before any model change on which a choice was made since (role `validation`:
megatron-lm-2021, whose profile mechanism was designed after its first scoring); and the holdout
rows no choice was made on (role `holdout`), each with its scoring history
(results/external_holdout.csv, fitting/external.py SCORINGS). The holdout runs the memory model
calls out of memory (all of them trained) are listed with their count; the regimes' bands and the
pooled band, set on the validation runs, and their coverage counted on the holdout runs alone, with
the check's power (artifacts/report/coverage_section.py) close the section.
Reads the CSVs only; no fitting import.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from zerobench.artifacts.report.coverage_section import coverage_text
from zerobench.perfmodel.error_bands import BANDS, COVERAGE, MIN_RUNS, POOLED_COVERAGE, pooled


def _rows(df: pd.DataFrame, by: str, column: str = "error_pct") -> list[str]:
    lines = []
    for name, sub in [*df.groupby(by, sort=True), ("all", df)]:
        err = sub[column].dropna().astype(float)
        if not len(err):
            continue
        lines.append(
            f"| {name} | {sub.hardware.iloc[0] if name != 'all' else 'all'} | {len(err)} | "
            f"{err.abs().mean():.1f} | {err.abs().max():.1f} | {err.mean():+.1f} |"
        )
    return lines


def _scored(hold: pd.DataFrame, title: str) -> str:
    """A table of holdout-entered rows at each scoring: the first, then the current."""
    first, now = hold.assign(error_pct=hold.first_error_pct), hold
    return "\n".join(
        [
            title + "\n",
            HEAD,
            *[f"| first: {line[2:]}" for line in _rows(first, "source")],
            *[f"| now: {line[2:]}" for line in _rows(now, "source")],
        ]
    )


def heldout_section(results: Path) -> str | None:
    """The section (markdown), or None where the two CSVs are not in `results`."""
    loso_path, hold_path = Path(results) / "external_loso.csv", Path(results) / "external_holdout.csv"
    if not (loso_path.exists() and hold_path.exists()):
        return None
    loso, hold = pd.read_csv(loso_path), pd.read_csv(hold_path)
    cannot = hold[hold.expressible.astype(str).str.strip() != "yes"]
    head = HEAD
    expressed = _expressed(hold)
    seen, unseen = expressed[expressed.role == "validation"], expressed[expressed.role == "holdout"]
    history = "; ".join(sorted(hold.history.dropna().astype(str).str.split(";").str[0].unique()))
    oom = _called_oom(expressed)
    earlier = [
        (path.stem.rsplit("_", 1)[1], len(_called_oom(_expressed(pd.read_csv(path)))))
        for path in sorted(Path(results).glob("external_holdout_at_*.csv"))
    ]
    oom_lines = [
        f"- {r.source}: {r.model} on {int(r.gpus)} {r.hardware} (MP {int(r.mp)}, stage {int(r.stage)}, "
        f"micro-batch {int(r.micro_batch)}; the model's largest {int(r.model_max_micro_batch)}; needs "
        f"{getattr(r, 'model_memory_gb', '?')} GB)"
        for r in oom.itertuples()
    ]
    return "\n\n".join([
        "## Validation and holdout: the model on published runs",
        "**Leave-one-source-out validation**: each A100 source's validation rows, predicted with the "
        "per-GPU constants fitted on the other sources' fit rows only (`results/external_loso.csv`). Model "
        "choices were made while these rows were in view, so they are validation, not held out.",
        head + "\n" + "\n".join(_rows(loso, "source")),
        f"**Entered as holdout**: {len(hold)} runs of {hold.source.nunique()} sources entered before any model "
        f"change (`results/external_holdout.csv`), every expressed one {history}: it was scored {len(earlier) + 1} "
        "times, not once; each earlier record is kept (`external_holdout_at_<revision>.csv`). "
        f"{len(cannot)} runs the model cannot express (pipeline stages, unstated layouts) are kept there with the "
        "reason and not scored.",
        _scored(seen, f"**Now validation** ({len(seen)} runs: {', '.join(sorted(seen.source.unique()))}). The "
                "`deepspeed-0.3` profile's mechanism for megatron-lm-2021 (list-form host ops, a wait per gather) "
                "was designed after these runs' first scoring, with their error growing with the GPU count in view; "
                "its cost per host op is borrowed from this engine's H200 calibration (perfmodel/choices.py). These "
                "runs are validation, not holdout."),
        _scored(unseen, f"**Holdout** ({len(unseen)} runs, no choice of the model made on them): the first "
                "scoring was by a model built before they were seen; the second after the collective schedule, "
                "which was not designed on them; the third after the model's memory became the engine's, which moves "
                "memory verdicts only."),
        _sensitivity(Path(results) / "external_sensitivity.csv"),
        f"**Out of memory, says the model, for {len(oom)} of the {len(expressed)} expressed runs entered as "
        f"holdout** ({len(unseen)} holdout, {len(seen)} now validation; of each: {_by_role(oom)}), all "
        "of which trained (at the earlier scorings: " + ", ".join(f"{n} at {rev}" for rev, n in earlier) + "):"
        + ("\n" + "\n".join(oom_lines) if oom_lines else " none."),
        _bands_table(results),
    ])  # fmt: skip


def _by_role(runs: pd.DataFrame) -> str:
    """'k holdout, m validation': how many of `runs` have each role."""
    return ", ".join(f"{int((runs.role == r).sum())} {r}" for r in ("holdout", "validation"))


def _expressed(df: pd.DataFrame) -> pd.DataFrame:
    return df[df.expressible.astype(str).str.strip() == "yes"]


def _called_oom(expressed: pd.DataFrame) -> pd.DataFrame:
    """The expressed runs the memory model calls out of memory (every one of them trained)."""
    return expressed[~expressed.model_fits.astype(str).str.lower().isin(("true", "1"))]


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


def _bands_table(results: Path) -> str:
    """The regimes' bands as zerobench/data/error_bands.csv holds them, and their coverage counted on
    the runs that set none (results/external_coverage.csv)."""
    bands = pd.read_csv(BANDS)
    pct, runs = pooled()
    lines = [f"Every modelled row of a table carries one band (`band_pct`, with `band_basis`): its regime's, the "
             f"{COVERAGE:.0%} prediction interval of |error| over the regime's validation runs above "
             "(leave-one-source-out, and the holdout rows a choice was made on; perfmodel/error_bands.py), where "
             f"they are {MIN_RUNS} or more; else the pooled band, ±{pct:.1f} %, the {POOLED_COVERAGE:.0%} "
             f"interval of all {runs} validation runs (error_bands.POOLED), which a memory row takes as an "
             "assumption. A regime with fewer runs has no band of its own: `unvalidated` below, as its records say.",
             "| regime | runs | band % | mean abs % | worst % |", "|---|---|---|---|---|"]  # fmt: skip
    for r in bands.itertuples():
        value = "unvalidated" if pd.isna(r.band_pct) else f"±{r.band_pct:.1f}"
        lines.append(
            f"| {r.generation}, {r.kind}, {r.scale} | {r.runs} | {value} | {r.mean_abs_pct:.1f} | {r.worst_pct:.1f} |"
        )
    return "\n".join(lines) + "\n\n" + coverage_text(results)
