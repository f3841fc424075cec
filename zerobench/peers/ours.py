"""Our engine in the comparison: `zerobench.runtime.train.build_engine` and `train_steps`, exactly the path
a `zerobench run` trial takes."""

from __future__ import annotations

import dataclasses

import torch

from zerobench.parallel import topology
from zerobench.parallel.comms import Comms
from zerobench.runtime.train import build_engine, train_steps


def _stage(impl: str) -> int:
    return int(impl.rsplit("-", 1)[1])


def check(impl: str, spec) -> None:
    """Ours runs every stage and layout the spec can hold: nothing to refuse."""


def versions() -> dict:
    return {}


class Trainer:
    def __init__(self, impl: str, spec):
        self.spec = dataclasses.replace(spec, parallel=dataclasses.replace(spec.parallel, stage=_stage(impl)))
        # a one-rank spec trains alone even in a larger world (the concurrent floor, runner.py)
        one = spec.parallel.world_size == 1
        self.ctx = topology.single_process() if one else topology.build(spec.parallel.dp, spec.parallel.mp)
        self.comms = Comms()
        self.engine = build_engine(self.spec, self.ctx, self.comms, torch.device("cpu"))
        self.note = f"bucket_bytes={spec.parallel.bucket_bytes}"

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


def build(impl: str, spec) -> Trainer:
    return Trainer(impl, spec)
