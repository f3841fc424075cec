"""The only place collectives are issued. A ledger counts, per op and group, the calls, the
message elements and bytes, the per-rank volume moved by the ring algorithm, and the seconds.

Volume convention (paper §7, paper.md §1.4), per rank, for a message of N elements over n ranks:
all-reduce 2N(n−1)/n, reduce-scatter N(n−1)/n (N = the full input), all-gather N(n−1)/n (N = the
full output), broadcast N. Groups of one issue nothing and count nothing.

On gloo, reduce-scatter and all-gather of contiguous tensors are issued as a pairwise exchange:
each rank sends chunk j to rank j (isend/irecv) and sums or places what it receives. Every rank
sends and receives exactly the (n−1)/n·N elements the ring moves, so the ledger is unchanged, but
gloo's own reduce_scatter_tensor / all_gather_into_tensor stage the data through per-rank tensor
lists, an extra copy of every chunk at equal bytes (docs/engine-measurements.md has the timings).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from zerobench.clock import stream_sync, tensor_clock
from zerobench.engine.parallel.topology import Group

_RING_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "copy_to_host": lambda n: 1.0,
    "copy_to_device": lambda n: 1.0,
}


@dataclass
class Entry:
    calls: int = 0
    elements: int = 0  # message size, summed over calls
    bytes: int = 0
    volume_elements: float = 0.0  # per-rank ring volume
    volume_bytes: float = 0.0
    seconds: float = 0.0  # time in the call (sync) or waiting for it (async), on the device clock


class Ledger:
    def __init__(self):
        self.entries: dict[tuple[str, str], Entry] = defaultdict(Entry)

    def record(self, op: str, group: str, numel: int, elem_bytes: int, group_size: int) -> Entry:
        e = self.entries[(op, group)]
        factor = _RING_FACTOR[op](group_size)
        e.calls += 1
        e.elements += numel
        e.bytes += numel * elem_bytes
        e.volume_elements += numel * factor
        e.volume_bytes += numel * elem_bytes * factor
        return e

    def reset(self) -> None:
        self.entries.clear()

    def as_dict(self) -> dict:
        return {f"{op}/{g}": asdict(e) for (op, g), e in sorted(self.entries.items())}


class Handle:
    """An in-flight collective; `wait()` charges the waiting time to its ledger entry, read on
    `clock` (on CUDA: from when this rank's queued compute is done until the collective is)."""

    def __init__(self, work, entry: Entry | None, clock: Callable[[], float] | None = None):
        self.work, self.entry, self.clock = work, entry, clock

    def wait(self) -> None:
        if self.work is not None:
            t0 = self.clock()
            self.work.wait()
            self.entry.seconds += self.clock() - t0
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
    """Collectives over explicit groups, each one counted in `self.ledger`; its seconds are read
    on the clock of the tensor's device (zerobench/clock.py): on CUDA the current stream is
    waited for before and after a synchronous call, so the seconds are the transfer, not its
    launch. `synchronize`: see `device_clock`."""

    def __init__(self, ledger: Ledger | None = None, synchronize: Callable[[torch.device], None] = stream_sync):
        self.ledger = ledger or Ledger()
        self.synchronize = synchronize

    def _issue(self, op: str, group: Group, numel: int, t: torch.Tensor, fn, async_op: bool):
        if group.size == 1:
            return Handle(None, None)
        entry = self.ledger.record(op, group.name, numel, t.element_size(), group.size)
        clock = tensor_clock(t, self.synchronize)
        if async_op:  # no clock read at the issue: on CUDA it would stall the host until compute is done
            return Handle(fn(True), entry, clock)
        t0 = clock()
        work = fn(False)
        if work is not None:  # a pairwise exchange is asynchronous underneath
            work.wait()
        entry.seconds += clock() - t0
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
        clock = tensor_clock(src if op == "copy_to_host" else dst, self.synchronize)
        t0 = clock()
        dst.copy_(src)
        entry.seconds += clock() - t0

    def broadcast(self, t: torch.Tensor, src_rank_in_group: int, group: Group) -> Handle:
        src = dist.get_global_rank(group.pg, src_rank_in_group) if group.size > 1 else 0
        return self._issue("broadcast", group, t.numel(), t, lambda a: dist.broadcast(t, src, group=group.pg), False)


# op -> (the pairwise exchange, torch.distributed's collective)
_EXCHANGES = {
    "reduce_scatter": (_reduce_scatter_pairwise, dist.reduce_scatter_tensor),
    "all_gather": (_all_gather_pairwise, dist.all_gather_into_tensor),
}
