"""`train_step`: one optimizer step of the engine over this rank's own slice of the step's
sequences: `grad_accum` micro-batches of `micro_batch` sequences each (TrainConfig), each a
forward and a backward whose gradients accumulate in the engine's buffers, the last one's
reductions started as its buckets complete, then the step on the pieces this rank owns (paper §5:
ZeRO-DP trains as data parallelism does, on the same N_d · grad_accum · micro_batch sequences).

The slice is a tensor of token ids, (grad_accum, micro_batch, s + 1): micro-batch i trains on
`batch[i]`, its inputs the first s tokens of each sequence and its targets the last s
(`shifted`). No rank holds sequences it does not train on: the harness draws only this rank's
(runtime/train.py `rank_batch`).

`Watch` marks the moments of a step where the memory it makes changes kind (the trace's counter
files each new storage under the moment it was made in: runtime/trace.py)."""

from __future__ import annotations

import torch

from zerobench.engine.zero.core import ZeroEngine


class Watch:
    """What a caller sees of a step: this one marks nothing and reads each micro-batch's loss."""

    def forward(self) -> None:
        """Before a micro-batch's forward."""

    def backward(self) -> None:
        """After a micro-batch's forward, before its backward."""

    def loss(self, loss: torch.Tensor) -> float:
        """The value of a micro-batch's loss, read after its backward (a wait for the device)."""
        return loss.item()


PLAIN = Watch()


def shifted(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of sequences of s + 1 token ids: the first s of each, and the last s."""
    return tokens[..., :-1], tokens[..., 1:]


def train_step(engine: ZeroEngine, batch: torch.Tensor, watch: Watch = PLAIN) -> float:
    """One optimizer step over `batch`, this rank's (grad_accum, micro_batch, s + 1) token ids on
    the engine's device; returns the mean of its micro-batches' losses (each the mean cross-entropy
    per token, in nats, as `watch` reads it)."""
    accum, micro = engine.train.grad_accum, engine.train.micro_batch
    if batch.shape[:2] != (accum, micro):
        raise ValueError(
            f"batch: shape {tuple(batch.shape)}, not grad_accum={accum} micro-batches of micro_batch={micro}"
        )
    total = 0.0
    for i in range(accum):
        watch.forward()
        loss = engine.model(*shifted(batch[i]))
        watch.backward()
        engine.backward(loss, last_micro_batch=i == accum - 1)
        total += watch.loss(loss)
        del loss  # before the next micro-batch's forward: its graph is gone, its scalar too
    engine.step()
    return total / accum
