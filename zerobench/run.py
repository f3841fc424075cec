"""One measured trial: build the model and engine on every rank, warm up, time steps, and write
one record (`source: measured`). Started bare it launches its own ranks with torch's elastic
launcher (what torchrun runs); started under torchrun or srun it joins the world it is in."""

from __future__ import annotations

import json
import os
import statistics
import sys
import traceback
import uuid
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from zerobench import checkpoint, faults, flops, memory, results, slurm_env
from zerobench.comms import Comms
from zerobench.config import ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.data import micro_batches, token_source
from zerobench.devices import StepTimer, hardware_profile, mfu, peak_memory
from zerobench.model import GPT
from zerobench.parallel import topology
from zerobench.parallel.tensor_parallel import TensorParallel
from zerobench.zero import apply_zero
from zerobench.zero.activations import CheckpointStore


@dataclass(frozen=True)
class TrialSpec:
    model: ModelConfig
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    out: str | None = None
    timeout_s: float = 1800.0  # a collective that waits longer than this fails the trial
    data: str = "synthetic"  # token source: "synthetic" or a text corpus (zerobench.data.token_source)
    mem_cap_bytes: int | None = None  # per-rank memory budget; a trial that would exceed it is status oom
    resume: str | None = None  # a checkpoint to load first; steps continue from its data position
    save: str | None = None  # where to write a checkpoint after the timed steps (zerobench.checkpoint)

    def __post_init__(self):
        self.parallel.check_model(self.model)

    @property
    def global_batch(self) -> int:
        return self.train.micro_batch * self.train.grad_accum * self.parallel.dp

    def base_record(self, source: str, **fields) -> dict:
        p = self.parallel
        extra = {"data": self.data, "mem_cap_bytes": self.mem_cap_bytes, **(fields.pop("extra", None) or {})}
        return results.new_record(
            source,
            **results.model_fields(self.model),
            dp=p.dp,
            mp=p.mp,
            world_size=p.world_size,
            stage=p.stage,
            checkpoint_activations=p.checkpoint_activations,
            partition_activations=p.partition_activations,
            offload_activations=p.offload_activations,
            contiguous_buffers=p.contiguous_buffers,
            bucket_bytes=p.bucket_bytes,
            precision=self.precision.mode,
            device=self.precision.device,
            micro_batch=self.train.micro_batch,
            grad_accum=self.train.grad_accum,
            global_batch=self.global_batch,
            steps=self.train.steps,
            **fields,
            extra=extra,
        )


def build_engine(spec: TrialSpec, ctx: topology.ParallelContext, comms: Comms, device: torch.device):
    """The model and its engine for this rank (every stage, every precision)."""
    par = spec.parallel
    tp = TensorParallel(ctx.mp, comms) if ctx.mp.size > 1 else None  # mp = 1: the single-process model
    store = CheckpointStore.for_config(par, spec.model.layers, ctx.mp, comms) if par.checkpoint_activations else None
    with torch.device(device):  # allocate on the device directly: no host copy of a large model
        model = GPT(spec.model, checkpoint_activations=par.checkpoint_activations, tp=tp, checkpoints=store)
    model.init_weights(spec.train.seed)
    model.set_dtypes(spec.precision.storage_dtype, spec.precision.compute_dtype)
    return apply_zero(model, ctx, spec.parallel, spec.precision, spec.train, comms)


def train_steps(engine, spec: TrialSpec, ctx, steps: int, first_step: int = 0, on_step=None) -> list[float]:
    """Run `steps` optimizer steps; returns this rank's mean micro-batch loss of each step."""
    data = token_source(spec.data, spec.model.vocab, spec.model.seq, spec.train.seed)
    losses = []
    for step in range(first_step, first_step + steps):
        faults.at_step(step, ctx.rank)  # watchdog progress; the injected fault, if any
        tokens = data.global_batch(step, spec.global_batch).to(engine.device)
        total = 0.0
        mbs = list(micro_batches(tokens, spec.train.grad_accum, ctx.dp.size, ctx.dp.rank))
        for i, (x, y) in enumerate(mbs):
            loss = engine.model(x, y)
            engine.backward(loss, last_micro_batch=i == len(mbs) - 1)
            total += loss.item()
        engine.step()
        losses.append(total / len(mbs))
        if on_step:
            on_step(step)
    return losses


def _check_cap(spec: TrialSpec, used: float, what: str) -> str | None:
    """The oom message when `used` bytes per rank exceed the trial's memory cap, else None."""
    if spec.mem_cap_bytes is None or used <= spec.mem_cap_bytes:
        return None
    return f"{what} {used / 2**20:.1f} MiB per rank exceed the cap of {spec.mem_cap_bytes / 2**20:.1f} MiB"


def _measure(spec: TrialSpec, ctx, device) -> dict:
    rss_base = memory.reset_peak_rss()
    comms = Comms()
    engine = build_engine(spec, ctx, comms, device)
    if spec.mem_cap_bytes is not None:  # model states alone over the cap: stop before training (every rank)
        states = torch.tensor([float(sum(engine.model_state_bytes().values()))], dtype=torch.float64, device=device)
        Comms().all_reduce(states, ctx.world, op=dist.ReduceOp.MAX)
        if message := _check_cap(spec, float(states), "model states"):
            raise MemoryError(message)
    first = checkpoint.load(engine, spec.resume)["data_position"] if spec.resume else 0
    train_steps(engine, spec, ctx, spec.train.warmup, first)
    comms.ledger.reset()  # count the timed steps only
    timer = StepTimer(device)
    timer.mark()
    first += spec.train.warmup
    losses = train_steps(engine, spec, ctx, spec.train.steps, first, on_step=lambda _: timer.mark())
    times = timer.times()
    if spec.save:
        end = first + spec.train.steps
        checkpoint.save(engine, end, end, spec.save, config=spec_to_dict(spec))
    # Mean loss over DP ranks and the worst peak memory over all ranks, on a ledger of their own
    # so the engine's traffic stays clean.
    metrics = Comms()
    loss_t = torch.tensor(losses, dtype=torch.float64, device=device)
    metrics.all_reduce(loss_t, ctx.dp)
    loss_t /= ctx.dp.size
    peak = peak_memory(device)
    peaks = torch.tensor([*peak, peak[0] - rss_base], dtype=torch.float64, device=device)
    metrics.all_reduce(peaks, ctx.world, op=dist.ReduceOp.MAX)
    step_time = statistics.median(times)
    steps = spec.train.steps
    comm = {k: {**v, "per_step_volume_elements": v["volume_elements"] / steps}
            for k, v in comms.ledger.as_dict().items()}  # fmt: skip
    achieved = flops.step_flops(spec.model, spec.global_batch, spec.parallel.checkpoint_activations) / step_time
    tflops = achieved / spec.parallel.world_size / 1e12
    profile = hardware_profile(device)
    cuda = device.type == "cuda"
    store = getattr(engine.model, "checkpoints", None)  # activation checkpoints (ZeRO-R P_a, P_a+cpu)
    # what the cap is checked against: memory the trial added on CPU, peak allocated on GPU
    over = _check_cap(spec, float(peaks[1] if cuda else peaks[3]), "peak allocated" if cuda else "peak RSS growth")
    return spec.base_record(
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
        comm=comm,
        losses=[float(v) for v in loss_t],
        first_loss=float(loss_t[0]),
        last_loss=float(loss_t[-1]),
        extra={
            "rss_growth_bytes": int(peaks[3]),
            **({"checkpoint_host_bytes": store.peak_host_bytes} if store else {}),
            **({"fragmentation_bytes": int(peaks[2] - peaks[1])} if cuda else {}),
        },
    )


def classify(exc: BaseException) -> str:
    """The record status for an exception: running out of memory is a result, not a crash."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, MemoryError) or "OutOfMemoryError" in text or "out of memory" in text.lower():
        return "oom"
    if isinstance(exc, TimeoutError) or "timed out" in text.lower() or "timeout" in type(exc).__name__.lower():
        return "timeout"
    return "error"


def worker(spec_dict: dict) -> str:
    """Entry point of every rank (under our launcher, torchrun or srun); returns this rank's status.
    With several ranks a watchdog ends a rank that makes no progress for `timeout_s` (faults.py)."""
    spec = spec_from_dict(spec_dict)
    world = spec.parallel.world_size
    cuda = spec.precision.device == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=spec.timeout_s))
    rank = dist.get_rank() if dist.is_initialized() else 0

    def expired(step: int) -> None:
        error = f"no progress for {spec.timeout_s:g} s at step {step}: a rank died or hung, or a collective stalled"
        if spec.out:
            results.write_record(spec.base_record("measured", status="timeout", error=error), spec.out)

    try:
        with faults.watchdog(spec.timeout_s, rank, expired) if world > 1 else nullcontext():
            ctx = topology.build(spec.parallel.dp, spec.parallel.mp)
            try:
                record = _measure(spec, ctx, device)
            except Exception as exc:  # every rank reports; rank 0 writes
                record = spec.base_record("measured", status=classify(exc), error=_short(exc))
                if record["status"] == "error":
                    traceback.print_exc()
            if ctx.rank == 0 and spec.out:
                results.write_record(record, spec.out)
            if record["status"] == "ok" and world > 1:
                topology.leave_together()  # inside the watchdog: a peer that never arrives is bounded
        return record["status"]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:500]


def spec_to_dict(spec: TrialSpec) -> dict:
    return asdict(spec)


def spec_from_dict(d: dict) -> TrialSpec:
    train = dict(d["train"], betas=tuple(d["train"]["betas"]))
    return TrialSpec(
        model=ModelConfig(**d["model"]),
        parallel=ParallelConfig(**d["parallel"]),
        precision=PrecisionConfig(**d["precision"]),
        train=TrainConfig(**train),
        out=d["out"],
        timeout_s=d["timeout_s"],
        data=d.get("data", "synthetic"),
        mem_cap_bytes=d.get("mem_cap_bytes"),
        resume=d.get("resume"),
        save=d.get("save"),
    )


def under_launcher() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run_trial(spec: TrialSpec) -> dict:
    """Run one trial and return its record, which is also written to `spec.out` (if set)."""
    out = spec.out or str(Path(os.environ.get("TMPDIR", "/tmp")) / f"zerobench-{uuid.uuid4().hex}.json")
    spec = TrialSpec(**{**spec.__dict__, "out": out})
    slurm_env.join(spec.parallel.world_size)  # a task of `srun -n W`: RANK, WORLD_SIZE... from SLURM's
    if under_launcher():
        worker(spec_to_dict(spec))
        return results.read_record(out) if int(os.environ["RANK"]) == 0 else {}
    Path(out).unlink(missing_ok=True)
    if spec.parallel.world_size == 1:
        worker(spec_to_dict(spec))
    else:
        _launch(spec)
    if not Path(out).exists():  # a rank died before rank 0 could write
        results.write_record(
            spec.base_record("measured", status="error", error="a rank exited without a record; see the log"), out
        )
    return results.read_record(out)


def _launch(spec: TrialSpec) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=spec.parallel.world_size,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # a free port, as torchrun --standalone
        max_restarts=0,
        monitor_interval=0.1,
    )
    spec_file = Path(spec.out).with_suffix(".spec.json")
    spec_file.write_text(json.dumps(spec_to_dict(spec)))
    try:  # each rank runs `python -m zerobench.run SPEC`, as torchrun would start it
        elastic_launch(config, sys.executable)("-m", "zerobench.run", str(spec_file))
    except ChildFailedError as exc:
        # Exit status 1 is a rank that reported its own failure (__main__ below); any other status
        # is a rank that died, which its peers only see as a closed connection.
        failures = exc.failures.values()
        died = [f"rank {f.local_rank} exited with status {f.exitcode}" for f in failures if f.exitcode != 1]
        if Path(spec.out).exists():  # rank 0 wrote why before the launcher stopped the ranks
            record = results.read_record(spec.out)
            if died and record.get("status") == "error":
                record["error"] = f"{'; '.join(died)} — {record['error']}"
                results.write_record(record, spec.out)
            return
        first = next(iter(exc.failures.values()))
        watchdog = any(f.exitcode == faults.WATCHDOG_EXIT for f in exc.failures.values())
        results.write_record(
            spec.base_record(
                "measured",
                status="timeout" if watchdog else "error",
                error=f"rank {first.local_rank} exited with status {first.exitcode} before a record was written",
            ),
            spec.out,
        )
    finally:
        spec_file.unlink(missing_ok=True)


if __name__ == "__main__":
    # a failed rank exits non-zero, so the launcher stops the others instead of waiting on them
    sys.exit(0 if worker(json.loads(Path(sys.argv[1]).read_text())) == "ok" else 1)
