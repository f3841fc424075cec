"""One training step of the engine, traced (`source: traced`): the same `build_engine` and engine
classes `zerobench run` uses, run under PyTorch's FakeTensorMode on a fake process group of any
world size, so nothing is allocated and nothing is computed — a 100B-parameter model at N_d = 400
traces on a laptop. What comes out is exact for *this engine*: model-state bytes per rank (paper
§5, Table 1), activation and temporary bytes, the peak, and the collective bytes of the ledger
(§7), per op and group.

Memory is counted by `StorageCounter` (runtime/counter.py), a FakeTensorMode of our own that
counts live storage bytes by category. The record names the counter (`memory_counter`).
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from functools import partial

import torch
import torch.distributed as dist

from zerobench import memory
from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms
from zerobench.engine.step import Watch, train_step
from zerobench.engine.zero.activations import checkpoint_store
from zerobench.runtime.batches import token_source
from zerobench.runtime.counter import HOST, StorageCounter
from zerobench.runtime.train import build_engine, rank_batch
from zerobench.trial import TrialSpec, short_error

COUNTER = "StorageCounter"  # the engine's own dispatch-mode counter of live storage bytes, by category


@contextmanager
def fake_world(world_size: int, rank: int = 0):
    """This process as rank `rank` of a fake process group of `world_size` ranks (torch's fake
    backend: collectives do nothing; shapes and counts only)."""
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized; trace or emulate in a process of its own")
    # No store: torch then makes the fake backend's own (and registers the backend) itself.
    dist.init_process_group("fake", rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _state_tensors(engine) -> dict[str, list[torch.Tensor]]:
    """The engine's model states by category: the parameter pieces its optimizer updates (their
    storage is the whole flat buffer at stages 0–2, the shard at stage 3), its gradient pieces and
    the optimizer's flats (the fp32 master is the parameters themselves in fp32 training)."""
    opt = engine.optimizer
    return {
        "param": list(opt.params),
        "grad": list(engine.grad_pieces),
        "optimizer": [*opt.exp_avg, *opt.exp_avg_sq, *(opt.master if opt.mixed else [])],
    }


def build_counted(spec: TrialSpec, ctx, comms: Comms, counter, device: torch.device):
    """`build_engine` under `counter` (a counter of runtime/counter.py, entered by the caller): the
    engine's model states filed by category and the construction's peak noted (`build_peak`)."""
    engine = build_engine(spec, ctx, comms, device)
    if (store := checkpoint_store(engine.model)) is not None:  # P_a+cpu's checkpoints: the host's
        store.host_booking = partial(counter.booking, HOST)
    counter.build_peak = counter.peak  # the construction's own peak, before any step resets it
    for category, tensors in _state_tensors(engine).items():
        counter.tag(tensors, category)
    counter.retag = engine.transient_states
    return engine


class _Phases(Watch):
    """The step's moments for `counter`: what forward makes is an activation, what backward and
    the optimizer make a temporary; the most activation bytes forward left (`activation`). Fake
    tensors hold no values: no loss is read."""

    def __init__(self, counter):
        self.counter, self.activation = counter, 0

    def forward(self) -> None:
        self.counter.phase = "activation"

    def backward(self) -> None:
        self.activation = max(self.activation, self.counter.bytes["activation"])  # what forward keeps for backward
        self.counter.phase = "temporary"

    def loss(self, loss: torch.Tensor) -> float:
        return 0.0


def counted_step(engine, comms: Comms, counter, batch: torch.Tensor) -> dict:
    """One step of the engine (`train_step` over this rank's slice `batch`) under `counter`,
    entered by the caller: the step's bytes by category, its peak and the ledger of its collectives."""
    counter.tag([batch], "other")  # the token ids: data, not activations
    comms.ledger.reset()  # the step's traffic only, as `zerobench run` counts timed steps
    counter.reset_peak()
    counter.reset_high()
    phases = _Phases(counter)
    train_step(engine, batch, phases)
    counter.phase = "other"
    return {
        "bytes": dict(counter.bytes),
        "activation_bytes": phases.activation,
        "peak_bytes": counter.peak,
        "peak_breakdown": counter.peak_bytes,
        "host_peak_bytes": counter.host_peak,
        "high": dict(counter.high),
        "engine_state_bytes": engine.model_state_bytes(),
        "build_peak": counter.build_peak,
        "ledger": comms.ledger.as_dict(),
    }


def rank_slice(spec: TrialSpec, dp_rank: int, step: int = 0) -> torch.Tensor:
    """DP rank `dp_rank`'s token ids at `step` ((grad_accum, micro_batch, s + 1) integers), drawn
    as `zerobench run` draws them."""
    data = token_source(spec.data, spec.model.vocab, spec.model.seq, spec.train.seed)
    return rank_batch(data, step, spec.train, dp_rank)


@contextmanager
def traced_engine(spec: TrialSpec):
    """`build_engine(spec)` as rank 0 of a fake world, under fake tensors and a StorageCounter
    that has filed the engine's model states and noted the construction's peak (`build_peak`);
    yields (engine, ctx, comms, counter)."""
    counter = StorageCounter()
    # the eager program: fake tensors build no kernels (a trace on cpu compiles nothing anyway)
    spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, compile="off"))
    with fake_world(spec.parallel.world_size):
        ctx = topology.build(spec.parallel.dp, spec.parallel.mp)
        comms = Comms()
        with counter:
            yield build_counted(spec, ctx, comms, counter, torch.device("cpu")), ctx, comms, counter


def trace_states(spec: TrialSpec) -> dict[str, int]:
    """The model-state bytes of this rank as the engine allocates them when it is built (param,
    grad, optimizer; a step changes none of them: tests/unit/test_trace.py pins it)."""
    return {k: v for k, v in _built(spec).items() if k != "build_peak"}


def _built(spec: TrialSpec) -> dict[str, int]:
    """The model states of this rank once the engine is built, and the construction's peak."""
    with traced_engine(spec) as (*_, counter):
        return {**{k: counter.bytes[k] for k in ("param", "grad", "optimizer")}, "build_peak": counter.build_peak}


def trace_step(spec: TrialSpec) -> dict:
    """Build the engine and run one step (every micro-batch, then the optimizer) under fake
    tensors; return the counts the record is made of."""
    t0 = time.perf_counter()
    real = rank_slice(spec, 0)  # world rank 0 is DP rank 0
    with traced_engine(spec) as (engine, ctx, comms, counter):
        batch = counter.from_tensor(real)
        built = time.perf_counter()
        out = counted_step(engine, comms, counter, batch)
        return {**out, "build_s": built - t0, "step_s": time.perf_counter() - built}


def device_semantics(spec: TrialSpec) -> str:
    """What the trace's device means for its bytes (a record says it: the activations double where
    16-bit storage computes in fp32)."""
    compute = str(spec.precision.compute_dtype).removeprefix("torch.")
    if spec.precision.device == "cuda":
        return f"cuda: a GPU's, computing in the storage dtype ({compute})"
    return f"cpu: a CPU host's, computing in {compute} whatever the storage ({spec.precision.mode})"


def trace_record(spec: TrialSpec, states_only: bool = False) -> dict:
    """One `traced` record of `spec` (the CLI's `zerobench trace`); errors become status `error`.
    `states_only`: the engine built and its model states counted, no step (Table 1's cells)."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    if states_only:
        try:
            states = _built(spec)
        except Exception as exc:
            return spec.record("traced", status="error", error=short_error(exc))
        return spec.record(
            "traced",
            param_bytes=states["param"],
            grad_bytes=states["grad"],
            optimizer_bytes=states["optimizer"],
            build_peak_bytes=states["build_peak"],
            extra={
                "memory_counter": COUNTER,
                "states_only": True,
                "device_semantics": device_semantics(spec),
                "trace_cpu_seconds": time.process_time() - cpu0,
            },
        )
    try:
        out = trace_step(spec)
    except Exception as exc:  # a record either way, as `zerobench run` does
        return spec.record("traced", status="error", error=short_error(exc))
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    after, peak = out["bytes"], out["peak_breakdown"]
    # the ledger of one step; its seconds are the fake group's, not a network's
    comm = {
        k: {**v, "seconds": None, "per_step_volume_elements": v["volume_elements"]} for k, v in out["ledger"].items()
    }
    return spec.record(
        "traced",
        param_bytes=after["param"],
        grad_bytes=after["grad"],
        optimizer_bytes=after["optimizer"],
        activation_bytes=out["activation_bytes"],
        peak_allocated_bytes=out["peak_bytes"],
        build_peak_bytes=out["build_peak"],
        comm=comm,
        extra={
            "memory_counter": COUNTER,
            "device_semantics": device_semantics(spec),
            "temporary_bytes": out["high"]["temporary"],  # its own high-water mark in the step
            "other_bytes": after["other"],  # small tensors left from the build (Adam's step counts)
            "peak_breakdown": peak,  # by category at the peak, on the device
            "host_peak_bytes": out["host_peak_bytes"],  # on the host (P_a+cpu's checkpoints), apart
            "high_water_bytes": out["high"],  # each category's own maximum in the step
            "engine_model_state_bytes": out["engine_state_bytes"],
            "trace_seconds": seconds,
            "trace_cpu_seconds": cpu_seconds,  # wall time on a shared machine says little
            "trace_build_seconds": out["build_s"],
            "trace_step_seconds": out["step_s"],
            "trace_peak_rss_bytes": memory.peak_rss_bytes(),
        },
    )
