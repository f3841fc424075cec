"""The GPU path's device-independent logic, on CPU: the device clock (zerobench/clock.py) and what
reads it (StepTimer, calibrate's timings) with a stand-in CUDA stream injected as the clock's
synchronize (the ledger's seconds: tests/unit/test_comms_timing.py); the Adam path a GPU runs (single-tensor) against
torch.optim.Adam; pinned host buffers where the host has them; gpu_check's prediction."""

from __future__ import annotations

import functools
import time

import pytest
import torch
from torch.optim.adam import adam as torch_adam
from torch.utils._python_dispatch import TorchDispatchMode

from zerobench.checks import gpu_check
from zerobench.cli import parser
from zerobench.clock import device_clock
from zerobench.engine.config import ModelConfig, TrainConfig
from zerobench.engine.model import GPT
from zerobench.engine.zero import optimizer
from zerobench.engine.zero.activations import CheckpointStore
from zerobench.microbench import kernel_bench as calibrate_kernels
from zerobench.perfmodel import model_record
from zerobench.perfmodel.kernels import ENGINE_ATTENTION
from zerobench.runtime.devices import StepTimer
from zerobench.trial import configs

CUDA = torch.device("cuda")  # a device object only: nothing here touches a GPU
TRANSFER = 0.05  # seconds of stand-in device work queued


class Stream:
    """A CUDA device's current stream, on the host: `queue(s)` puts s seconds of work on it and
    returns at once, as a kernel launch does; `synchronize(device)`, the clock's seam, waits that
    work out and counts the call."""

    def __init__(self):
        self.pending = 0.0
        self.syncs: list[torch.device] = []

    def queue(self, seconds: float) -> None:
        self.pending += seconds

    def synchronize(self, device: torch.device) -> None:
        self.syncs.append(device)
        time.sleep(self.pending)
        self.pending = 0.0


def test_cpu_clock_is_the_wall_clock_itself():
    stream = Stream()
    for device in ("cpu", torch.device("cpu"), "meta"):
        assert device_clock(device, stream.synchronize) is time.perf_counter
    assert stream.syncs == []


def test_cuda_clock_waits_for_the_queued_work_before_each_read():
    stream = Stream()
    clock = device_clock("cuda:1", stream.synchronize)
    t0 = clock()
    stream.queue(TRANSFER)
    launched = time.perf_counter() - t0
    elapsed = clock() - t0
    assert stream.syncs == [torch.device("cuda:1")] * 2
    assert launched < TRANSFER <= elapsed  # the work, not its launch


def test_step_timer_reads_the_device_clock_once_per_mark():
    stream = Stream()
    timer = StepTimer(CUDA, stream.synchronize)
    timer.mark()
    for _ in range(3):
        stream.queue(TRANSFER)  # a step's kernels, queued
        timer.mark()
    times = timer.times()
    assert len(stream.syncs) == 4 and len(times) == 3
    assert all(t >= TRANSFER for t in times)
    cpu = StepTimer(torch.device("cpu"), stream.synchronize)
    cpu.mark(), cpu.mark()
    assert len(cpu.times()) == 1 and len(stream.syncs) == 4  # nothing added on CPU


def test_calibrate_times_each_call_with_its_work(monkeypatch):
    stream = Stream()
    injected = functools.partial(device_clock, synchronize=stream.synchronize)
    monkeypatch.setattr(calibrate_kernels, "device_clock", injected)
    seconds = calibrate_kernels.timed(lambda: stream.queue(0.01), "cuda", min_s=0.0, reps=3)
    assert len(stream.syncs) == 6  # each timing: the clock read before the call and after it
    assert seconds >= 0.01
    calibrate_kernels.timed(lambda: None, "cpu", min_s=0.0, reps=3)
    assert len(stream.syncs) == 6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_single_tensor_adam_matches_torch_adam(monkeypatch, dtype):
    """ShardedAdam through torch's single-tensor Adam (the engine asks for the fused kernel, on CPU
    and CUDA alike): forced here, it matches torch.optim.Adam bit for bit, fp32 master included."""
    asked = []

    def single_tensor(*args, fused, **kwargs):
        asked.append(fused)
        torch_adam(*args, fused=False, **kwargs)

    monkeypatch.setattr(optimizer, "adam", single_tensor)
    train = TrainConfig(lr=3e-2, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(n, generator=gen) for n in (7, 64, 1000)]
    ours = optimizer.ShardedAdam([p.to(dtype) for p in start], train)
    ref = [torch.nn.Parameter(p.to(dtype).float()) for p in start]
    opt = torch.optim.Adam(ref, lr=train.lr, betas=train.betas, eps=train.eps, weight_decay=train.weight_decay,
                           foreach=False)  # fmt: skip
    for _ in range(3):
        grads = [torch.randn(p.numel(), generator=gen) for p in start]
        ours.step(grads)
        for p, g in zip(ref, grads):
            p.grad = g.clone()
        opt.step()
    assert asked == [True] * 9  # CPU pieces: the engine's own choice is the fused kernel
    for mine, master, theirs in zip(ours.params, ours.master, ref):
        assert torch.equal(master, theirs.detach())
        assert torch.equal(mine, theirs.detach().to(dtype))


def _round_trip(device: torch.device, contiguous: bool) -> torch.Tensor:
    """An offloaded checkpoint (P_a+cpu) saved and loaded back; returns its host copy."""
    x = torch.randn(2, 8, 16, device=device)
    store = CheckpointStore(2, partition=True, offload=True, contiguous=contiguous)
    saved = store.save(x, 1)
    host = saved.data
    back = store.load(saved, device)
    assert back.device == x.device and torch.equal(back, x)
    entries = store.comms.ledger.entries
    assert entries[("copy_to_host", "host")].bytes == entries[("copy_to_device", "host")].bytes == x.numel() * 4
    return host


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned host memory needs a CUDA allocator; none here")
@pytest.mark.parametrize("contiguous", [False, True])
def test_offloaded_checkpoints_sit_in_pinned_host_memory(contiguous):
    host = _round_trip(torch.device("cuda"), contiguous)
    assert host.device.type == "cpu" and host.is_pinned()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host pins (the pinned test runs instead)")
@pytest.mark.parametrize("contiguous", [False, True])
def test_offloaded_checkpoints_on_a_host_that_cannot_pin(contiguous):
    host = _round_trip(torch.device("cpu"), contiguous)
    assert host.device.type == "cpu" and not host.is_pinned()


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_gpu_check_predicts_with_the_attention_the_engine_runs():
    model = GPT(ModelConfig(layers=1, hidden=32, heads=4, seq=8, vocab=64))
    idx = torch.randint(0, 64, (2, 8))
    with _Ops() as ops:
        model(idx, idx).backward()
    fused = any("scaled_dot_product" in name for name in ops.names)
    assert fused == (ENGINE_ATTENTION == "fused")
    assert ("_softmax" in ops.names) == (ENGINE_ATTENTION == "materialized")  # the scores' own pass
    values = gpu_check.trial("gpt-1.5b", 0, 16)
    pred = gpu_check.prediction(values, "h200-141gb")
    assert pred["attention"] == ENGINE_ATTENTION
    other = model_record(*configs({**values, "command": "run"}), "h200-141gb", 1, attention="materialized")
    assert pred["tflops_per_gpu"] > 1.1 * other["tflops_per_gpu"]  # the kernel matters here


def test_gpu_check_runs_the_trial_it_predicts(tmp_path):
    values = gpu_check.trial("dp-6b", 3, 4)
    args = parser().parse_args(["run", *gpu_check.flags(values), "--out", str(tmp_path / "r.json")])
    assert configs(vars(args)) == configs({**values, "command": "run"})
    assert args.device == "cuda"


def test_gpu_check_row_puts_each_prediction_beside_the_measurement():
    values = gpu_check.trial("gpt-1.5b", 3, 4)
    pred = gpu_check.prediction(values, "h200-141gb")
    tflops, peak = pred["tflops_per_gpu"] / 2, pred["peak_allocated_bytes"] * 1.25
    record = {**values, "status": "ok", "hardware": "h200-141gb"}
    record.update(tflops_per_gpu=tflops, peak_allocated_bytes=peak)
    row = gpu_check.compare_row(record, values, {"": "h200-141gb", "calibrated_": None})
    assert row["predicted_tflops"] == pred["tflops_per_gpu"]
    assert row["tflops_error_pct"] == pytest.approx(100.0)  # predicted twice the measured
    assert row["peak_bytes_error_pct"] == pytest.approx(-20.0)  # 1 / 1.25 - 1
    assert not any(k.startswith("calibrated_") for k in row)
    failed = gpu_check.compare_row({**values, "status": "oom", "hardware": "h200-141gb"}, values, {"": "h200-141gb"})
    assert failed["status"] == "oom" and not any("predicted" in k for k in failed)
    no_profile = gpu_check.compare_row({**record, "hardware": None}, values, {"": None})
    assert not any("predicted" in k for k in no_profile)
