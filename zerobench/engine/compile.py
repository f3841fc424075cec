"""torch.compile per transformer block, as torchtitan compiles each block under FSDP2: the block's
compute becomes one or a few fused graphs, while everything ZeRO does around it stays eager.

`apply_compile` compiles each block's `forward` before activation checkpointing wraps it
(zerobench/engine/zero/activations.py), so a checkpoint boundary is never inside a graph: the
checkpoint's forward and its recomputation both call the compiled compute. The engine's own
machinery stays outside the graphs: stage 3 gathers and releases a compiled block's buckets in
hooks on the block itself (zerobench/engine/zero/stage3.py), which run before and after its
compiled forward, not on the modules inside it; the gradient hooks fire on leaf parameters, after
autograd has left any compiled backward. Stage 3's saved-weight tokens still apply: a graph saves
its parameter inputs, which are packed as at any other time, but a weight cast inside a graph (a
16-bit model computing in fp32, on CPU) is a graph output and is kept from forward to backward.

`BACKEND` is the compiler: inductor generates the fused kernels (Triton on a GPU, C++ on a CPU).
"""

from __future__ import annotations

import torch
from torch import nn

BACKEND = "inductor"


def apply_compile(model: nn.Module) -> nn.Module:
    """Compile the compute of every block of `model` (its `blocks`) in place; returns `model`.
    Parameter names and the module tree are unchanged: only each block's forward is replaced."""
    for block in model.blocks:
        block.forward = torch.compile(block.forward, backend=BACKEND)
    model.compiled_blocks = True  # a mark: checkpointing wraps the compiled forwards again
    return model


def compiled(model: nn.Module) -> bool:
    """Whether `apply_compile` compiled `model`'s blocks."""
    return getattr(model, "compiled_blocks", False)
