"""Our engine in the comparison: `zerobench.runtime.train.build_engine` and `train_steps`, exactly the path
a `zerobench run` trial takes. After each step it issues that step's collectives again with no
compute (`replay_step`): what this machine's gloo costs per step at that stage, the `bound` row's
share over the floor (runner.py), read beside the step it bounds."""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.distributed as dist

from zerobench.parallel import topology
from zerobench.parallel.comms import Comms, Ledger
from zerobench.runtime.train import build_engine, train_steps

_DTYPE = {1: torch.uint8, 2: torch.bfloat16, 4: torch.float32, 8: torch.float64}  # by bytes per element


def _stage(impl: str) -> int:
    return int(impl.rsplit("-", 1)[1])


def check(impl: str, spec) -> None:
    """Ours runs every stage and layout the spec can hold: nothing to refuse."""


def versions() -> dict:
    return {}


class CallLedger(Ledger):
    """Our ledger, also keeping every call in order: (op, group, message elements, bytes per element)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, str, int, int]] = []

    def record(self, op: str, group: str, numel: int, elem_bytes: int, group_size: int):
        self.calls.append((op, group, numel, elem_bytes))
        return super().record(op, group, numel, elem_bytes, group_size)

    def reset(self) -> None:
        super().reset()
        self.calls.clear()


class Trainer:
    def __init__(self, impl: str, spec):
        self.spec = dataclasses.replace(spec, parallel=dataclasses.replace(spec.parallel, stage=_stage(impl)))
        # a one-rank spec trains alone even in a larger world (the concurrent floor, runner.py)
        one = spec.parallel.world_size == 1
        self.ctx = topology.single_process() if one else topology.build(spec.parallel.dp, spec.parallel.mp)
        self.comms = Comms(CallLedger())
        self.engine = build_engine(self.spec, self.ctx, self.comms, torch.device("cpu"))
        self.replay_comms, self._buffers, self._last_calls = Comms(), {}, []
        self.note = f"bucket_bytes={spec.parallel.bucket_bytes}" + (
            f", reuse_bytes={spec.parallel.reuse_bytes}" if self.spec.parallel.stage == 3 else ""
        )

    def step(self, step: int) -> float:
        if step == self.spec.train.warmup:
            self.comms.ledger.reset()  # from here on the ledger counts the timed steps only
        first = len(self.comms.ledger.calls)
        loss = train_steps(self.engine, self.spec, self.ctx, 1, first_step=step)[0]
        self._last_calls = self.comms.ledger.calls[first:]
        return loss

    def timed_collectives(self) -> dict:
        """Calls and message bytes per op of the timed steps, from our ledger."""
        out: dict[str, dict[str, int]] = {}
        for (op, _group), e in self.comms.ledger.entries.items():
            entry = out.setdefault(op, {"calls": 0, "bytes": 0})
            entry["calls"] += e.calls
            entry["bytes"] += e.bytes
        return out

    def replay_step(self) -> float:
        """Seconds this rank takes to issue the last step's collectives again with no compute:
        every call as the step issued it (op, group, message size, element size), in order, each
        waited for before the next, on buffers made beforehand, through a Comms of its own
        (`replay_comms`: the same realization on gloo; its ledger counts the replays). The harness
        calls it right after each step, outside the step's timing, so the bound sees the host as
        the step did. The ranks meet at a barrier first. This rank's clock; a world whose groups
        are all of one rank issues nothing: 0."""
        calls = self._last_calls
        if not calls:
            return 0.0
        groups = {g.name: g for g in (self.ctx.dp, self.ctx.mp, self.ctx.world)}
        issues = [self._replay_call(groups[group], op, numel, elem_bytes) for op, group, numel, elem_bytes in calls]
        if self.ctx.world.size > 1:
            dist.barrier()
        t0 = time.perf_counter()
        for issue in issues:
            issue()
        return time.perf_counter() - t0

    def _buffer(self, numel: int, elem_bytes: int, role: str) -> torch.Tensor:
        key = (numel, elem_bytes, role)
        if key not in self._buffers:
            self._buffers[key] = torch.zeros(numel, dtype=_DTYPE[elem_bytes])
        return self._buffers[key]

    def _replay_call(self, g, op: str, numel: int, elem_bytes: int):
        """One recorded call, ready to issue again (its buffers made now, outside the timing)."""
        comms, whole = self.replay_comms, self._buffer(numel, elem_bytes, "whole")
        if op == "all_reduce":
            return lambda: comms.all_reduce(whole, g)
        if op == "broadcast":
            return lambda: comms.broadcast(whole, 0, g)
        part = self._buffer(numel // g.size, elem_bytes, "part")
        if op == "reduce_scatter":
            return lambda: comms.reduce_scatter(part, whole, g)
        if op == "all_gather":
            return lambda: comms.all_gather(whole, part, g)
        raise ValueError(f"op={op!r}: no replay for it")


def build(impl: str, spec) -> Trainer:
    return Trainer(impl, spec)
