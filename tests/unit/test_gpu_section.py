"""REPORT.md's "On one H200" (zerobench/artifacts/report/gpu_section.py): built from results/gpu/h200 alone,
its numbers the records' own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from zerobench.artifacts.report.gpu_section import gpu_section, summary

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_the_section_reads_the_committed_h200_results():
    text = gpu_section(RESULTS)
    assert text.startswith("## On one H200")
    record = json.loads((RESULTS / "gpu/h200/runs/dp-6b-s0-mb16.json").read_text())
    peer = [json.loads(line) for line in (RESULTS / "gpu/h200/peer.jsonl").read_text().splitlines()]
    plain = next(p for p in peer if p["model"] == "dp-6b" and p["micro_batch"] == 16)
    row = next(line for line in text.splitlines() if line.startswith("| dp-6b | 16 |"))
    assert f"{record['tflops_per_gpu']:.0f} ({record['tflops_per_gpu'] / 989:.2f})" in row
    assert f"{record['step_time_s'] / plain['step_time_s']:.2f}" in row
    # stage 3's host cost was fitted on one run, and two others carry it (perfmodel/choices.py)
    assert "| gpt-1.5b | 3 | 1 | fitted (host_cost.GATHER_HOST_S) |" in text
    assert "| dp-6b | 3 | 1 | fitted (host_cost.GATHER_HOST_S) |" in text
    assert "| dp-6b | 3 | 16 | judged |" in text and "| dp-6b | 0 | 1 | judged |" in text


def test_summary_counts_out_of_memory_calls_and_sets_the_fitted_row_apart():
    compare = pd.DataFrame({
        "model": ["gpt-1.5b", "gpt-1.5b", "dp-6b"], "stage": [3, 0, 0], "micro_batch": [1, 1, 4],
        "status": ["ok"] * 3, "predicted_tflops": [1.0, 1.0, None],
        "tflops_error_pct": [-50.0, 2.0, None], "peak_bytes_error_pct": [1.0, -3.0, 20.0],
    })  # fmt: skip
    line = summary(compare)
    assert "calls 1 out of memory" in line
    assert "micro-batch 1 +2.0 … +2.0 %" in line  # the fitted row's -50 % is not in the range
    assert "Peak memory -3.0 … +20.0 %" in line


def test_no_records_no_section(tmp_path):
    assert gpu_section(tmp_path) is None
    shutil.copytree(RESULTS / "gpu/h200/runs", tmp_path / "gpu/h200/runs")
    text = gpu_section(tmp_path)  # records without peers or compare.csv: the speed table alone
    assert "## On one H200" in text and "The model on these runs" not in text
