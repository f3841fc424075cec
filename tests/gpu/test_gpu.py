"""The GPU path (NCCL, CUDA memory statistics, 16-bit compute). Skipped without CUDA; run by
scripts/gpu_check.sh on a GPU machine."""

import time

import pytest
import torch

from tests.engine_cases import engine_run, reference_run, rel_err, spec_for
from tests.unit.test_bf16_storage import loss_deviation
from zerobench.clock import device_clock
from zerobench.engine.runtime.launch import run_trial
from zerobench.engine.trial import TrialSpec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(autouse=True)
def exact_fp32():
    # TF32 would make fp32 matmuls ~1e-3 relative: parity needs true fp32
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_parity_and_state_bytes_on_one_gpu(stage):
    spec = spec_for("awkward", device="cuda", dp=1, stage=stage)
    r = engine_run(0, spec)
    assert rel_err({k: v.cpu() for k, v in r["params"].items()}, reference_run(spec)["params"]) < 1e-5
    p, g, k = 4, 4, 8
    assert r["state_bytes"] == {
        "param_bytes": p * r["padded"],
        "grad_bytes": g * r["padded"],
        "optimizer_bytes": k * r["padded"],
    }


def test_bf16_compute_tracks_fp32():
    # uniform random tokens: the loss wanders (fp32 on CPU: 9.035 -> 9.113), so bf16 is held to fp32
    # step by step, not asked to fall. bf16 rounds each op's result to 8 significant bits (2^-8 ≈ 4e-3
    # relative); the loss averages over every token, and on an H200 the two agreed to 3 decimals
    # (docs/gpu.md): 5e-3 relative leaves a wide margin, and a quarter of the loss's own largest move
    # between steps still fails a run that is off by a step (about one whole move).
    fp32 = engine_run(0, spec_for("cpu-10m", device="cuda", stage=2, steps=10))["losses"]
    bf16 = engine_run(0, spec_for("cpu-10m", "bf16", device="cuda", stage=2, steps=10))["losses"]
    assert fp32 != bf16  # the compute really is 16-bit
    rel, share = loss_deviation(fp32, bf16)
    assert rel < 5e-3
    assert share < 0.25


def test_measured_record_has_cuda_statistics(tmp_path):
    spec = TrialSpec(
        **{**spec_for("cpu-10m", "bf16", device="cuda", stage=2, steps=3).__dict__, "out": str(tmp_path / "r.json")}
    )
    r = run_trial(spec)
    assert r["status"] == "ok", r["error"]
    assert r["peak_allocated_bytes"] > r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"]
    assert r["peak_reserved_bytes"] >= r["peak_allocated_bytes"]
    assert r["fragmentation_bytes"] == r["peak_reserved_bytes"] - r["peak_allocated_bytes"]
    assert r["tflops_per_gpu"] > 0 and r["step_time_s"] > 0


def test_oversized_batch_is_an_oom_record(tmp_path):
    spec = spec_for("cpu-100m", "bf16", device="cuda", stage=0, steps=1, micro_batch=4096)
    r = run_trial(TrialSpec(**{**spec.__dict__, "out": str(tmp_path / "oom.json")}))
    assert r["status"] == "oom", r
    assert "memory" in r["error"].lower()


def test_device_clock_times_the_work_not_its_launch():
    clock, cycles = device_clock(torch.device("cuda")), 10**8  # a spin of ~50-100 ms at 1-2 GHz
    torch.cuda._sleep(1000)  # the first kernel's set-up, outside the timings
    t0 = clock()
    torch.cuda._sleep(cycles)
    work = clock() - t0
    t0 = time.perf_counter()
    torch.cuda._sleep(cycles)
    launch = time.perf_counter() - t0  # what an unsynchronized read sees
    torch.cuda.synchronize()
    assert work > 0.02 and launch < work / 10, (work, launch)
