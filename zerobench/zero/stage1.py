"""Stage 1, P_os: optimizer states partitioned (paper §5.1, communication §7.2.1).

Keeps: every parameter and a full gradient buffer; the fp32 master weights and Adam moments of this
rank's chunk of each bucket only (K·Ψ/N_d bytes). Frees: the other N_d − 1 chunks of optimizer
state, never allocated. Communicates: once per step, on the last micro-batch, each bucket's
gradients are reduce-scattered as soon as backward has completed them (the earlier micro-batches
add into the full buffer); each rank steps Adam on its chunk, and each updated chunk is all-gathered
into every rank's parameters while Adam works on the next. Ψ(N_d−1)/N_d elements each way per step
and rank: the same 2Ψ as stage 0. The reduce-scatter outputs (C_B/N_d each) add at most Ψ/N_d
elements while in flight; backward never waits on them.
"""

from __future__ import annotations

import torch

from zerobench.comms import Handle
from zerobench.zero.core import FullGradients, ZeroEngine, gather_updated, packed_layout, place_flat


class Stage1(ZeroEngine):
    stage = 1

    def __init__(self, model, ctx, parallel, precision, train, comms):
        super().__init__(model, ctx, parallel, precision, train, comms)
        layout = packed_layout(self.named, ctx.dp.size, parallel.bucket_bytes, self.dtype)
        self.flat_param = place_flat(self.params, layout, self.dtype, self.device)
        self.grads = FullGradients(layout, self.dtype, self.device)
        owned = [b.owned(ctx.dp.rank) for b in layout.buckets]
        pieces = [self.flat_param[lo:hi] for lo, hi in owned]
        self._attach(layout, owned, pieces, [self.grads.flat[lo:hi] for lo, hi in owned], partitioned=True)

    def backward(self, loss: torch.Tensor, last_micro_batch: bool = True) -> None:
        self._backward(loss, reduce=last_micro_batch)
        self.grads.fresh = False

    def _take(self, slot, grad: torch.Tensor) -> None:
        self.grads.take(slot, grad)

    def _reduce(self, bucket) -> None:
        dp = self.ctx.dp
        dst = self.grad_pieces[bucket.index]  # this rank's chunk of the full buffer
        out = torch.empty(bucket.chunk, dtype=self.dtype, device=self.device)
        handle = self.comms.reduce_scatter(out, self.grads.of(bucket), dp, async_op=True)
        self._in_flight.append((handle, lambda: dst.copy_(out.div_(dp.size))))

    def step(self) -> bool:
        ok = self._update()
        self.grads.fresh = True
        return ok

    def _send(self, i: int) -> Handle:
        return gather_updated(self.comms, self.flat_param, self.layout.buckets[i], self.ctx.dp)
