"""FLOPs of one training step under one declared convention.

Convention (Megatron-LM / DeepSpeed family, the most likely one behind the paper's TFLOPS;
paper.md §6 flags it as an assumption): per sequence of s tokens through L layers of width h with
vocabulary V, a forward pass costs 24·s·L·h²·(1 + s/(6h)) + 2·s·h·V multiply-adds×2, and a step
costs 3× that (forward + backward at 2× forward), or 4× with activation recomputation. For a
global batch B that is

    96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))   with recomputation
    72·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))   without.
"""

from __future__ import annotations

from typing import Protocol


class ModelShape(Protocol):
    """What the convention reads of a model (engine/config.ModelConfig has it)."""

    seq: int
    hidden: int
    layers: int
    vocab: int


def forward_flops_per_sequence(model: ModelShape) -> float:
    """FLOPs of one forward pass over one sequence (2 FLOPs per multiply-add)."""
    s, h, L, V = model.seq, model.hidden, model.layers, model.vocab
    return 24.0 * s * L * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * L * h))


def step_flops(model: ModelShape, global_batch: int, recompute: bool) -> float:
    """FLOPs of one optimizer step over `global_batch` sequences, across all GPUs."""
    passes = 4.0 if recompute else 3.0  # fwd + bwd(2x) [+ recomputed fwd]
    return passes * forward_flops_per_sequence(model) * global_batch
