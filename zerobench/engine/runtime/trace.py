"""One training step of the engine, traced (`source: traced`): the same `build_engine` and engine
classes `zerobench run` uses, run under PyTorch's FakeTensorMode on a fake process group of any
world size, so nothing is allocated and nothing is computed — a 100B-parameter model at N_d = 400
traces on a laptop. What comes out is exact for *this engine*: model-state bytes per rank (paper
§5, Table 1), activation and temporary bytes, the peak, and the collective bytes of the ledger
(§7), per op and group.

Memory is counted by `StorageCounter`, a small TorchDispatchMode of our own, not
`torch.distributed._tools.mem_tracker.MemTracker`: MemTracker recognises only nn.Parameter
storages, `torch.optim` states and `.grad` tensors, while this engine keeps its states in flat
buffers of its own (it would file gradients and optimizer states as "other" and stage 3's gathered
parameters as activations), and it grows super-linearly with the tensors tracked (design.md).
The record names the counter (`memory_counter`).
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from contextlib import contextmanager
from functools import partial

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_leaves

from zerobench import memory
from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms
from zerobench.engine.runtime.batches import micro_batches, token_source
from zerobench.engine.runtime.train import build_engine
from zerobench.engine.trial import TrialSpec, short_error

CATEGORIES = ("param", "grad", "optimizer", "activation", "temporary", "other")
COUNTER = "StorageCounter"  # the engine's own dispatch-mode counter of live storage bytes, by category
_DEVICE = torch.ops.prim.device.default  # the argument parser asks for it more than once per op


class StorageCounter(FakeTensorMode):
    """FakeTensorMode that also counts live bytes per category of every storage the ops create
    while it is active, and the peak with its breakdown. A new storage takes the category of the
    current `phase`; `tag` files tensors under a category of their own (the engine's model states),
    and `retag`, called on the op after each allocation, lists the short-lived tensors that are
    model states although the step creates them (stage 2's gradient staging buckets, stage 3's
    gathered parameter buckets).

    One mode, not a TorchDispatchMode stacked on FakeTensorMode: each op crosses into Python once,
    not twice, and the `prim.device` queries (more than the ops) are answered here directly. Ops
    that FakeTensorMode runs inside another (decompositions) are not counted, as a mode stacked
    above it would not see them.

    `nn.Module.to` works in it: the converter's memo of fresh op outputs would put a weakref on
    every Parameter, and `Module._apply` then refuses to swap fake parameters (pytorch#178584); a
    fresh meta tensor is never looked up again, so nothing is lost by not memoizing."""

    def __init__(self, retag=lambda: ()):
        super().__init__()
        self.fake_tensor_converter.set_tensor_memo = lambda t, v: None
        self.phase = "other"
        self.retag = retag
        self._live: dict[int, list] = {}  # id(storage) -> [weakref, bytes, category]
        self.bytes = dict.fromkeys(CATEGORIES, 0)  # live now
        self.high = dict.fromkeys(CATEGORIES, 0)  # each category's own high-water mark
        self.total = 0
        self._fresh = False
        self._depth = 0  # ops under way: FakeTensorMode re-enters itself to decompose
        self.reset_peak()

    def reset_peak(self) -> None:
        self.peak, self.peak_bytes = self.total, dict(self.bytes)

    def reset_high(self) -> None:
        self.high = dict(self.bytes)

    def tag(self, tensors, category: str) -> None:
        for t in tensors:
            self._see(t, category, force=True)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE:  # answered as FakeTensorMode's own handler does, without its dispatch
            return torch.device("meta") if args[0].fake_mode.in_kernel_invocation else args[0].fake_device
        self._depth += 1
        try:
            out = super().__torch_dispatch__(func, types, args, kwargs or {})
        finally:
            self._depth -= 1
        if self._depth:
            return out
        if self._fresh:  # a buffer the engine allocated at the last op may be a model state
            self._fresh = False
            for t, category in self.retag():
                self._see(t, category, force=True)
        for t in tree_leaves(out):
            # a meta tensor (the model before the engine builds it) is a shape, not memory
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.fake_device.type != "meta":
                self._see(t, self.phase)
        if self.total >= self.peak:  # >=: what the last op allocated was retagged by this one
            self.reset_peak()
        return out

    def _see(self, t: torch.Tensor, category: str, force: bool = False) -> None:
        st = t.untyped_storage()
        entry = self._live.get(id(st))
        if entry is None:
            n = st.nbytes()
            self._live[id(st)] = [weakref.ref(st, partial(self._free, id(st))), n, category]
            self.bytes[category] += n
            self.total += n
            self._fresh = True
            self.high[category] = max(self.high[category], self.bytes[category])
        elif force and entry[2] != category:
            self.bytes[entry[2]] -= entry[1]
            self.bytes[category] += entry[1]
            entry[2] = category
            self.high[category] = max(self.high[category], self.bytes[category])

    def _free(self, key: int, _ref) -> None:
        _, n, category = self._live.pop(key)
        self.bytes[category] -= n
        self.total -= n


@contextmanager
def fake_world(world_size: int):
    """This process as rank 0 of a fake process group of `world_size` ranks (collectives do
    nothing; shapes and counts only)."""
    if dist.is_initialized():
        raise RuntimeError("trace: a process group is already initialized; trace in a process of its own")
    # No store: torch then makes the fake backend's own (and registers the backend) itself.
    dist.init_process_group("fake", rank=0, world_size=world_size)
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


@contextmanager
def traced_engine(spec: TrialSpec):
    """`build_engine(spec)` as rank 0 of a fake world, under fake tensors and a StorageCounter
    that has filed the engine's model states and noted the construction's peak (`build_peak`);
    yields (engine, ctx, comms, counter)."""
    holder = []
    counter = StorageCounter(lambda: holder[0].transient_states() if holder else ())
    # the eager program: fake tensors build no kernels (a trace on cpu compiles nothing anyway)
    spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, compile="off"))
    with fake_world(spec.parallel.world_size):
        ctx = topology.build(spec.parallel.dp, spec.parallel.mp)
        comms = Comms()
        with counter:
            holder.append(build_engine(spec, ctx, comms, torch.device("cpu")))
            counter.build_peak = counter.peak  # the construction's own peak, before any step resets it
            for category, tensors in _state_tensors(holder[0]).items():
                counter.tag(tensors, category)
            yield holder[0], ctx, comms, counter


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
    # the real token batch (b·(s+1) integers per sequence), drawn as `zerobench run` draws it
    tokens = token_source(spec.data, spec.model.vocab, spec.model.seq, spec.train.seed).global_batch(
        0, spec.global_batch
    )
    real = list(micro_batches(tokens, spec.train.grad_accum, spec.parallel.dp, 0))  # world rank 0 is DP rank 0
    with traced_engine(spec) as (engine, ctx, comms, counter):
        mbs = [(counter.from_tensor(x), counter.from_tensor(y)) for x, y in real]
        counter.tag([t for mb in mbs for t in mb], "other")  # the token batch: data, not activations
        comms.ledger.reset()  # the step's traffic only, as `zerobench run` counts timed steps
        counter.reset_peak()
        counter.reset_high()
        built = time.perf_counter()
        activation = 0
        for i, (x, y) in enumerate(mbs):
            counter.phase = "activation"
            loss = engine.model(x, y)
            activation = max(activation, counter.bytes["activation"])  # what forward keeps for backward
            counter.phase = "temporary"
            engine.backward(loss, last_micro_batch=i == len(mbs) - 1)
            del loss
        engine.step()
        counter.phase = "other"
        return {
            "bytes": dict(counter.bytes),
            "activation_bytes": activation,
            "peak_bytes": counter.peak,
            "peak_breakdown": counter.peak_bytes,
            "high": dict(counter.high),
            "engine_state_bytes": engine.model_state_bytes(),
            "build_peak": counter.build_peak,
            "ledger": comms.ledger.as_dict(),
            "build_s": built - t0,
            "step_s": time.perf_counter() - built,
        }


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
            "traced", param_bytes=states["param"], grad_bytes=states["grad"], optimizer_bytes=states["optimizer"],
            build_peak_bytes=states["build_peak"],
            extra={"memory_counter": COUNTER, "states_only": True, "trace_cpu_seconds": time.process_time() - cpu0},
        )  # fmt: skip
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
            "temporary_bytes": out["high"]["temporary"],  # its own high-water mark in the step
            "other_bytes": after["other"],  # small tensors left from the build (Adam's step counts)
            "peak_breakdown": peak,  # by category at the peak
            "high_water_bytes": out["high"],  # each category's own maximum in the step
            "engine_model_state_bytes": out["engine_state_bytes"],
            "trace_seconds": seconds,
            "trace_cpu_seconds": cpu_seconds,  # wall time on a shared machine says little
            "trace_build_seconds": out["build_s"],
            "trace_step_seconds": out["step_s"],
            "trace_peak_rss_bytes": memory.peak_rss_bytes(),
        },
    )
