"""Our engine in the comparison, exactly the path a `zerobench run` trial takes: composed by the
engine's `parallelize` and stepped by its `train_step` over each rank's own slice
(zerobench/runtime/train.py `build_engine`, `train_steps`). After its timed steps it issues their
collectives again with no compute (`collective_seconds`): what this machine's gloo costs per step
at that stage, the `bound` row's share over the floor (runner.py)."""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.distributed as dist

from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms, Ledger
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
        self.engine = build_engine(self.spec, self.ctx, self.comms, torch.device(spec.precision.device))
        self.note = (
            f"bucket_bytes={spec.parallel.bucket_bytes}"
            + (f", reuse_bytes={spec.parallel.reuse_bytes}" if self.spec.parallel.stage == 3 else "")
            + (", torch.compile per block" if spec.train.compiles(self.engine.device.type) else "")
        )

    def step(self, step: int) -> float:
        if step == self.spec.train.warmup:
            self.comms.ledger.reset()  # from here on the ledger counts the timed steps only
        return train_steps(self.engine, self.spec, self.ctx, 1, first_step=step)[0]

    def timed_collectives(self) -> dict:
        """Calls and message bytes per op of the timed steps, from our ledger."""
        out: dict[str, dict[str, int]] = {}
        for (op, _group), e in self.comms.ledger.entries.items():
            entry = out.setdefault(op, {"calls": 0, "bytes": 0})
            entry["calls"] += e.calls
            entry["bytes"] += e.bytes
        return out

    def collective_seconds(self, comms: Comms | None = None) -> list[float]:
        """Seconds per timed step of that step's collectives issued again with no compute: every
        call as the step issued it (op, group, message size, element size), in order, each waited
        for before the next, on buffers made beforehand, through our Comms (the same realization
        on gloo). One step's calls first as a warm-up; the ranks meet at a barrier before each
        step. This rank's clock. A world whose groups are all of one rank issues nothing: zeros.
        `comms`: what to issue them through (default a fresh Comms; its ledger counts the replay)."""
        calls, steps = self.comms.ledger.calls, self.spec.train.steps
        if not calls:
            return [0.0] * steps
        if len(calls) % steps:
            raise RuntimeError(f"{len(calls)} collectives over {steps} timed steps: not the same calls every step")
        per = len(calls) // steps
        groups = {g.name: g for g in (self.ctx.dp, self.ctx.mp, self.ctx.world)}
        comms, buffers = comms or Comms(), {}

        def buf(numel: int, elem_bytes: int, role: str) -> torch.Tensor:
            key = (numel, elem_bytes, role)
            if key not in buffers:
                buffers[key] = torch.zeros(numel, dtype=_DTYPE[elem_bytes], device=self.engine.device)
            return buffers[key]

        def issue(op: str, group: str, numel: int, elem_bytes: int) -> None:
            g = groups[group]
            if op == "all_reduce":
                comms.all_reduce(buf(numel, elem_bytes, "whole"), g)
            elif op == "reduce_scatter":
                comms.reduce_scatter(buf(numel // g.size, elem_bytes, "part"), buf(numel, elem_bytes, "whole"), g)
            elif op == "all_gather":
                comms.all_gather(buf(numel, elem_bytes, "whole"), buf(numel // g.size, elem_bytes, "part"), g)
            elif op == "broadcast":
                comms.broadcast(buf(numel, elem_bytes, "whole"), 0, g)
            else:
                raise ValueError(f"op={op!r}: no replay for it")

        seconds = []
        for step in range(steps + 1):  # step 0: the warm-up
            if self.ctx.world.size > 1:
                dist.barrier()
            t0 = time.perf_counter()
            for call in calls[(step % steps) * per : (step % steps + 1) * per]:
                issue(*call)
            if step:
                seconds.append(time.perf_counter() - t0)
        return seconds


def build(impl: str, spec) -> Trainer:
    return Trainer(impl, spec)
