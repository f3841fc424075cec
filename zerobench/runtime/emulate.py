"""One rank of any world, emulated (`source: emulated`): rank r of a dp × mp world runs the real
engine with real tensors on one real device, on torch's fake process group, so no other rank
exists. What the record holds, and where each part comes from:
- memory, measured: the tensors this rank allocates, counted by category op by op (LiveCounter,
  runtime/counter.py: the trace's counter on real tensors, so equal to the trace's byte for
  byte), and on CUDA the caching allocator's peak allocated and reserved; on CPU peak RSS;
- compute, measured: each timed step on the device clock with every collective doing nothing
  (runtime/emulated_comms.py fills what a collective would have brought locally);
- collectives, modelled: the step's calls, each with when the engine issued and waited for it,
  left for the performance model to price and place (perfmodel/replay.py), which adds the step
  time. The paper's mechanism (§10.3: partitioning frees memory, a larger micro-batch fits, and
  runs nearer peak) is then measured where it acts, at a paper rank's real shapes.

On CUDA `mem_cap_bytes` caps the caching allocator (its per-process memory fraction), so a
micro-batch that does not fit fails as a real out-of-memory error; on CPU the rank's counted
tensor peak is held against it (an allocation on the host does not fail).
"""

from __future__ import annotations

import dataclasses
import os
import statistics

import torch

from zerobench import memory
from zerobench.engine.config import ConfigError
from zerobench.engine.parallel import topology
from zerobench.engine.zero.buffers import no_reuse
from zerobench.runtime.counter import LiveCounter
from zerobench.runtime.devices import StepTimer, hardware_profile
from zerobench.runtime.emulated_comms import EmulatedComms
from zerobench.runtime.launch import classify, release
from zerobench.runtime.trace import build_counted, counted_step, fake_world, rank_slice
from zerobench.runtime.train import StepLog, cap_error, train_steps
from zerobench.trial import TrialSpec, short_error

# what each part of an emulated record is, as the record states it
PARTS = {"memory": "measured", "compute": "measured", "collectives": "modelled"}
LOSSES = "emulated: every collective filled locally (runtime/emulated_comms.py); not the model's losses"


def check(spec: TrialSpec, rank: int) -> torch.device:
    """The device an emulated rank runs on; refuses a rank outside the world, or CUDA where there
    is none (naming the field). The world itself was checked when the configs were made."""
    world = spec.parallel.world_size
    if not 0 <= rank < world:
        raise ConfigError(f"rank={rank}: must be in [0, {world}) for dp × mp = {spec.parallel.dp} × {spec.parallel.mp}")
    if spec.precision.device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device=cuda: no CUDA device is available here")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def emulate(spec: TrialSpec, rank: int = 0, reserved_bytes: float = 0) -> dict:
    """Rank `rank` of `spec`'s world: `warmup` steps (the first counted; one even at 0), then
    `steps` timed steps. `reserved_bytes`: what the emulated rank's own GPU would hold outside its
    caching allocator (its CUDA context and NCCL's communicators; the caller's estimate), taken off
    the cap on CUDA.
    Returns the record without step time (perfmodel/replay.py prices the collectives); out of
    memory is status `oom`, any other failure `error`."""
    device = check(spec, rank)
    spec = eager_unless_asked(spec)
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # one core, as each rank of `zerobench run` owns one
    try:
        return _emulate(spec, rank, device, reserved_bytes)
    except Exception as exc:  # the record says why, as `zerobench run`'s does
        return spec.record("emulated", status=classify(exc), error=short_error(exc), extra=_extra(rank))
    finally:
        release(device)  # the next attempt of a search starts from nothing
        if device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(1.0, device)


def eager_unless_asked(spec: TrialSpec) -> TrialSpec:
    """`spec` eager where its compile is `auto`: the rank runs under the counting dispatch mode
    (LiveCounter), whose count is the eager program's, as the trace's is; `on` still compiles."""
    if spec.train.compile != "auto":
        return spec
    return dataclasses.replace(spec, train=dataclasses.replace(spec.train, compile="off"))


def _extra(rank: int) -> dict:
    return {"emulated_rank": rank, "emulation": dict(PARTS), "losses_note": LOSSES}


def _cap(spec: TrialSpec, device: torch.device, reserved_bytes: float = 0) -> str | None:
    """On CUDA, the caching allocator capped at the trial's budget less `reserved_bytes` (what the
    emulated rank's card holds outside its allocator); what the record says of it."""
    if spec.mem_cap_bytes is None:
        return None
    if device.type != "cuda":
        return f"tensor peak held against {spec.mem_cap_bytes / 2**20:.0f} MiB (counted: a host allocation never fails)"
    props = torch.cuda.get_device_properties(device)
    allocator = spec.mem_cap_bytes - reserved_bytes
    if allocator <= 0:
        raise ConfigError(
            f"mem_cap_mb={spec.mem_cap_bytes / 2**20:.0f}: no more than the "
            f"{reserved_bytes / 2**20:.0f} MiB a rank holds outside its allocator"
        )
    torch.cuda.set_per_process_memory_fraction(min(1.0, allocator / props.total_memory), device)
    return (
        f"caching allocator capped at {allocator / 2**30:.2f} GiB of this {props.name}'s "
        f"{props.total_memory / 2**30:.1f} GiB (per-process memory fraction): the "
        f"{spec.mem_cap_bytes / 2**30:.1f} GiB budget less {reserved_bytes / 2**30:.2f} GiB outside the "
        f"allocator"
    )


def _emulate(spec: TrialSpec, rank: int, device: torch.device, reserved_bytes: float) -> dict:
    cuda = device.type == "cuda"
    budget = _cap(spec, device, reserved_bytes)
    rss_base = memory.reset_peak_rss()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    with fake_world(spec.parallel.world_size, rank):
        ctx = topology.build(spec.parallel.dp, spec.parallel.mp)
        comms = EmulatedComms(device)
        with LiveCounter(device_type=device.type) as counter, no_reuse():
            engine = build_counted(spec, ctx, comms, counter, device)
            build_peak = torch.cuda.max_memory_allocated(device) if cuda else counter.build_peak
            batch = rank_slice(spec, ctx.dp.rank).to(device)
            counted = counted_step(engine, comms, counter, batch)  # the first step: bytes as the trace counts
        del batch
        # on a host nothing fails to allocate: the counted peak is held against the cap
        if not cuda and (error := cap_error(spec, counted["peak_bytes"], "tensor peak")):
            return spec.record("emulated", status="oom", error=error, extra=_extra(rank))
        log = StepLog(spec, 0, device)
        # the counted step is the first warm-up step (the data a real run's step 0 takes), so the
        # timed steps are a real run's: at N_d 1, its very losses
        warmed = max(1, spec.train.warmup)
        train_steps(engine, spec, ctx, warmed - 1, 1, on_step=log)
        comms.ledger.reset()  # the timed steps' traffic only
        timer, steps = StepTimer(device), []

        def timed(step: int, loss: float) -> None:
            timer.mark()  # on CUDA waits for the step: its events can be read
            steps.append(comms.timeline.read())
            comms.timeline.begin()
            log(step, loss)

        timer.mark()
        comms.timeline.begin()
        losses = train_steps(engine, spec, ctx, spec.train.steps, warmed, on_step=timed)
        times = timer.times()
    peak_rss = memory.peak_rss_bytes()
    n = spec.train.steps
    comm = {
        k: {**v, "seconds": None, "per_step_volume_elements": v["volume_elements"] / n}
        for k, v in comms.ledger.as_dict().items()
    }
    return spec.record(
        "emulated",
        hardware=hardware_profile(device),
        **{f"{k}_bytes": counted["bytes"][k] for k in ("param", "grad", "optimizer")},
        activation_bytes=counted["activation_bytes"],
        peak_allocated_bytes=torch.cuda.max_memory_allocated(device) if cuda else None,
        peak_reserved_bytes=torch.cuda.max_memory_reserved(device) if cuda else None,
        peak_rss_bytes=peak_rss,
        build_peak_bytes=build_peak,
        comm=comm,
        losses=losses,
        first_loss=losses[0],
        last_loss=losses[-1],
        extra={
            **_extra(rank),
            "memory_budget": budget,
            "compute_s": statistics.median(times),  # the step with collectives doing nothing
            "compute_times_s": times,
            "flops_per_gpu_per_step": spec.tflops_per_gpu(1.0) * 1e12,  # the paper's convention (flops.py)
            "step_calls": steps,  # per timed step: each call, issued and waited for (s from the step's start)
            "tensor_peak_bytes": counted["peak_bytes"],  # the counter's, as the trace's peak_allocated_bytes
            "tensor_build_peak_bytes": counted["build_peak"],
            "peak_breakdown": counted["peak_breakdown"],
            "host_peak_bytes": counted["host_peak_bytes"],
            "high_water_bytes": counted["high"],
            "temporary_bytes": counted["high"]["temporary"],
            "rss_growth_bytes": peak_rss - rss_base,
            "memory_counter": LiveCounter.__name__,
            "compiled": spec.train.compiles(device.type),
            "skipped_steps": engine.scaler.skipped,  # fp16: steps the loss scaler skipped for an overflow
        },
    )
