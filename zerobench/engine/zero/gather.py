"""Stage 3's gathered parameters (paper §5.3): which buckets are whole on this rank right now, the
bound on their bytes, prefetch along the order the program used before, and reuse.

The order in which buckets are gathered (forward and backward) is recorded during the first
micro-batch; from then on each gather issues asynchronous gathers of the next buckets in that
order, while the bytes gathered ahead of use stay within `prefetch_bytes` and all gathered bytes
(in use and ahead) within `max_live_bytes`. A bucket the program needs is gathered regardless of
prefetch; if that alone breaks `max_live_bytes` the step fails naming the field. When the program
leaves the recorded order, the rest of the micro-batch gathers on demand (`trace_misses`).

Reuse (`reuse_bytes`, DeepSpeed's `stage3_max_reuse_distance`, in bytes): a bucket the program is
done with stays gathered when fewer than `reuse_bytes` bytes of other buckets are gathered before
its next use in the recorded order, so that use costs no all-gather. The GPT's root bucket (wte,
wpe) is read to the end of the forward (the tied head) and again first in backward: with any
`reuse_bytes` > 0 it is gathered once per micro-batch, not twice, which moves Ψ_root fewer bytes
than the 3Ψ of §7.2.2. The default, 0, releases every bucket: the paper's 3Ψ exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from zerobench.engine.config import ConfigError, ParallelConfig
from zerobench.engine.parallel.comms import Comms
from zerobench.engine.parallel.topology import Group
from zerobench.engine.zero.buffers import BufferPool
from zerobench.engine.zero.partition import FlatLayout


class GatheredBuckets:
    """Gathers and releases the partitioned buckets of `layout` (those listed in `shards`: this
    rank's chunk of each); `point(b, flat)` makes bucket b's parameters views of `flat`, or
    releases them (None). Counters: `live_bytes`, `peak_live_bytes`, `gathers`, `prefetches`
    `reuses` (uses served by a held bucket), `misses`; `order` is the recorded
    order, (bucket, in backward) pairs; `held`: buckets kept gathered for their next use (reuse)."""

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
        self.reuse_bytes = parallel.reuse_bytes
        self.sizes = [b.padded * pool.dtype.itemsize for b in layout.buckets]  # bytes, gathered
        self.buffers: dict[int, torch.Tensor] = {}  # gathered (or arriving) bucket buffers
        self._handles: dict[int, object] = {}  # their all-gathers still to wait for
        self.ready: set[int] = set()  # buckets asked for and pointed at
        self.held: set[int] = set()  # pointed at, not in use: kept for their next use
        self.live_bytes = self.peak_live_bytes = 0
        self.gathers = self.prefetches = self.reuses = self.misses = 0
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
        for b in list(self.buffers):
            self.release(b)

    def fetch(self, b: int, in_backward: bool) -> torch.Tensor:
        """Bucket b gathered, waited for and its parameters pointing at it (the program needs it now)."""
        if b in self.held:  # the use it was kept for
            self.held.discard(b)
            self.reuses += 1
            self._follow(b, in_backward)
        elif b not in self.ready:
            if b not in self.buffers:
                self._make_room(b)
                self._gather(b, prefetch=False)
            self._handles.pop(b).wait()
            self.point(b, self.buffers[b])
            self.ready.add(b)
            self._follow(b, in_backward)
        return self.buffers[b]

    def done(self, b: int) -> None:
        """The program is done with bucket b for now: release it, or hold it for its next use (reuse)."""
        if self.reuse_bytes and self._distance(b) < self.reuse_bytes:
            self.held.add(b)
        else:
            self.release(b)

    def _distance(self, b: int) -> float:
        """Bytes of other buckets the recorded order gathers before b's next use (inf: none comes);
        those pointed at now (in use or held) count nothing: they will not be gathered again."""
        if not self._recorded or self._cursor is None:
            return float("inf")
        between = 0
        for a, _ in self.order[self._cursor :]:
            if a == b:
                return between
            between += 0 if a in self.ready else self.sizes[a]
        return float("inf")

    def release(self, b: int) -> None:
        handle = self._handles.pop(b, None)
        if handle is not None:  # a prefetch nobody used may still be arriving
            handle.wait()
        buf = self.buffers.pop(b)
        self.ready.discard(b)
        self.held.discard(b)
        self.live_bytes -= self.sizes[b]
        self.point(b, None)
        self.pool.give(buf)

    def _gather(self, b: int, prefetch: bool) -> None:
        buf = self.pool.take(self.layout.buckets[b].padded)
        self.live_bytes += self.sizes[b]
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        self.buffers[b] = buf
        self._handles[b] = self.comms.all_gather(buf, self.shards[b], self.dp, async_op=prefetch)
        self.gathers += 1
        self.prefetches += prefetch

    def _make_room(self, b: int) -> None:
        if self.live_bytes + self.sizes[b] > self.max_live_bytes:  # drop prefetches not followed, and held buckets
            for spare in [a for a in self.buffers if a not in self.ready or a in self.held]:
                self.release(spare)
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
        ahead = sum(self.sizes[a] for a in self.buffers if a not in self.ready)
        for b, _ in self.order[self._cursor :]:
            if b in self.buffers:  # on its way, in use or held: its next use needs no gather
                continue
            n = self.sizes[b]
            if ahead + n > self.prefetch_bytes or self.live_bytes + n > self.max_live_bytes:
                break
            self._gather(b, prefetch=True)
            ahead += n
