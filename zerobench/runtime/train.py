"""The measured trial (`source: measured`): build the engine, warm up, time steps, and make the
record. The rank worker and the launcher are in zerobench/runtime/launch.py; what trains is the
engine's own: the plain GPT (zerobench/engine/model.py) built on the meta device and composed by
`parallelize` (zerobench/engine/parallelize.py: MP, compile, ZeRO-R, ZeRO-DP), one optimizer step
at a time by `train_step` (zerobench/engine/step.py) over this rank's own slice of the step's
sequences (zerobench/runtime/batches.py)."""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist

from zerobench import memory
from zerobench.engine.config import TrainConfig
from zerobench.engine.model import GPT
from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms
from zerobench.engine.parallelize import parallelize
from zerobench.engine.step import train_step
from zerobench.engine.zero.activations import checkpoint_store
from zerobench.engine.zero.core import ZeroEngine
from zerobench.gpus import mfu
from zerobench.runtime import allocator, faults, probe, snapshot
from zerobench.runtime.batches import TokenSource, sequences, token_source
from zerobench.runtime.devices import StepTimer, hardware_profile, peak_memory
from zerobench.trial import TrialSpec


def build_engine(spec: TrialSpec, ctx: topology.ParallelContext, comms: Comms, device: torch.device) -> ZeroEngine:
    """The trial's engine on this rank: its plain model on the meta device (shapes only, nothing
    allocated), composed by the engine's `parallelize`, which allocates only what the stage keeps."""
    with torch.device("meta"):
        model = GPT(spec.model)
    return parallelize(model, ctx, spec.parallel, spec.precision, spec.train, comms, device)


def rank_batch(data: TokenSource, step: int, train: TrainConfig, dp_rank: int) -> torch.Tensor:
    """DP rank `dp_rank`'s own slice of step `step`, as the engine's `train_step` takes it:
    `train.grad_accum` micro-batches of `train.micro_batch` sequences, (grad_accum, micro_batch,
    s + 1) token ids. Rank r holds sequences r·G·b ... (r + 1)·G·b − 1 (G = grad_accum, b =
    micro_batch), so every layout trains on sequences 0 ... N_d·G·b − 1 of the step, as one process
    over them does (checks/reference.py)."""
    first = dp_rank * train.grad_accum * train.micro_batch  # the sequences of the ranks before it
    return sequences(data, step, first, (train.grad_accum, train.micro_batch))


def train_steps(engine: ZeroEngine, spec: TrialSpec, ctx, steps: int, first_step: int = 0, on_step=None) -> list[float]:
    """Run `steps` optimizer steps from step `first_step`, each on this rank's own slice moved to
    the engine's device; returns this rank's mean micro-batch loss of each step. `on_step(step,
    loss)` is called after each."""
    data = token_source(spec.data, spec.model.vocab, spec.model.seq, spec.train.seed)
    losses = []
    for step in range(first_step, first_step + steps):
        faults.at_step(step, ctx.rank)  # watchdog progress; the injected fault, if any
        losses.append(train_step(engine, rank_batch(data, step, spec.train, ctx.dp.rank).to(engine.device)))
        if on_step:
            on_step(step, losses[-1])
    return losses


class StepLog:
    """One line per step on stderr (rank 0 only): step, loss, seconds per step, tokens per second
    (over all ranks) and memory (peak allocated on GPU, peak RSS on CPU), so a long trial shows
    its progress. The seconds are wall time between the lines."""

    def __init__(self, spec: TrialSpec, rank: int, device: torch.device):
        self.tokens = spec.global_batch * spec.model.seq  # per step, all DP ranks
        self.on, self.device = rank == 0, device
        self.last = time.perf_counter()

    def __call__(self, step: int, loss: float) -> None:
        if not self.on:
            return
        if self.device.type == "cuda":  # no synchronize: the step's loss.item() already waited
            mem = f"peak allocated {torch.cuda.max_memory_allocated(self.device) / 2**20:.0f} MiB"
        else:
            mem = f"peak RSS {memory.peak_rss_bytes() / 2**20:.0f} MiB"
        now = time.perf_counter()
        seconds, self.last = now - self.last, now
        print(
            f"step {step} loss {loss:.4f} {seconds:.3f} s/step {self.tokens / seconds:.0f} tokens/s {mem}",
            file=sys.stderr,
            flush=True,
        )


def cap_error(spec: TrialSpec, used: float, what: str) -> str | None:
    """The oom message when `used` bytes per rank exceed the trial's memory cap, else None."""
    if spec.mem_cap_bytes is None or used <= spec.mem_cap_bytes:
        return None
    return f"{what}: {used / 2**20:.1f} MiB per rank, over the cap of {spec.mem_cap_bytes / 2**20:.1f} MiB"


def measure(spec: TrialSpec, ctx, device) -> dict:
    """Every rank: build, warm up, time `spec.train.steps` steps; returns the record (the same on
    every rank: losses and peaks are reduced over the ranks)."""
    # The host's speed before and after (runtime/probe.py), outside the window memory is measured
    # in: rank 0 reads it while the others wait at a collective, so nothing shares the host with it.
    before = probe.read(str(device)) if ctx.rank == 0 else [0.0] * 4
    Comms().all_reduce(torch.zeros(1, device=device), ctx.world)
    rss_base = memory.reset_peak_rss()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    comms = Comms()
    engine = build_engine(spec, ctx, comms, device)
    # the construction's peak: what the build added to RSS on CPU, the most allocated on GPU
    built = peak_memory(device)
    build_peak = built[1] if device.type == "cuda" else built[0] - rss_base
    if spec.mem_cap_bytes is not None:  # model states alone over the cap: stop before training (every rank)
        states = torch.tensor([float(sum(engine.model_state_bytes().values()))], dtype=torch.float64, device=device)
        Comms().all_reduce(states, ctx.world, op=dist.ReduceOp.MAX)
        if message := cap_error(spec, float(states), "model states"):
            raise MemoryError(message)
    log = StepLog(spec, ctx.rank, device)
    first = snapshot.load(engine, spec.resume)["data_position"] if spec.resume else 0
    train_steps(engine, spec, ctx, spec.train.warmup, first, on_step=log)
    comms.ledger.reset()  # count the timed steps only
    timer = StepTimer(device)
    timer.mark()

    def timed(step: int, loss: float) -> None:
        timer.mark()
        log(step, loss)

    first += spec.train.warmup
    losses = train_steps(engine, spec, ctx, spec.train.steps, first, on_step=timed)
    times = timer.times()
    if spec.save:
        end = first + spec.train.steps
        snapshot.save(engine, end, end, spec.save, config=spec.to_dict())
    # Mean loss over DP ranks and the worst peak memory over all ranks, on a ledger of their own
    # so the engine's traffic stays clean.
    metrics = Comms()
    loss_t = torch.tensor(losses, dtype=torch.float64, device=device)
    metrics.all_reduce(loss_t, ctx.dp)
    loss_t /= ctx.dp.size
    peak = peak_memory(device)
    after = probe.read(str(device)) if ctx.rank == 0 else [0.0] * 4
    # rank 0's probe readings ride along (0 elsewhere): the record is the same on every rank
    peaks = torch.tensor([*peak, peak[0] - rss_base, build_peak, *before, *after], dtype=torch.float64, device=device)
    metrics.all_reduce(peaks, ctx.world, op=dist.ReduceOp.MAX)
    host_probe = [[int(n), int(size), gemm, copy] for n, size, gemm, copy in peaks[5:].view(2, 4).tolist()]
    step_time = statistics.median(times)
    steps = spec.train.steps
    comm = {
        k: {**v, "per_step_volume_elements": v["volume_elements"] / steps} for k, v in comms.ledger.as_dict().items()
    }
    tflops = spec.tflops_per_gpu(step_time)
    profile = hardware_profile(device)
    cuda = device.type == "cuda"
    store = checkpoint_store(engine.model)  # activation checkpoints (ZeRO-R P_a, P_a+cpu)
    # what the cap is checked against: memory the trial added on CPU, peak allocated on GPU
    over = cap_error(spec, float(peaks[1] if cuda else peaks[3]), "peak allocated" if cuda else "peak RSS growth")
    return spec.record(
        "measured",
        status="oom" if over else "ok",
        error=over,
        hardware=profile,
        **engine.model_state_bytes(),
        activation_bytes=store.peak_device_bytes if store else None,  # peak checkpoint bytes on the device
        step_time_s=step_time,
        step_time_min_s=min(times),
        step_time_max_s=max(times),
        samples_per_s=spec.global_batch / step_time,
        tokens_per_s=spec.global_batch * spec.model.seq / step_time,
        tflops_per_gpu=tflops,
        mfu=mfu(tflops, profile),
        peak_rss_bytes=int(peaks[0]),
        peak_allocated_bytes=int(peaks[1]) if cuda else None,
        peak_reserved_bytes=int(peaks[2]) if cuda else None,
        build_peak_bytes=int(peaks[4]),
        comm=comm,
        losses=[float(v) for v in loss_t],
        first_loss=float(loss_t[0]),
        last_loss=float(loss_t[-1]),
        extra={
            "compiled": spec.train.compiles(device.type),  # the blocks ran torch.compile'd (`compile`)
            "rss_growth_bytes": int(peaks[3]),
            "allocator": allocator.in_use(),
            "host_probe": host_probe,  # readings before the build, after the timed steps (runtime/probe.py)
            **({"checkpoint_host_bytes": store.peak_host_bytes} if store else {}),
            **({"fragmentation_bytes": int(peaks[2] - peaks[1])} if cuda else {}),
        },
    )
