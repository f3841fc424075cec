"""Stage 0: plain data parallelism, the baseline ZeRO is measured against (paper §7.2.1).

Keeps: every parameter, gradient and optimizer state, whole, on every rank ((2 + 2 + K)Ψ bytes in
mixed precision). Frees: nothing. Communicates: each bucket's gradients are all-reduced as soon as
backward has completed them (asynchronously, overlapping the rest of backward and, with no clipping
or loss scaling, the step's Adam on the buckets already reduced: core.py), once per step: with
m micro-batches of accumulation, the first m − 1 only add into the gradient buffer. 2Ψ(N_d−1)/N_d
elements per step and rank. Every rank then runs the same Adam on everything: nothing is sent after
the step.
"""

from __future__ import annotations

import torch

from zerobench.engine.zero.core import FullGradients, ZeroEngine


class Stage0(ZeroEngine):
    stage = 0

    def __init__(self, model, ctx, parallel, precision, train, comms, device=None, values=None):
        super().__init__(model, ctx, parallel, precision, train, comms, device, values)
        layout = self._flat()
        owned = [(b.start, b.start + b.padded) for b in layout.buckets]  # every bucket, whole
        pieces = [self.flat_param[lo:hi] for lo, hi in owned]
        self._attach(layout, owned, pieces, FullGradients(layout, owned, self.dtype, self.device), partitioned=False)

    def backward(self, loss: torch.Tensor, last_micro_batch: bool = True) -> None:
        self._backward(loss, reduce=last_micro_batch, last_micro_batch=last_micro_batch)

    def _reduce(self, bucket) -> None:
        handle = self.comms.all_reduce(self.grads.of(bucket), self.ctx.dp, async_op=True)
        self._start(bucket, handle)
