"""Flat buffers and the shard layout of ZeRO-DP (paper §5).

All parameters live in one flat buffer, cut into buckets of whole parameters (the paper's
constant-size fused buffers, C_B, §6.2). Each bucket is padded to a multiple of N_d and split into
N_d equal chunks; DP rank r owns chunk r of every bucket. So a bucket's gradients are reduced with
one reduce-scatter of equal chunks and its parameters rebuilt with one all-gather, and a rank's
shard — the concatenation of its chunks — holds Ψ/N_d elements plus at most N_d − 1 per bucket.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # the layout itself needs no torch: the performance model reads it too
    import torch


MAX_IN_FLIGHT = 2  # buckets whose reduction may be outstanding at once (stages 2 and 3)


class Slot(NamedTuple):
    """Where one parameter sits in the flat buffer. A named tuple, not a frozen dataclass: a
    layout of a deep model has thousands, made many times over by the performance model."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int
    bucket: int


@dataclass(frozen=True)
class Bucket:
    index: int
    start: int  # flat offset of the bucket
    numel: int  # elements of real parameters
    padded: int  # numel rounded up to a multiple of N_d
    chunk: int  # padded / N_d: the part each rank owns
    shard_start: int  # where this rank's chunk sits in the rank's contiguous shard
    slots: tuple[int, ...]  # indices of the parameters in the bucket

    def owned(self, rank: int) -> tuple[int, int]:
        """Flat [start, end) of `rank`'s chunk."""
        lo = self.start + rank * self.chunk
        return lo, lo + self.chunk


class FlatLayout:
    """Parameter slots and buckets for `nd` data-parallel ranks.

    `groups` fixes the buckets explicitly (lists of parameter indices, in order); otherwise
    parameters are packed greedily, in order, into buckets of at most `bucket_numel` elements
    (a single larger parameter gets a bucket of its own).
    """

    def __init__(
        self,
        named_shapes: list[tuple[str, tuple[int, ...]]],
        nd: int,
        bucket_numel: int | None = None,
        groups: list[list[int]] | None = None,
    ):
        if nd < 1:
            raise ValueError(f"nd={nd}: must be >= 1")
        numels = [_numel(shape) for _, shape in named_shapes]
        if groups is None:
            if not bucket_numel or bucket_numel < 1:
                raise ValueError(f"bucket_numel={bucket_numel}: must be >= 1 when groups are not given")
            groups = _pack(numels, bucket_numel)
        if sorted(i for g in groups for i in g) != list(range(len(named_shapes))):
            raise ValueError("groups must cover every parameter exactly once")
        self.nd = nd
        slots: list[Slot | None] = [None] * len(named_shapes)
        buckets = []
        offset = shard = 0
        for b, group in enumerate(groups):
            start = offset
            for i in group:
                name, shape = named_shapes[i]
                slots[i] = Slot(name, tuple(shape), offset, numels[i], b)
                offset += numels[i]
            numel = offset - start
            padded = -(-numel // nd) * nd
            offset = start + padded
            buckets.append(Bucket(b, start, numel, padded, padded // nd, shard, tuple(group)))
            shard += padded // nd
        self.slots: list[Slot] = slots
        self.buckets: list[Bucket] = buckets
        self.numel = sum(numels)  # Ψ
        self.padded_numel = offset  # Ψ plus padding
        self.shard_numel = shard  # elements each rank owns

    def __repr__(self) -> str:
        return (
            f"FlatLayout(params={len(self.slots)}, buckets={len(self.buckets)}, nd={self.nd}, "
            f"numel={self.numel}, padded={self.padded_numel}, shard={self.shard_numel})"
        )


def intersect(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    """The [lo, hi) two half-open ranges share, or None when they share nothing."""
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo < hi else None


def overlaps(slots: list[Slot], pieces: list[tuple[int, int]]) -> Iterator[tuple[int, int, int, int]]:
    """(piece i, slot j, lo, hi) for every flat range [lo, hi) where `pieces[i]` meets parameter
    slot j, piece by piece and, within a piece, in flat order. Slots are found by bisection, so a
    piece costs the slots it meets, not all of them (stage 3 at N_d = 400 has ~10^3 of each)."""
    order = sorted(range(len(slots)), key=lambda j: slots[j].offset)
    ends = [slots[j].offset + slots[j].numel for j in order]
    for i, piece in enumerate(pieces):
        for k in range(bisect_right(ends, piece[0]), len(order)):
            slot = slots[order[k]]
            if slot.offset >= piece[1]:
                break
            common = intersect(piece, (slot.offset, slot.offset + slot.numel))
            if common is not None:  # an empty slot meets nothing
                yield i, order[k], *common


def counted_ranges(slots: list[Slot], owned: list[tuple[int, int]], params: list[torch.Tensor], mp_rank: int):
    """For the global gradient norm across MP ranks: the ranges of each owned flat piece this rank
    counts — everything on MP rank 0, elsewhere only parameters MP splits (they carry the
    `mp_split` attribute that tensor parallelism sets), so replicated ones count once in total.
    (piece index, lo, hi) triples, relative to the piece; `slots` in `params` order."""
    return [
        (i, lo - owned[i][0], hi - owned[i][0])
        for i, j, lo, hi in overlaps(slots, owned)
        if mp_rank == 0 or getattr(params[j], "mp_split", None) is not None
    ]


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _pack(numels: list[int], limit: int) -> list[list[int]]:
    groups: list[list[int]] = [[]]
    size = 0
    for i, n in enumerate(numels):
        if groups[-1] and size + n > limit:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += n
    return groups
