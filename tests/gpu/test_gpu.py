"""The GPU path (NCCL, CUDA memory statistics, 16-bit compute, fp16's loss scaler, the ledger's
timing events). Skipped without CUDA; run by scripts/gpu_check.sh on a GPU machine."""

import dataclasses
import time

import pytest
import torch

from tests.engine_cases import engine_run, reference_run, rel_err, spec_for
from tests.unit.test_bf16_storage import loss_deviation
from zerobench.checks.card import PEAK_RTOL, PEAK_SLACK_BYTES
from zerobench.clock import EventMarks, device_clock
from zerobench.engine.config import PrecisionConfig
from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms, Ledger
from zerobench.engine.step import shifted
from zerobench.runtime.launch import run_trial
from zerobench.runtime.trace import rank_slice, trace_record
from zerobench.runtime.train import build_engine, train_steps
from zerobench.trial import TrialSpec

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


def test_measured_record_has_cuda_statistics_and_the_trace_bounds_its_peak(tmp_path):
    """The peak allocated is at most the trace of the same trial (runtime/trace.py: model
    states, the buckets in flight, activations and the step's temporaries, counted exactly) plus
    the allocator's slack (checks/node_check.py); and the trace is no loose bound: half the peak."""
    spec = spec_for("cpu-100m", "bf16", device="cuda", stage=2, steps=3, micro_batch=4)
    spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, compile="off"))  # eager, as traced
    traced = trace_record(spec)
    assert traced["status"] == "ok", traced["error"]
    r = run_trial(TrialSpec(**{**spec.__dict__, "out": str(tmp_path / "r.json")}))
    assert r["status"] == "ok", r["error"]
    states = r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"]
    assert states == traced["param_bytes"] + traced["grad_bytes"] + traced["optimizer_bytes"]
    bound = traced["peak_allocated_bytes"]
    assert states < r["peak_allocated_bytes"] <= bound * (1 + PEAK_RTOL) + PEAK_SLACK_BYTES
    assert r["peak_allocated_bytes"] > bound / 2
    assert r["peak_reserved_bytes"] >= r["peak_allocated_bytes"]
    assert r["fragmentation_bytes"] == r["peak_reserved_bytes"] - r["peak_allocated_bytes"]
    assert r["tflops_per_gpu"] > 0 and r["step_time_s"] > 0


def test_fp16_trains_and_an_overflow_skips_the_step():
    """fp16 with the dynamic loss scaler tracks fp32 over clean steps (no step skipped: the scale
    stays); a loss scaled up 10^6 overflows the fp16 gradients: the step is skipped, the scale
    halves, the parameters, Adam's moments and step count stay; the next step is clean."""
    base = spec_for("cpu-10m", device="cuda", stage=2, steps=4)
    fp16 = dataclasses.replace(base, precision=PrecisionConfig(mode="fp16", device="cuda", initial_loss_scale=1024.0))
    device, ctx = torch.device("cuda"), topology.single_process()
    engine = build_engine(fp16, ctx, Comms(), device)
    losses = train_steps(engine, fp16, ctx, fp16.train.steps)
    assert engine.scaler.scale == 1024.0  # no overflow: every step was taken
    rel, share = loss_deviation(engine_run(0, base)["losses"], losses)
    assert rel < 5e-3 and share < 0.25  # fp16 keeps 11 significant bits, more than bf16's 8
    opt = engine.optimizer
    states = lambda: [t.clone() for t in (opt.master_flat, opt.exp_avg_flat, opt.exp_avg_sq_flat)]  # noqa: E731
    before = (engine.full_parameters(), states(), float(opt.steps[0]))
    x, y = shifted(rank_slice(fp16, 0, step=99)[0].to(device))
    engine.backward(engine.model(x, y) * 1e6)
    assert engine.step() is False
    after = (engine.full_parameters(), states(), float(opt.steps[0]))
    assert engine.scaler.scale == 512.0
    assert after[2] == before[2] == fp16.train.steps
    assert all(torch.equal(before[0][k], after[0][k]) for k in before[0])
    assert all(torch.equal(a, b) for a, b in zip(before[1], after[1]))
    engine.backward(engine.model(x, y))
    assert engine.step() is True


def test_ledger_events_time_the_work_not_its_launch():
    """The ledger's CUDA marks: the host runs ahead of a queued spin (its seconds still pending),
    and once read they are the spin's, not its launch; a host copy through Comms is timed by them."""
    marks, ledger, cycles = EventMarks(), Ledger(), 10**8  # a spin of ~50-100 ms at 1-2 GHz
    cuda = torch.device("cuda", torch.cuda.current_device())
    torch.cuda._sleep(1000)  # the first kernel's set-up, outside the timings
    t0 = time.perf_counter()
    start = marks.mark(cuda)
    torch.cuda._sleep(cycles)
    ledger.charge(ledger.record("all_reduce", "dp", 1, 4, 2), marks, start, marks.mark(cuda))
    launch = time.perf_counter() - t0
    assert len(ledger._pending) == 1  # the spin is still running: nothing read, nothing waited
    work = ledger.entries[("all_reduce", "dp")].seconds
    assert work > 0.02 and launch < work / 10, (work, launch)
    comms = Comms()
    assert isinstance(comms._watch(torch.empty(1, device=cuda)).marks, EventMarks)
    comms.copy(torch.empty(2**20, device=cuda), torch.ones(2**20), "copy_to_device")
    entry = comms.ledger.entries[("copy_to_device", "host")]
    assert entry.seconds > 0 and entry.bytes == 4 * 2**20 and not comms.ledger._pending


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
