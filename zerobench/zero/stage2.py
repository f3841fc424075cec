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

from zerobench.comms import Comms, Handle
from zerobench.parallel.topology import Group
from zerobench.zero.core import ZeroEngine, gather_updated, packed_layout, place_flat
from zerobench.zero.partition import Bucket, FlatLayout, Slot

MAX_IN_FLIGHT = 2  # buckets whose reduce-scatter may be outstanding at once


class PartitionedGradients:
    """This rank's gradient chunk of every bucket (`shard`, split into `pieces`), filled by
    reduce-scattering each bucket's staged gradients on every micro-batch (stages 2 and 3)."""

    def __init__(self, layout: FlatLayout, dp: Group, comms: Comms, dtype, device):
        self.layout, self.dp, self.comms, self.dtype, self.device = layout, dp, comms, dtype, device
        self.shard = torch.zeros(layout.shard_numel, dtype=dtype, device=device)
        self.pieces = list(self.shard.split([b.chunk for b in layout.buckets]))
        self.staging: dict[int, torch.Tensor] = {}  # bucket -> its gradients, until reduced

    def take(self, slot: Slot, grad: torch.Tensor) -> None:
        bucket = self.layout.buckets[slot.bucket]
        staging = self.staging.get(bucket.index)
        if staging is None:
            staging = self.staging[bucket.index] = torch.zeros(bucket.padded, dtype=self.dtype, device=self.device)
        lo = slot.offset - bucket.start
        staging[lo : lo + slot.numel].copy_(grad)

    def reduce(self, bucket: Bucket) -> tuple[Handle, object]:
        """Start the bucket's reduce-scatter; returns its handle and what to run once it is done
        (the average added into this rank's chunk). The staging buffer is freed with the handle."""
        out = torch.empty(bucket.chunk, dtype=self.dtype, device=self.device)
        handle = self.comms.reduce_scatter(out, self.staging.pop(bucket.index), self.dp, async_op=True)
        dst, n = self.pieces[bucket.index], self.dp.size
        return handle, lambda: dst.add_(out.div_(n))


class Stage2(ZeroEngine):
    stage = 2

    def __init__(self, model, ctx, parallel, precision, train, comms):
        super().__init__(model, ctx, parallel, precision, train, comms)
        layout = packed_layout(self.named, ctx.dp.size, parallel.bucket_bytes, self.dtype)
        self.flat_param = place_flat(self.params, layout, self.dtype, self.device)
        self.grads = PartitionedGradients(layout, ctx.dp, comms, self.dtype, self.device)
        owned = [b.owned(ctx.dp.rank) for b in layout.buckets]
        pieces = [self.flat_param[lo:hi] for lo, hi in owned]
        self._attach(layout, owned, pieces, self.grads.pieces, partitioned=True)

    def backward(self, loss: torch.Tensor, last_micro_batch: bool = True) -> None:
        self._backward(loss, reduce=True)

    def _take(self, slot, grad: torch.Tensor) -> None:
        self.grads.take(slot, grad)

    def _reduce(self, bucket) -> None:
        self._drain(MAX_IN_FLIGHT - 1)
        self._in_flight.append(self.grads.reduce(bucket))

    def step(self) -> bool:
        ok = self._update()
        self.grads.shard.zero_()  # the next step's micro-batches accumulate into it again
        return ok

    def _send(self, i: int) -> Handle:
        return gather_updated(self.comms, self.flat_param, self.layout.buckets[i], self.ctx.dp)

    def transient_states(self):
        return [(t, "grad") for t in self.grads.staging.values()]
