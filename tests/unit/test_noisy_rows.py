"""A measured row whose runs spread past the tolerance is left out as too noisy (artifacts/noisy_rows.py),
so that model_vs_measured's verdict does not depend on which runs a reproduction got: shown here on
the committed runs, each reproduction being two of the three runs of every row."""

from __future__ import annotations

import itertools
from pathlib import Path
from statistics import median

import pandas as pd
import yaml

from zerobench.artifacts.noisy_rows import mark_noisy, runs_of
from zerobench.artifacts.report import section, stats

ROOT = Path(__file__).resolve().parents[2]
SHEET = yaml.safe_load((ROOT / "workflows/config/sheets/model_vs_measured.yaml").read_text())


def _reproduction(df: pd.DataFrame, keep: tuple[int, ...]) -> pd.DataFrame:
    """The table as if only the runs `keep` of every row had been taken."""
    out = df.copy()
    timed = out.measured_runs_s.notna()
    runs = out.loc[timed, "measured_runs_s"].map(lambda t: [runs_of(t)[i] for i in keep])
    out.loc[timed, "measured_runs_s"] = runs.map(lambda r: " ".join(map(str, r)))
    out.loc[timed, "expected"] = runs.map(median)
    out.loc[timed, "runs_spread_pct"] = runs.map(lambda r: 100 * (max(r) - min(r)) / median(r))
    out.loc[timed, "error_pct"] = 100 * (out.ours[timed] - out.expected[timed]) / out.expected[timed]
    return out


def test_the_verdict_is_the_same_whichever_runs_a_reproduction_got():
    df = pd.read_csv(ROOT / "results/model_vs_measured.csv")
    verdicts = set()
    for keep in [(0, 1, 2), *itertools.combinations(range(3), 2)]:
        _, line = section("model_vs_measured", SHEET, _reproduction(df, keep))
        verdicts.add(line.rsplit("|", 2)[-2].strip())
    assert len(verdicts) == 1, verdicts


def test_a_row_past_the_tolerance_is_left_out_and_counted():
    df = pd.DataFrame(dict(key=["a", "b"], role="judged", ours=[1.0, 1.0], error_pct=[5.0, 40.0],
                           measured_runs_s=["1.0 1.01", "0.6 0.9"], runs_spread_pct=[1.0, 40.0]))  # fmt: skip
    marked = mark_noisy(df, 10)
    assert list(marked.too_noisy) == [False, True]
    s = stats(marked)
    assert s["n"] == 1 and s["noisy"] == 1 and s["max"] == 5.0
