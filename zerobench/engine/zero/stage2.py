"""Stage 2, P_os+g: optimizer states and gradients partitioned (paper §5.2, communication §7.2.1).

Keeps: every parameter; the gradients, fp32 master weights and Adam moments of this rank's chunk of
each bucket ((2 + K)Ψ/N_d bytes beside the 2Ψ of parameters). Frees: each bucket's gradients as soon
as they are reduced. Backward copies a bucket's gradients into a staging buffer of the bucket's size
(C_B, §6.2); once the bucket is complete it is reduce-scattered, asynchronously, its sum added into
this rank's gradient chunk, and the staging buffer freed. At most `MAX_IN_FLIGHT` buckets are in
flight, so staging memory is a constant number of C_B buffers. This happens on every micro-batch —
there is no full gradient buffer to accumulate into — so m micro-batches cost (m + 1)Ψ(N_d−1)/N_d
per step and rank: m reduce-scatters, then one all-gather of the updated chunks after Adam, as at
stage 1. With m = 1, the paper's 2Ψ.
"""

from __future__ import annotations

import torch

from zerobench.engine.parallel.comms import Comms, Handle
from zerobench.engine.parallel.topology import Group
from zerobench.engine.zero.buffers import BufferPool
from zerobench.engine.zero.core import ZeroEngine
from zerobench.engine.zero.partition import MAX_IN_FLIGHT, Bucket, FlatLayout, Slot


class PartitionedGradients:
    """This rank's gradient chunk of every bucket (`shard`, split into `pieces`), filled by
    reduce-scattering each bucket's staged gradients on every micro-batch (stages 2 and 3). The
    first micro-batch of a step (`fresh`) reduce-scatters straight into the chunk, overwriting last
    step's values; later ones into a buffer that is then added to it. On one DP rank the chunk is
    the whole bucket and nothing is reduced (core's `_backward`): each gradient goes straight into
    its place (`direct`), with no staging buffer."""

    def __init__(self, layout: FlatLayout, dp: Group, comms: Comms, pool: BufferPool):
        self.layout, self.dp, self.comms, self.pool = layout, dp, comms, pool
        self.shard = torch.zeros(layout.shard_numel, dtype=pool.dtype, device=pool.device)
        self.pieces = list(self.shard.split([b.chunk for b in layout.buckets]))
        self.staging: dict[int, torch.Tensor] = {}  # bucket -> its gradients, until reduced
        self.fresh = True
        self.direct = dp.size == 1

    def take(self, slot: Slot, grad: torch.Tensor) -> None:
        bucket = self.layout.buckets[slot.bucket]
        if self.direct:
            lo = slot.offset - bucket.start
            piece = self.pieces[bucket.index][lo : lo + slot.numel]
            piece.copy_(grad) if self.fresh else piece.add_(grad)
            return
        staging = self.staging.get(bucket.index)
        if staging is None:  # the parameters fill [0, numel) of it; only the padding is zeroed
            staging = self.staging[bucket.index] = self.pool.take(bucket.padded)
            if bucket.padded > bucket.numel:
                staging[bucket.numel :].zero_()
        lo = slot.offset - bucket.start
        staging[lo : lo + slot.numel].copy_(grad)

    def reduce(self, bucket: Bucket) -> tuple[Handle, object]:
        """Start the bucket's reduce-scatter; returns its handle and what to run once it is done
        (add the sum in, unless it went straight there; hand the buffers back to the pool)."""
        dst, fresh, staging = self.pieces[bucket.index], self.fresh, self.staging.pop(bucket.index)
        out = dst if fresh else self.pool.take(bucket.chunk)
        handle = self.comms.reduce_scatter(out, staging, self.dp, async_op=True)

        def finish() -> None:
            if not fresh:
                dst.add_(out)
                self.pool.give(out)
            self.pool.give(staging)

        return handle, finish


class Stage2(ZeroEngine):
    stage = 2

    def __init__(self, model, ctx, parallel, precision, train, comms, device=None, values=None):
        super().__init__(model, ctx, parallel, precision, train, comms, device, values)
        layout = self._flat()
        owned = [b.owned(ctx.dp.rank) for b in layout.buckets]
        grads = PartitionedGradients(layout, ctx.dp, comms, self.pool)
        self._attach(layout, owned, [self.flat_param[lo:hi] for lo, hi in owned], grads, partitioned=True)

    def backward(self, loss: torch.Tensor, last_micro_batch: bool = True) -> None:
        self._backward(loss, reduce=True, last_micro_batch=last_micro_batch)

    def _reduce(self, bucket) -> None:
        self._drain(MAX_IN_FLIGHT - 1)
        self._start(bucket, *self.grads.reduce(bucket))

    def transient_states(self):
        return [(t, "grad") for t in self.grads.staging.values()]
