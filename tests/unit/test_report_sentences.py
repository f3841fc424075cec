"""REPORT's sentences say only what their tables show: each computed from the CSVs it describes
(gpu_section.py, plan_section.py, heldout.py, claims.py, the peers section), and the committed
REPORT.md free of the sentences its tables contradicted."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from zerobench.artifacts.report import plan_section
from zerobench.artifacts.report.gpu_section import memory_sentence
from zerobench.artifacts.report.heldout import heldout_section

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_the_h200_memory_sentence_reads_the_two_profiles_columns():
    compare = pd.read_csv(RESULTS / "gpu/h200/compare.csv")
    said = memory_sentence(compare)
    assert "same bytes for all 12 runs" in said and "prices the paper's codes" not in said
    moved = compare.copy()
    moved.loc[0, "calibrated_predicted_peak_bytes"] *= 1.1
    assert "differ for 1 of 12 runs" in memory_sentence(moved)


def test_a_plan_gain_inside_the_band_is_not_a_finding():
    row = pd.Series(dict(tokens_per_s=100.0, band_pct=22.29, band_basis="pooled (46 validation runs, 90%)"))
    inside = plan_section._gap(row.copy().where(row.index != "tokens_per_s", 115.0), row)
    assert "+15.0% against the published layout" in inside and "inside the ±22.29% band" in inside
    assert "cannot tell" in inside
    outside = plan_section._gap(row.copy().where(row.index != "tokens_per_s", 130.0), row)
    assert "outside" in outside and "past the model's error" in outside
    plan = pd.read_csv(RESULTS / "plan/paper_100b.csv")
    ranked = plan[plan["rank"].notna()]  # V100 has no regime band of its own: every layout the pooled one
    assert plan_section._bands(ranked) == f"{len(ranked)} on the pooled band"


def test_the_plan_validation_says_what_was_fitted_on_its_runs():
    text = plan_section._validation(pd.read_csv(RESULTS / "plan_validation.csv"))
    assert "27 fit rows, the a100-80gb, h100-80gb constants fitted on them" in text
    assert "nothing is fitted here" not in text


def test_the_out_of_memory_count_names_holdout_and_validation_apart():
    text = heldout_section(RESULTS)
    said = "expressed runs entered as holdout** (13 holdout, 6 now validation; of each: 0 holdout, 1 validation)"
    assert said in text


def test_the_committed_report_says_none_of_what_its_tables_contradicted():
    report = (RESULTS / "REPORT.md").read_text()
    for said in ("prices the paper's codes", "aggregates over judged rows only", "regime's held-out band",
                 "as fast as and no larger than the systems", "nothing is fitted here", "38-41 TFLOPS", "30+ TFLOPS",
                 "expressed holdout runs**"):  # fmt: skip
        assert said not in report, said
    assert "runs 35.9-38.6 TFLOPS/GPU from 8B to 100B" in report and "over 40 TFLOPS/GPU on average" in report
