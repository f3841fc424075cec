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

from zerobench.engine.zero.core import FullGradients, ZeroEngine


class Stage1(ZeroEngine):
    stage = 1

    def __init__(self, model, ctx, parallel, precision, train, comms, device=None, values=None):
        super().__init__(model, ctx, parallel, precision, train, comms, device, values)
        layout = self._flat()
        owned = [b.owned(ctx.dp.rank) for b in layout.buckets]  # this rank's chunk of each bucket
        pieces = [self.flat_param[lo:hi] for lo, hi in owned]
        self._attach(layout, owned, pieces, FullGradients(layout, owned, self.dtype, self.device), partitioned=True)

    def backward(self, loss: torch.Tensor, last_micro_batch: bool = True) -> None:
        self._backward(loss, reduce=last_micro_batch, last_micro_batch=last_micro_batch)

    def _reduce(self, bucket) -> None:
        # The sum can't land in this rank's chunk of the full buffer directly: that chunk is also
        # this rank's input to it.
        dst, out = self.grad_pieces[bucket.index], self.pool.take(bucket.chunk)
        handle = self.comms.reduce_scatter(out, self.grads.of(bucket), self.ctx.dp, async_op=True)
        self._start(bucket, handle, lambda: (dst.copy_(out), self.pool.give(out)))
