"""The only place collectives are issued. A ledger counts, per op and group, the calls, the
message elements and bytes, the per-rank volume moved by the ring algorithm, and the seconds.

Seconds come from marks on the tensor's device (zerobench/clock.py): the host clock on CPU, read
at once; on CUDA timing events recorded on the current stream, read when they have run (at the
latest when the ledger is read), so timing a call never makes the host wait for the device. A
synchronous call is charged from the end of the work queued before it to the end of the
collective; an asynchronous one at its `wait()`, from the end of the work queued before the wait
to the end of the collective: what the rank waited beyond the overlapped compute (docs/gpu.md).

Volume convention (paper §7, paper.md §1.4), per rank, for a message of N elements over n ranks:
all-reduce 2N(n−1)/n, reduce-scatter N(n−1)/n (N = the full input), all-gather N(n−1)/n (N = the
full output), broadcast N. Groups of one issue nothing and count nothing.

On gloo, reduce-scatter and all-gather of contiguous tensors are issued as a pairwise exchange:
each rank sends chunk j to rank j (isend/irecv) and sums or places what it receives. Every rank
sends and receives exactly the (n−1)/n·N elements the ring moves, so the ledger is unchanged, but
gloo's own reduce_scatter_single / all_gather_single stage the data through per-rank tensor
lists, an extra copy of every chunk at equal bytes (docs/engine-measurements.md has the timings).
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from zerobench.clock import EventMarks, HostMarks, tensor_marks
from zerobench.engine.parallel.topology import Group
from zerobench.stages import ring_volume

# torch 2.13 renamed the single-tensor collectives (the old names warn, FutureWarning); torch 2.11
# has only the old ones. Decided here, once: same arguments in both.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

ONCE = ("broadcast", "copy_to_host", "copy_to_device")  # ops whose volume is their message, sent once


def volume_factor(op: str, n: int) -> float:
    """Elements a rank sends per message element of `op` over `n` ranks: the ring's
    (zerobench/stages.py ring_volume) for the reductions and gathers, 1 for the rest."""
    if op in ONCE:
        return 1.0
    return ring_volume(op, n)


@dataclass
class Entry:
    calls: int = 0
    elements: int = 0  # message size, summed over calls
    bytes: int = 0
    volume_elements: float = 0.0  # per-rank ring volume
    volume_bytes: float = 0.0
    seconds: float = 0.0  # time in the call (sync) or waiting for it (async), on the device's marks


class Ledger:
    """Entries per (op, group). Seconds between marks not yet run (CUDA events) wait in `_pending`
    and are added in call order as they complete; reading `entries` or `as_dict()` adds the rest
    (waiting for those events only)."""

    def __init__(self):
        self._entries: dict[tuple[str, str], Entry] = defaultdict(Entry)
        self._pending: deque = deque()  # (entry, marks, start, end), in charge order

    @property
    def entries(self) -> dict[tuple[str, str], Entry]:
        self.settle()
        return self._entries

    def record(self, op: str, group: str, numel: int, elem_bytes: int, group_size: int) -> Entry:
        e = self._entries[(op, group)]
        factor = volume_factor(op, group_size)
        e.calls += 1
        e.elements += numel
        e.bytes += numel * elem_bytes
        e.volume_elements += numel * factor
        e.volume_bytes += numel * elem_bytes * factor
        return e

    def charge(self, entry: Entry, marks, start, end) -> None:
        """Add the seconds from mark `start` to mark `end` to `entry`: now if every earlier charge
        has been added and `end` has run (always, on the host clock), else once it has."""
        self._pending.append((entry, marks, start, end))
        self.settle(wait=False)

    def settle(self, wait: bool = True) -> None:
        """Add the pending seconds in charge order; without `wait`, only up to the first whose end
        mark has not run yet."""
        while self._pending:
            entry, marks, start, end = self._pending[0]
            if not wait and not marks.ready(end):
                return
            entry.seconds += marks.seconds(start, end)
            self._pending.popleft()

    def reset(self) -> None:
        self._pending.clear()  # seconds of calls before the reset are not this ledger's any more
        self._entries.clear()

    def as_dict(self) -> dict:
        return {f"{op}/{g}": asdict(e) for (op, g), e in sorted(self.entries.items())}


@dataclass(frozen=True)
class Stopwatch:
    """Times calls on one device's marks into one ledger."""

    ledger: Ledger
    marks: HostMarks | EventMarks
    device: torch.device

    def start(self):
        return self.marks.mark(self.device)

    def stop(self, entry: Entry, start) -> None:
        self.ledger.charge(entry, self.marks, start, self.marks.mark(self.device))


class Handle:
    """An in-flight collective; `wait()` charges the waiting time to its ledger entry on `watch`
    (from the end of this rank's work queued before the wait to the end of the collective).
    `Handle(None, entry)`: nothing in flight, nothing to charge."""

    def __init__(self, work, entry: Entry | None, watch: Stopwatch | None = None):
        self.work, self.entry, self.watch = work, entry, watch

    def wait(self) -> None:
        if self.work is not None:
            start = self.watch.start()
            self.work.wait()
            self.watch.stop(self.entry, start)
            self.work = None


class _Exchange:
    """A pairwise exchange in flight: its point-to-point works, then `finish` (the local sum)."""

    def __init__(self, works: list, finish=None):
        self.works, self.finish = works, finish

    def wait(self) -> None:
        for w in self.works:
            w.wait()
        if self.finish is not None:
            self.finish()


def _pairwise(group: Group, *tensors: torch.Tensor) -> bool:
    return dist.get_backend(group.pg) == "gloo" and all(t.is_contiguous() for t in tensors)


def _exchange(group: Group, send, recv) -> list:
    """isend `send(j)` to and irecv `recv(j)` from every other rank j of the group."""
    works = []
    for j in range(group.size):
        if j != group.rank:
            works.append(dist.isend(send(j), group=group.pg, group_dst=j))
            works.append(dist.irecv(recv(j), group=group.pg, group_src=j))
    return works


def _reduce_scatter_pairwise(out: torch.Tensor, inp: torch.Tensor, group: Group) -> _Exchange:
    chunks = list(inp.split(out.numel()))
    others = [j for j in range(group.size) if j != group.rank]
    # The first other rank's chunk lands in `out` itself (one buffer fewer: none at all for two
    # ranks); the rest are added in rank order, so every rank sums in the same order (the first
    # pair is commutative, so it does not matter which of ranks 0 and 1 is this one).
    received = {j: out if j == others[0] else torch.empty_like(out) for j in others}

    def finish() -> None:
        for j in range(group.size):
            if j != others[0]:
                out.add_(received.get(j, chunks[j]))

    return _Exchange(_exchange(group, chunks.__getitem__, received.__getitem__), finish)


def _all_gather_pairwise(out: torch.Tensor, inp: torch.Tensor, group: Group) -> _Exchange:
    chunks = list(out.split(inp.numel()))
    # `inp` is sent as it is, so the transfer starts before this rank's chunk is copied into place
    # (not in place: stage 3 gathers a bucket from its shard; the copy is 1/N_d of the bucket)
    works = _exchange(group, lambda j: inp, chunks.__getitem__)
    mine = chunks[group.rank]
    if mine.data_ptr() != inp.data_ptr():
        mine.copy_(inp)
    return _Exchange(works)


class Comms:
    """Collectives over explicit groups, each one counted in `self.ledger`, its seconds read on the
    marks of the tensor's device (the module docstring). `marks`: the marks every call is timed
    on, whatever its device (the seam tests inject); by default `clock.tensor_marks`."""

    def __init__(self, ledger: Ledger | None = None, marks: HostMarks | EventMarks | None = None):
        self.ledger = ledger or Ledger()
        self.marks = marks

    def _watch(self, t: torch.Tensor) -> Stopwatch:
        return Stopwatch(self.ledger, self.marks or tensor_marks(t), t.device)

    def _issue(self, op: str, group: Group, numel: int, t: torch.Tensor, fn, async_op: bool):
        if group.size == 1:
            return Handle(None, None)
        entry = self.ledger.record(op, group.name, numel, t.element_size(), group.size)
        watch = self._watch(t)
        if async_op:  # no mark at the issue: the wait is what an asynchronous call is charged
            return Handle(fn(True), entry, watch)
        start = watch.start()
        work = fn(False)
        if work is not None:  # a pairwise exchange is asynchronous underneath
            work.wait()
        watch.stop(entry, start)
        return Handle(None, entry)

    def all_reduce(self, t: torch.Tensor, group: Group, op=dist.ReduceOp.SUM, async_op=False) -> Handle:
        return self._issue(
            "all_reduce", group, t.numel(), t, lambda a: dist.all_reduce(t, op=op, group=group.pg, async_op=a), async_op
        )

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, group: Group, async_op=False) -> Handle:
        """Sum `inp` (group.size × out.numel() elements) over the group; rank r gets chunk r.
        `inp` must stay unchanged until the handle is waited for."""
        return self._exchange("reduce_scatter", out, inp, group, async_op, inp)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, group: Group, async_op=False) -> Handle:
        """Concatenate every rank's `inp` into `out` (group.size × inp.numel() elements).
        `inp` must stay unchanged until the handle is waited for."""
        return self._exchange("all_gather", out, inp, group, async_op, out)

    def _exchange(self, op: str, out, inp, group: Group, async_op: bool, whole: torch.Tensor) -> Handle:
        """A reduce-scatter or all-gather between the whole message and one rank's chunk, counted
        on `whole`: pairwise sends and receives on gloo (`_pairwise`), the collective elsewhere; on
        one rank a copy."""
        if group.size == 1:
            out.copy_(inp)
        pairwise, collective = _EXCHANGES[op]

        def issue(a: bool):
            if _pairwise(group, out, inp):
                return pairwise(out, inp, group)
            return collective(out, inp, group=group.pg, async_op=a)

        return self._issue(op, group, whole.numel(), whole, issue, async_op)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, op: str) -> None:
        """A host↔device copy (`op` is copy_to_host or copy_to_device; P_a+cpu, paper §6.1), counted
        under the group "host": its volume is the bytes moved, on a CPU-only run as on a GPU."""
        if op not in ("copy_to_host", "copy_to_device"):
            raise ValueError(f"op={op!r}: must be copy_to_host or copy_to_device")
        entry = self.ledger.record(op, "host", src.numel(), src.element_size(), 1)
        watch = self._watch(src if op == "copy_to_host" else dst)
        start = watch.start()
        dst.copy_(src)
        watch.stop(entry, start)

    def broadcast(self, t: torch.Tensor, src_rank_in_group: int, group: Group) -> Handle:
        src = dist.get_global_rank(group.pg, src_rank_in_group) if group.size > 1 else 0
        return self._issue("broadcast", group, t.numel(), t, lambda a: dist.broadcast(t, src, group=group.pg), False)


# op -> (the pairwise exchange, torch.distributed's collective)
_EXCHANGES = {
    "reduce_scatter": (_reduce_scatter_pairwise, _REDUCE_SCATTER),
    "all_gather": (_all_gather_pairwise, _ALL_GATHER),
}
