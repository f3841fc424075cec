"""Stage 0: plain data parallelism, the baseline ZeRO is measured against (paper §7.2.1).

Keeps: every parameter, gradient and optimizer state, whole, on every rank ((2 + 2 + K)Ψ bytes in
mixed precision). Frees: nothing. Communicates: each bucket's gradients are all-reduced as soon as
backward has completed them (asynchronously, overlapping the rest of backward), once per step: with
m micro-batches of accumulation, the first m − 1 only add into the gradient buffer. 2Ψ(N_d−1)/N_d
elements per step and rank. Every rank then runs the same Adam on everything: nothing is sent after
the step.
"""

from __future__ import annotations

import torch

from zerobench.zero.core import FullGradients, ZeroEngine, packed_layout, place_flat


class Stage0(ZeroEngine):
    stage = 0

    def __init__(self, model, ctx, parallel, precision, train, comms):
        super().__init__(model, ctx, parallel, precision, train, comms)
        layout = packed_layout(self.named, ctx.dp.size, parallel.bucket_bytes, self.dtype)
        self.flat_param = place_flat(self.params, layout, self.dtype, self.device)
        self.grads = FullGradients(layout, self.dtype, self.device)
        owned = [(b.start, b.start + b.padded) for b in layout.buckets]  # every bucket, whole
        pieces = [self.flat_param[lo:hi] for lo, hi in owned]
        self._attach(layout, owned, pieces, [self.grads.flat[lo:hi] for lo, hi in owned], partitioned=False)

    def backward(self, loss: torch.Tensor, last_micro_batch: bool = True) -> None:
        self._backward(loss, reduce=last_micro_batch)
        self.grads.fresh = False

    def _take(self, slot, grad: torch.Tensor) -> None:
        self.grads.take(slot, grad)

    def _reduce(self, bucket) -> None:
        buf, dp = self.grads.of(bucket), self.ctx.dp
        handle = self.comms.all_reduce(buf, dp, async_op=True)
        self._in_flight.append((handle, lambda: buf.div_(dp.size)))

    def step(self) -> bool:
        """Adam on every bucket, the same on every rank."""
        ok = self._update()
        self.grads.fresh = True
        return ok
