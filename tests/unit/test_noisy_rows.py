"""A measured row whose runs spread past the tolerance is judged all the same and named as noisy
(artifacts/judging/noisy_rows.py): no rule set with the errors in view leaves it out of the verdict."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from zerobench.artifacts.judging.common import judged
from zerobench.artifacts.judging.noisy_rows import mark_noisy
from zerobench.artifacts.report.report import section, stats, verdict

ROOT = Path(__file__).resolve().parents[2]
SHEET = yaml.safe_load((ROOT / "workflows/config/sheets/model_vs_measured.yaml").read_text())


def test_a_row_past_the_tolerance_is_judged_and_named():
    df = pd.DataFrame(dict(key=["a", "b"], role="judged", ours=[1.0, 1.0], error_pct=[5.0, 40.0],
                           measured_runs_s=["1.0 1.01", "0.6 0.9"], runs_spread_pct=[1.0, 40.0]))  # fmt: skip
    marked = mark_noisy(df, 10)
    assert list(marked.too_noisy) == [False, True]
    s = stats(marked)
    assert s["n"] == 2 and s["noisy"] == 1 and s["max"] == 40.0  # the noisy row's error in the verdict
    assert "judged though noisy: 1" in verdict(s, 10)


def test_the_committed_verdict_reads_every_judged_step_row():
    df = pd.read_csv(ROOT / "results/model_vs_measured.csv")
    _, line = section("model_vs_measured", SHEET, df)
    rows = judged(mark_noisy(df, SHEET["tolerance_pct"]))
    rows = rows[~rows.slow_spell.eq(True)] if "slow_spell" in rows else rows
    assert f"| {len(rows)} |" in line
