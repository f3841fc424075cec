"""Stage 3's gathered parameters (paper §5.3): which buckets are whole on this rank right now, the
bound on their bytes, and prefetch along the order the program used before.

The order in which buckets are gathered (forward and backward) is recorded during the first
micro-batch; from then on each gather issues asynchronous gathers of the next buckets in that
order, while the bytes gathered ahead of use stay within `prefetch_bytes` and all gathered bytes
(in use and ahead) within `max_live_bytes`. A bucket in use whose next use comes up in the order
is gathered ahead into a second buffer (`again`), which serves that use once the first is
released: the GPT's root bucket (wte, wpe) is held through the whole forward and read again at
the start of backward, so without it that gather could never be issued ahead. The second gather
moves the same bytes as the on-demand one it replaces (the 3Ψ of §7.2.2 is unchanged); its
buffer counts as gathered ahead. A bucket the program needs is gathered regardless of
prefetch; if that alone breaks `max_live_bytes` the step fails naming the field. When the program
leaves the recorded order, the rest of the micro-batch gathers on demand (`trace_misses`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from zerobench.config import ConfigError, ParallelConfig
from zerobench.parallel.comms import Comms
from zerobench.parallel.topology import Group
from zerobench.zero.buffers import BufferPool
from zerobench.zero.partition import FlatLayout


class GatheredBuckets:
    """Gathers and releases the partitioned buckets of `layout` (those listed in `shards`: this
    rank's chunk of each); `point(b, flat)` makes bucket b's parameters views of `flat`, or
    releases them (None). Counters: `live_bytes`, `peak_live_bytes`, `gathers`, `prefetches`
    (of which `again`: a second buffer for a bucket in use), `misses`; `order` is the recorded
    order, (bucket, in backward) pairs."""

    def __init__(
        self,
        layout: FlatLayout,
        shards: list[torch.Tensor],
        point: Callable[[int, torch.Tensor | None], None],
        parallel: ParallelConfig,
        dp: Group,
        comms: Comms,
        pool: BufferPool,
        names: list[str],
    ):
        self.layout, self.shards, self.point, self.dp, self.comms = layout, shards, point, dp, comms
        self.pool, self.names = pool, names
        self.prefetch_bytes, self.max_live_bytes = parallel.prefetch_bytes, parallel.max_live_bytes
        self.sizes = [b.padded * pool.dtype.itemsize for b in layout.buckets]  # bytes, gathered
        self.buffers: dict[int, torch.Tensor] = {}  # gathered (or arriving) bucket buffers
        self._handles: dict[int, object] = {}  # their all-gathers still to wait for
        self.ready: set[int] = set()  # buckets asked for and pointed at
        self.second: dict[int, tuple[torch.Tensor, object]] = {}  # buckets in use: their next use's buffer, gather
        self.live_bytes = self.peak_live_bytes = 0
        self.gathers = self.prefetches = self.again = self.misses = 0
        self.order: list[tuple[int, bool]] = []
        self._recorded = False
        self._cursor: int | None = 0  # next place in the order; None: off it

    def start_micro_batch(self) -> None:
        if not self._recorded:
            self.order.clear()
        self._cursor = 0

    def end_micro_batch(self) -> None:
        """The order is recorded; every bucket still gathered is released."""
        self._recorded = True
        for b in list(self.second):
            self._drop_second(b)
        for b in list(self.buffers):
            self.release(b)

    def held(self) -> list[torch.Tensor]:
        """Every gathered (or arriving) buffer: in use, ahead, and second buffers."""
        return [*self.buffers.values(), *(buf for buf, _ in self.second.values())]

    def fetch(self, b: int, in_backward: bool) -> torch.Tensor:
        """Bucket b gathered, waited for and its parameters pointing at it (the program needs it now)."""
        if b not in self.ready:
            if b not in self.buffers:
                self._make_room(b)
                self._gather(b, prefetch=False)
            self._handles.pop(b).wait()
            self.point(b, self.buffers[b])
            self.ready.add(b)
            self._follow(b, in_backward)
        return self.buffers[b]

    def release(self, b: int) -> None:
        handle = self._handles.pop(b, None)
        if handle is not None:  # a prefetch nobody used may still be arriving
            handle.wait()
        buf = self.buffers.pop(b)
        self.ready.discard(b)
        self.live_bytes -= self.sizes[b]
        self.point(b, None)
        self.pool.give(buf)
        if b in self.second:  # its next use, gathered ahead while this one ran, now waits as a prefetch
            self.buffers[b], self._handles[b] = self.second.pop(b)

    def _drop_second(self, b: int) -> None:
        buf, handle = self.second.pop(b)
        handle.wait()
        self.live_bytes -= self.sizes[b]
        self.pool.give(buf)

    def _gather(self, b: int, prefetch: bool) -> None:
        buf = self.pool.take(self.layout.buckets[b].padded)
        self.live_bytes += self.sizes[b]
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        handle = self.comms.all_gather(buf, self.shards[b], self.dp, async_op=prefetch)
        if b in self.ready:  # in use: this is its next use's buffer
            self.second[b] = buf, handle
            self.again += 1
        else:
            self.buffers[b], self._handles[b] = buf, handle
        self.gathers += 1
        self.prefetches += prefetch

    def _make_room(self, b: int) -> None:
        if self.live_bytes + self.sizes[b] > self.max_live_bytes:  # drop prefetches the program did not follow
            for ahead in [a for a in self.buffers if a not in self.ready]:
                self.release(ahead)
            for a in list(self.second):
                self._drop_second(a)
        need = self.live_bytes + self.sizes[b]
        if need > self.max_live_bytes:
            raise ConfigError(
                f"max_live_bytes={self.max_live_bytes}: stage 3 needs {need} bytes of gathered parameters "
                f"alive at once (gathering {self.names[b]})"
            )

    def _follow(self, b: int, in_backward: bool) -> None:
        if not self._recorded:
            self.order.append((b, in_backward))
        elif self._cursor is None:  # off the recorded order in this micro-batch already
            return
        elif self._cursor < len(self.order) and self.order[self._cursor][0] == b:
            self._cursor += 1
            self._prefetch()
        else:  # the program left the recorded order: gather on demand for the rest of the micro-batch
            self.misses += 1
            self._cursor = None

    def _prefetch(self) -> None:
        waiting = [a for a in self.buffers if a not in self.ready] + list(self.second)
        ahead = sum(self.sizes[a] for a in waiting)
        for b, _ in self.order[self._cursor :]:
            if b in self.second or (b in self.buffers and b not in self.ready):  # its next use is on its way
                continue
            n = self.sizes[b]
            if ahead + n > self.prefetch_bytes or self.live_bytes + n > self.max_live_bytes:
                break
            self._gather(b, prefetch=True)
            ahead += n
