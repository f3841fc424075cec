"""What fits one GPU, and how fast, against the H200's own records (results/gpu/h200): the memory
margins measured on the card, no gradient copy where nothing is reduced, and stage 3's host cost
(perfmodel/feasibility.py, hardware.py, host_cost.py; checks/gpu_check.py `--compare`)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from zerobench.checks import gpu_check
from zerobench.engine.config import PRESETS, ModelConfig, ParallelConfig, PrecisionConfig
from zerobench.perfmodel import host_cost
from zerobench.perfmodel.constants import DEFAULT
from zerobench.perfmodel.feasibility import breakdown, code_breakdown, usable_bytes
from zerobench.perfmodel.hardware import PROFILES
from zerobench.perfmodel.predict import predict
from zerobench.perfmodel.profile_file import from_dict, to_dict
from zerobench.trial import configs

H200 = Path(__file__).resolve().parents[2] / "results" / "gpu" / "h200"
MiB = 2**20
BF16 = PrecisionConfig("bf16", "cuda")


def _configs(model: str, stage: int, micro_batch: int):
    return configs({**gpu_check.trial(model, stage, micro_batch), "command": "run"})


def test_h200_holds_what_nvidia_smi_reads_less_what_was_measured_unusable():
    hw = PROFILES["h200-141gb"]
    assert hw.memory_bytes == 143771 * MiB
    assert "143771MiB" in (H200 / "nvidia-smi.txt").read_text().replace(" ", "")
    records = [json.loads(p.read_text()) for p in (H200 / "runs").glob("*.json")]
    assert hw.fragmentation_bytes == max(r["peak_reserved_bytes"] - r["peak_allocated_bytes"] for r in records)
    assert usable_bytes(hw, DEFAULT) == hw.memory_bytes - hw.reserve_bytes - hw.fragmentation_bytes


def test_a_datasheet_profile_without_measurements_keeps_the_fitted_margins():
    hw = PROFILES["a100-80gb"]
    assert usable_bytes(hw, DEFAULT) == pytest.approx(
        hw.memory_bytes * (1 - DEFAULT.fragmentation) - DEFAULT.reserve_bytes
    )
    assert usable_bytes(hw, DEFAULT, contiguous_buffers=True) == hw.memory_bytes - DEFAULT.reserve_bytes


@pytest.mark.parametrize("stage", [0, 1])
def test_no_flat_gradient_copy_where_nothing_is_reduced(stage):
    model = ModelConfig(layers=8, hidden=1024, heads=16, seq=1024, vocab=50257, name="copy-check")
    hw = PROFILES["h200-141gb"]
    # as the paper's codes held memory (code_breakdown): a flat copy of every gradient to reduce, none
    # where one rank reduces nothing
    alone = code_breakdown(model, ParallelConfig(dp=1, stage=stage), BF16, 1, hw, DEFAULT)
    assert alone.reduce_transient_bytes == 0.0
    pair = code_breakdown(model, ParallelConfig(dp=2, stage=stage), BF16, 1, hw, DEFAULT)
    assert pair.reduce_transient_bytes == pair.grad_bytes > 0  # stages 0-1 keep every gradient
    # this engine reduces its buckets in place, copying none (engine_memory.py)
    assert breakdown(model, ParallelConfig(dp=2, stage=stage), BF16, 1, hw, DEFAULT).reduce_transient_bytes == 0.0


def test_compare_from_disk_calls_no_trained_run_out_of_memory(tmp_path):
    shutil.copytree(H200 / "runs", tmp_path / "runs")
    shutil.copy(H200 / "calibrated-cuda.json", tmp_path)
    rows = pd.DataFrame(gpu_check.compare(tmp_path))
    assert len(rows) == 12 and (rows.status == "ok").all()
    for prefix in ("", "calibrated_"):  # an out-of-memory prediction has no TFLOPS
        assert rows[f"{prefix}predicted_tflops"].notna().all()
    # both profiles price this engine as it is now: without the 4 B/param step temporary these runs
    # held, so below them, by no more than that temporary (to 1 GB)
    params = rows.model.map(lambda name: PRESETS[name].num_params)
    for prefix in ("", "calibrated_"):
        below = rows.peak_allocated_bytes - rows[f"{prefix}predicted_peak_bytes"]
        assert (below > 0).all() and (below < 4 * params + 1e9).all(), prefix
    assert pd.read_csv(tmp_path / "compare.csv").shape == rows.shape


def test_measured_fragmentation_fills_a_calibrated_profile_that_has_none(tmp_path):
    records = [{"fragmentation_bytes": 5}, {"fragmentation_bytes": 9}, {}]
    profile = gpu_check.with_measured_margins(H200 / "calibrated-cuda.json", records)
    assert profile.fragmentation_bytes == 9.0
    kept = dataclasses.replace(profile, fragmentation_bytes=3.0)
    assert from_dict(to_dict(kept)).fragmentation_bytes == 3.0  # and the file format carries it


def test_stage3_host_cost_shows_at_small_batches_and_hides_behind_compute():
    hw, ga = PROFILES["h200-141gb"], 1
    model, parallel, precision, _ = _configs("dp-6b", 3, 1)
    at = {c: host_cost.stage3_host_s(model, parallel, ga, c, 2, hw, DEFAULT) for c in (0.0, 0.1, 10.0)}
    gathers = host_cost.gathers_per_step(model, parallel, ga) * host_cost.GATHER_HOST_S
    copy = at[10.0]  # the device copies alone: the host is hidden
    assert copy == pytest.approx(2 * 3 * model.num_params * 2 / (hw.hbm_bw * DEFAULT.hbm_efficiency))
    assert at[0.0] == pytest.approx(gathers + copy)
    assert at[0.0] > at[0.1] > at[10.0]
    for stage in (0, 1, 2):
        assert host_cost.stage3_host_s(model, ParallelConfig(stage=stage), ga, 0.0, 2, hw, DEFAULT) == 0.0
    cpu = dataclasses.replace(hw, ranks_share_compute=True)
    assert host_cost.stage3_host_s(model, parallel, ga, 0.0, 2, cpu, DEFAULT) == 0.0


def test_stage3_costs_more_than_stage0_at_micro_batch_1_and_about_the_same_at_16():
    hw = PROFILES["h200-141gb"]
    steps = {}
    for stage in (0, 3):
        for mb in (1, 16):
            model, parallel, precision, train = _configs("gpt-1.5b", stage, mb)
            steps[stage, mb] = predict(model, parallel, precision, train, hw, 1, attention="fused").step_time_s
    assert steps[3, 1] / steps[0, 1] > 1.3  # as the H200 runs measured (results/gpu/h200/runs)
    assert steps[3, 16] / steps[0, 16] < 1.05


def test_a_gpus_host_ops_overlap_its_device_work():
    from zerobench.perfmodel.kernels import measured_compute_time
    from zerobench.perfmodel.profile_file import load

    gpu = load(H200 / "calibrated-cuda.json")
    model, _, _, _ = _configs("gpt-1.5b", 0, 16)
    _, terms = measured_compute_time(model, 1, 16, 1, True, "fused", gpu, 1, False)
    assert terms["ops_s"] == 0.0  # the device's time hides the host's dispatch at this size
    slow_host = dataclasses.replace(gpu, op_overhead_s=1e-3)
    _, terms = measured_compute_time(model, 1, 16, 1, True, "fused", slow_host, 1, False)
    ops = (slow_host.ops_per_layer * model.layers * 4 / 3 + slow_host.ops_fixed) * 1e-3
    assert terms["ops_s"] == pytest.approx(ops - terms["gemm_s"] - terms["kernels_s"])
    cpu = dataclasses.replace(gpu, ranks_share_compute=True)
    _, terms = measured_compute_time(model, 1, 16, 1, True, "fused", cpu, 1, False)
    assert terms["ops_s"] == pytest.approx(
        gpu.op_overhead_s * (gpu.ops_per_layer * model.layers * 4 / 3 + gpu.ops_fixed)
    )


def test_gpu_check_compare_needs_no_gpu_and_no_out(tmp_path, capsys):
    shutil.copytree(H200 / "runs", tmp_path / "runs")
    assert gpu_check.main(["--compare", str(tmp_path)]) == 0
    rows = pd.read_csv(tmp_path / "compare.csv")
    assert "calibrated_predicted_tflops" not in rows  # no calibrated profile there: the datasheet's only
    assert rows.predicted_tflops.notna().all()
