"""Collectives of one emulated rank (`source: emulated`, runtime/emulate.py): this process is one
rank of a dp × mp world on torch's fake process group, so nothing is sent or received. Each call
is counted in the ledger exactly as a real one (bytes, ring volume: the trace's and a real run's
ledger, call for call) and noted on a timeline — when the engine issued it and when it waited for
it, on the device clock — for the performance model to price and place (perfmodel/replay.py).

What a collective would have brought stays finite and plausible, so the loss, the fp16 loss
scaler, clipping and Adam all take their real paths on real values:
- a DP sum (gradient all-reduce, reduce-scatter) is taken as if every rank held this rank's
  values: the result is group size × this rank's chunk, so after the engine's 1/N_d prescale each
  rank updates with its own gradient, at its real magnitude;
- an MP sum keeps this rank's partial sum (a row-parallel layer's share of the output, a
  vocab-parallel loss's share of the softmax's denominator): never larger than the real sum's
  terms, so nothing overflows that a real run would not;
- an all-gather fills every other rank's chunk with copies of this rank's (stage 3's gathered
  parameters, stages 1-2's updated chunks, P_a's checkpoints), in place, allocating nothing, so
  the tensor bytes stay the trace's;
- a max (the overflow flag, the loss's max logit) is this rank's own.
The losses are therefore not the model's losses; the record says so.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from zerobench.clock import CUDA_MARKS, HOST_MARKS
from zerobench.engine.parallel.comms import Comms, Handle
from zerobench.engine.parallel.topology import Group


class Timeline:
    """Each step's calls with their marks on the device clock (zerobench/clock.py: on CUDA an event
    recorded on the current stream, read once the step is done, so no mark stalls the host; on a
    CPU `time.perf_counter`)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.marks = CUDA_MARKS if device.type == "cuda" else HOST_MARKS
        self.calls: list[list] = []  # [op, group name, bytes, issue mark, wait mark]
        self.start = self.mark()

    def mark(self):
        return self.marks.mark(self.device)

    def add(self, op: str, group: str, nbytes: int) -> list:
        """A call issued now (its wait mark the same until it is waited for)."""
        mark = self.mark()
        self.calls.append([op, group, nbytes, mark, mark])
        return self.calls[-1]

    def begin(self) -> None:
        """A new step starts now: the calls noted so far are dropped."""
        self.calls, self.start = [], self.mark()

    def read(self) -> list[dict]:
        """The step's calls, seconds from its start."""
        since = self.marks.seconds
        return [
            {"op": op, "group": g, "bytes": n, "issue_s": since(self.start, i), "wait_s": since(self.start, w)}
            for op, g, n, i, w in self.calls
        ]


class _Pending(Handle):
    """An emulated asynchronous call: waiting for it marks the wait."""

    def __init__(self, call: list, timeline: Timeline):
        super().__init__(None, None)
        self.call, self.timeline = call, timeline

    def wait(self) -> None:
        if self.call is not None:
            self.call[4] = self.timeline.mark()
            self.call = None


class EmulatedComms(Comms):
    """`Comms` on a fake world: the same ledger, local fills instead of traffic (see above), and a
    `timeline` of every call. Host copies (P_a+cpu) are real copies, as in `Comms`."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.timeline = Timeline(device)

    def _note(self, op: str, group: Group, whole: torch.Tensor, async_op: bool) -> Handle:
        entry = self.ledger.record(op, group.name, whole.numel(), whole.element_size(), group.size)
        call = self.timeline.add(op, group.name, whole.numel() * whole.element_size())
        return _Pending(call, self.timeline) if async_op else Handle(None, entry)

    def all_reduce(self, t: torch.Tensor, group: Group, op=dist.ReduceOp.SUM, async_op=False) -> Handle:
        if group.size == 1:
            return super().all_reduce(t, group, op, async_op)
        if op == dist.ReduceOp.SUM and group.name == "dp":
            t.mul_(group.size)
        return self._note("all_reduce", group, t, async_op)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, group: Group, async_op=False) -> Handle:
        if group.size == 1:
            return super().reduce_scatter(out, inp, group, async_op)
        n = out.numel()
        mine = inp.reshape(-1)[group.rank * n : (group.rank + 1) * n]
        if mine.data_ptr() != out.data_ptr():
            out.copy_(mine.view_as(out))
        if group.name == "dp":
            out.mul_(group.size)
        return self._note("reduce_scatter", group, inp, async_op)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, group: Group, async_op=False) -> Handle:
        if group.size == 1:
            return super().all_gather(out, inp, group, async_op)
        r, rows = group.rank, out.view(group.size, inp.numel())
        mine = inp.reshape(1, -1)
        if rows[r].data_ptr() != mine.data_ptr():
            rows[r].copy_(mine[0])
        # the rows before and after this rank's: two copies, neither overlapping `inp` (in place
        # when `inp` is this rank's row of `out`), nothing allocated
        rows[:r].copy_(mine.expand(r, -1))
        rows[r + 1 :].copy_(mine.expand(group.size - r - 1, -1))
        return self._note("all_gather", group, out, async_op)

    def broadcast(self, t: torch.Tensor, src_rank_in_group: int, group: Group) -> Handle:
        if group.size == 1:
            return super().broadcast(t, src_rank_in_group, group)
        return self._note("broadcast", group, t, False)
