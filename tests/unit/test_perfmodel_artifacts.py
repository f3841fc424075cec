"""The regenerated artifacts: the targets on each figure's judged points (fitted, formula and
derived rows never count: artifacts/judging/common.py), regression pins on today's errors, the shapes the
paper shows, and the run time. Targets the model does not reach are strict xfails with the reason
(docs/perfmodel.md explains each)."""

from __future__ import annotations

import pytest

from zerobench.artifacts.tables.in_process import ARTIFACTS, mape
from zerobench.fitting.batch_check import batch_check

# Regression pins, not checks against the paper: each artifact's MAPE over its judged points as the
# model gives it today (docs/perfmodel.md, "Results against the paper"), in %. A change that makes
# one worse by more than PIN_MARGIN fails here; one that improves it should lower the pin. They say
# nothing about whether the model is right: the targets below and the report's verdicts do that.
# fig3, fig6, fig7, fig8 and table2 have no judged point (each row carries a choice or a fitted term:
# perfmodel/choices.py; fig7's P_os rows `zero_os_stage1`), so no pin.
REGRESSION_PINS = {"fig2": 35.4, "fig5": 21.9}
PIN_MARGIN = 1.0  # percentage points
MISSES_10 = {  # why the 10% target on the judged points is missed (see docs/perfmodel.md, "What misses")
    "fig2": "the Megatron baselines run 15-29% fast at batch 2 (100B-170B) and +120% at 40B's listed batch 4",
    "fig5": "C1 reads the engine's P_os, which reduces no flat copy of every gradient, as DeepSpeed's of 2020 did: "
    "48.7B against 40B",
}
# Points more than 25% off, every role, with the reason (docs/perfmodel.md, "What misses").
MISSES_25 = {
    ("table2", f"MP {mp} baseline measured"): "the engine's baseline keeps no fp32 gradient buffer (Megatron's "
    "fp16 optimizer of 2019 kept 4 bytes per parameter): it fits a larger model"
    for mp in (1, 2, 4, 8, 16)
} | {
    ("fig2", "baseline 40B"): "at the listed batch 4, +120 %; 5.0 conflicts with 60B's 6.3",
    ("fig2", "baseline 170B"): "MP 256 across 16 nodes: NCCL's tree all-reduce and the refitted IB efficiency (0.77) "
    "make it +29 %",
    ("fig2", "ZeRO 170B"): "at the listed batch 12, which fits the engine (7 did the formula: +4.2 %)",
    ("fig2", "speed-up 40B"): "a ratio over baseline 40B, +120 % fast",
    ("fig2", "speed-up 100B"): "ZeRO 100B (fitted, −15 %) over a baseline +17 % fast",
    ("fig3", "64 GPUs"): "the largest swept batch that fits the engine is 32, against the 16 the paper's code fit",
    ("fig3", "64 GPUs total"): "64 GPUs' TFLOPS x 64",
    ("fig5", "C2"): "C2 = 60B (the paper most likely tried only its 60B shape); the engine fits 97B",
    ("fig7", "60B C2"): "C2 at batch 4 is 1.9x slower per sample than C1 at batch 2 in the paper (+41%)",
    ("fig7", "60B C3"): "the listed batch 32 needs 40 GB of checkpoints; at the 11 that fits: +58%",
    ("fig7", "60B C5"): "31.9 at batch 8 is faster per sample than Fig 3's 64-GPU run at batch 16",
    ("fig7", "170B C5"): "the same prediction as fig2 ZeRO 170B",
    ("fig8", "max model DDP"): "the engine's DDP keeps no fp32 gradient buffer: 1.78B against the paper's 1.4B",
}
PAPER = ("table2", "fig2", "fig3", "fig5", "fig6", "fig7", "fig8")
# the judged ones among them, by artifact (the others are fitted or derived)
JUDGED_OVER_25 = {"fig2": [("fig2", "baseline 40B"), ("fig2", "baseline 170B")]}


@pytest.fixture(scope="module")
def frames():
    return {name: fn() for name, fn in ARTIFACTS.items()}


def test_all_artifacts_regenerate_with_their_columns(frames):
    for name in ARTIFACTS:
        df = frames[name]
        assert {"ours", "paper", "error_pct", "source"} <= set(df.columns), name
        assert set(df["source"]) <= {"modelled", "formula"}


@pytest.mark.parametrize("name", sorted(REGRESSION_PINS))
def test_judged_mape_regression_pin(frames, name):
    value, worst, points = mape(frames[name], judged_only=True)
    assert points > 0
    pin = REGRESSION_PINS[name]
    assert value <= pin + PIN_MARGIN, f"{name}: judged MAPE {value:.1f}% (pinned {pin}%)"


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.xfail(reason=MISSES_10[n], strict=True)) if n in MISSES_10 else n
     for n in sorted(REGRESSION_PINS)],
)  # fmt: skip
def test_judged_mape_target_10_percent(frames, name):
    assert mape(frames[name], judged_only=True)[0] <= 10.0


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.xfail(reason="; ".join(MISSES_25[row] for row in JUDGED_OVER_25[n]),
                                             strict=True)) if n in JUDGED_OVER_25 else n
     for n in sorted(REGRESSION_PINS)],
)  # fmt: skip
def test_no_judged_point_worse_than_25_percent(frames, name):
    assert mape(frames[name], judged_only=True)[1] <= 25.0


def test_points_worse_than_25_percent_are_the_known_ones(frames):
    worse = {(n, k) for n in PAPER for k, e in zip(frames[n]["key"], frames[n]["error_pct"], strict=True)
             if e == e and e is not None and abs(float(e)) > 25.0}  # fmt: skip
    assert worse == set(MISSES_25)  # a new one is a regression, a fixed one an update


def test_fig3_superlinear_from_memory(frames):
    from zerobench.sweeps.sheets import load_sheet, sheet_trials

    sweep = {}  # GPUs -> the batches the authors' sweep files list (the fig3 sheet's trials)
    for trial in (t for group in sheet_trials(load_sheet("fig3")) for t in group):
        sweep.setdefault(trial["gpus"], []).append(trial["micro_batch"])
    df = frames["fig3"]
    per_gpu = df[df.series == "TFLOPS/GPU"].set_index("gpus")
    total = df[df.series == "total TFLOPS"].set_index("gpus")["ours"]
    assert total[128] / total[64] > 2.0  # superlinear 64 -> 128
    assert per_gpu.loc[128, "ours"] > per_gpu.loc[64, "ours"]
    batches = per_gpu["micro_batch"].tolist()  # chosen by memory, not put in
    assert batches[0] < batches[1] <= max(batches)
    for gpus, run in per_gpu.iterrows():  # the largest of the authors' sweep that fits, never the paper's pick
        assert run["micro_batch"] == max(g for g in sweep[gpus] if g <= run["max_micro_batch"])


def test_fig5_order(frames):
    size = frames["fig5"].set_index("key")["ours"]
    assert size["C1"] < size["C2"] < size["C4"] < size["C5"]
    assert size["C3"] < size["C4"]


def test_fig8_peak_in_the_middle(frames):
    df = frames["fig8"]
    zero = df[df.series == "ZeRO-DP"]["ours"].tolist()
    peak = zero.index(max(zero))
    assert 0 < peak < len(zero) - 1
    limits = df[df.series == "max model (B)"].set_index("key")["ours"]
    # the engine's DDP fits more than the paper's 1.4B (a miss, MISSES_25): it keeps no fp32 gradient
    # buffer, which Megatron's fp16 optimizer of 2019 did (4 bytes per parameter)
    assert 1.6 < limits["max model DDP"] < 2.0
    # a fit point of reserve_bytes (constants.FITTED) that carries the NCCL allowance: not a reproduced shape
    assert df.set_index("key").loc["max model ZeRO-DP", "role"] == "fitted"
    assert 12 <= limits["max model ZeRO-DP"] <= 14.5


def test_fig2_baseline_collapses_beyond_one_node(frames):
    base = frames["fig2"][frames["fig2"].series == "Megatron baseline"]
    inside = base[base.mp <= 16]["ours"].dropna()
    across = base[base.mp > 16]["ours"].dropna()
    # 23-29 TFLOPS inside a node, at most 11.0 across (40B at its listed batch 4; the paper: 5.0)
    assert inside.min() > 2.0 * across.max()
    zero = frames["fig2"][frames["fig2"].series == "ZeRO-100B"]
    assert zero["ours"].notna().all()


def test_fig7_170b_needs_offload(frames):
    df = frames["fig7"].set_index("key")
    for config in ("C1", "C2", "C3", "C4"):
        assert df.loc[f"170B {config}", "status"] == "oom"
    assert df.loc["170B C5", "status"] == "ok"


def test_fig6_offload_saves_memory_only_for_100b(frames):
    cached = frames["fig6"].set_index("key")["ours"]
    assert cached["40B C1"] > cached["40B C2"] and cached["40B C1"] > cached["40B C3"]
    assert abs(cached["40B C4"] - cached["40B C5"]) < 1.0
    assert cached["100B C4"] - cached["100B C5"] > 1.0


# Listed runs whose listed batch the memory model does not fit (docs/perfmodel.md, "Batch check").
BATCH_MISSES = {"fig7 60B C3"}


def test_paper_batches_fit_the_memory_model():
    df = batch_check().set_index("run")
    assert len(df) == 45
    assert set(df.index[~df["fits"]]) == BATCH_MISSES  # a new miss is a regression, a fixed one an update
    assert df.loc["fig7 60B C3", "max_micro_batch"] < 16  # batch 32 without P_a: 40 GB of checkpoints
    # the engine fits up to 15x a listed batch (C5: its checkpoints leave the device), the formula of the
    # paper's codes 6.75x: the paper chose its batches for its codes, not for this engine
    assert (df["ratio"] <= 15).all()
