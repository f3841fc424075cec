"""REPORT's coverage check of the error bands, with its power (perfmodel/coverage_check.py): the count
of runs that set no band inside the band the others set (results/external_coverage.csv), the check's
three criteria for the model, and the same check for the predictors it must be able to fail (a
constant, the model with a term left out: results/external_coverage_power.csv, written by
fitting/coverage_power.py). Where the runs cannot fail one of those, the section says so. Reads the
CSVs only."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from zerobench.perfmodel.coverage_check import ALPHA, FEWEST_TO_FAIL, at_most_p, declared

COVERAGE_CSV = "external_coverage.csv"  # fitting/write_bands.py COVERAGE_OUT
POWER_CSV = "external_coverage_power.csv"  # fitting/coverage_power.py POWER_OUT
MODEL = "the model"  # fitting/coverage_power.py MODEL


def _true(col: pd.Series) -> pd.Series:
    return col.astype(str).str.lower().isin(("true", "1"))


def count_text(check: pd.DataFrame) -> str:
    """How many of the runs that set no band and moved no choice fall inside the band the others set,
    with n and the test of the declared coverages; where they are too few for any count to fail, that,
    and no number."""
    n, inside = len(check), int(_true(check.inside).sum())
    sources = ", ".join(sorted(check.source.unique())) or "none"
    fewest = FEWEST_TO_FAIL["coverage"]
    if n < fewest:
        return (
            f"**Coverage: too few runs to check.** {n} run(s) set no band and moved no choice ({sources}); "
            f"under {fewest} no count could fail the declared coverage, so none is given."
        )
    coverages = [declared(str(b)) for b in check.band_basis]
    p = at_most_p(inside, coverages)
    said = "fails" if p < ALPHA else "is consistent with"
    declared_text = " and ".join(f"{c:.0%}" for c in sorted(set(coverages)))
    return (
        f"**Coverage** (`{COVERAGE_CSV}`): {inside} of {n} runs that set no band and moved no choice "
        f"({sources}: holdout rows scored more than once, `history` in external_holdout.csv, no choice made on "
        f"them) fall inside the band the validation runs set for their regime, or the pooled band (n = {n}); at "
        f"the bands' declared {declared_text} as few or fewer inside has probability {p:.2f} (one-sided, each "
        f"run at its band's declared coverage), so the count {said} the declared coverage. The validation runs "
        "are not counted: they set the bands."
    )


def _verdict(r) -> str:
    if _true(pd.Series([r.passes])).iloc[0]:
        return "passes"
    if isinstance(r.failed, str) and r.failed:
        return f"**fails** ({r.failed})"
    return f"cannot fail ({r.cannot_fail}: too few runs)"


def power_text(power: pd.DataFrame) -> str:
    """The check for each predictor, and what the runs can and cannot fail."""
    lines = [
        "| predictor | runs its term moves >1 % | inside | coverage p | Kendall tau-b | skill p | below / above "
        "| sign p | mean abs % | mean % | check |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in power.itertuples():
        moved = "" if pd.isna(r.moved) else int(r.moved)
        lines.append(
            f"| {r.predictor} | {moved} | {r.inside} of {r.runs} | {r.coverage_p:.2f} | {r.tau:+.2f} | "
            f"{r.skill_p:.2g} | {r.below} / {r.above} | {r.sign_p:.2g} | {r.mean_abs_pct:.1f} | {r.mean_pct:+.1f} | "
            f"{_verdict(r)} |"
        )
    model, others = power[power.predictor == MODEL].iloc[0], power[power.predictor != MODEL]
    passing = others[_true(others.passes)]
    failing = others[~_true(others.passes)]
    said = [
        f"**The check, with power** (`{POWER_CSV}`, perfmodel/coverage_check.py). A count inside the band alone "
        "cannot fail a predictor that knows nothing where the runs vary less than the band is wide, so the check "
        f"also asks, each at {ALPHA:.0%}: **skill**, that the predictions order the runs as the published values "
        "do (Kendall's tau-b, one-sided permutation p; a constant has no order and cannot pass), and **centred**, "
        "that the errors do not lean one way (two-sided sign test: a band of |error| about 0 set on runs centred "
        "near 0 covers new runs only where they are like them). The model: "
        + _verdict(model)
        + f", its errors {model.below} of {model.runs} below the published value and {model.above} above, mean "
        f"{model.mean_pct:+.1f} %.",
        "\n".join(lines),
    ]
    own = set(str(model.failed).split("; ")) - {""}
    alike = failing.failed.fillna("").astype(str).map(lambda f: bool(f) and set(f.split("; ")) <= own)
    if (~alike).any():
        said.append(f"These runs fail {'; '.join(failing.predictor[~alike])}.")
    if alike.any():
        names, why = "; ".join(failing.predictor[alike]), "; ".join(sorted(own))
        said.append(
            f"Failed too, but only where the model itself fails ({why}), so saying nothing of the term they leave "
            f"out: {names}."
        )
    if len(passing):
        cannot = "; ".join(
            f"{r.predictor} passes ({r.inside} of {r.runs} inside, mean |error| {r.mean_abs_pct:.1f} % against the "
            f"model's {model.mean_abs_pct:.1f} %; its term moves {int(r.moved)} of the {r.runs} runs)"
            for r in passing.itertuples()
        )
        said.append(
            f"**n = {model.runs} is too few, and the runs too alike, to fail every wrong model**: {cannot}. On these "
            "runs the check cannot tell such a model from ours."
        )
    return "\n\n".join(said)


def coverage_text(results: Path) -> str:
    """The count, then, where the power table is there, the check with its power."""
    text = count_text(pd.read_csv(Path(results) / COVERAGE_CSV))
    power = Path(results) / POWER_CSV
    return text if not power.exists() else text + "\n\n" + power_text(pd.read_csv(power))
