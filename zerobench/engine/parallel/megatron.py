"""Megatron's split of the plain GPT (paper §4.3; Shoeybi et al.): `apply_tensor_parallel` turns
each block's linears into column- and row-parallel ones and the tied embedding into a
vocab-parallel one, over an MP group passed in (zerobench/engine/parallel/tensor_parallel.py has the
layers and operators)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zerobench.engine.model import GPT
from zerobench.engine.parallel.comms import Comms
from zerobench.engine.parallel.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallel,
    VocabShard,
    copy_to_mp,
    mark_split,
    split_of,
    vocab_parallel_cross_entropy,
    vocab_parallel_embedding,
)
from zerobench.engine.parallel.topology import Group


class VocabParallel(nn.Module):
    """The tied embedding split by vocabulary rows: lookup and loss without gathering the matrix
    (the plain model's `TiedVocab`, split)."""

    def __init__(self, shard: VocabShard, tp: TensorParallel):
        super().__init__()
        self.shard, self.tp = shard, tp

    def embed(self, idx: torch.Tensor, wte: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_embedding(idx, wte, self.shard, self.tp)

    def loss(self, x: torch.Tensor, wte: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = F.linear(copy_to_mp(x, self.tp), wte)  # this rank's vocabulary columns
        return vocab_parallel_cross_entropy(logits, targets, self.shard, self.tp)


# Megatron's plan for a block: which linears split by output features (column, with the number of
# stacked blocks) and which by input features (row).
_COLUMN = {"attn.qkv": 3, "mlp.fc": 1}
_ROW = ("attn.proj", "mlp.proj")


def apply_tensor_parallel(model: GPT, mp_group: Group, comms: Comms) -> GPT:
    """Split the plain `model` in place over `mp_group` (Megatron, paper §4.3): each block's
    linears become column- or row-parallel, the tied embedding keeps this rank's vocabulary rows,
    and every MP collective is counted in `comms`. Call it on the meta device, before the engine
    allocates and initializes (nothing full is ever allocated); with one MP rank the model is left
    as it is."""
    if mp_group.size == 1:
        return model
    tp = TensorParallel(mp_group, comms)
    for block in model.blocks:
        with torch.device(block.ln1.weight.device):
            for path, parts in _COLUMN.items():
                old = block.get_submodule(path)
                block.set_submodule(path, ColumnParallelLinear(old.weight.shape[1], old.weight.shape[0], tp, parts))
            for path in _ROW:
                old = block.get_submodule(path)
                block.set_submodule(path, RowParallelLinear(old.weight.shape[1], old.weight.shape[0], tp))
    shard = VocabShard.of(model.cfg.vocab, tp)
    wte = nn.Parameter(model.wte.new_empty(shard.rows, model.cfg.hidden))
    model.wte = mark_split(wte, split_of(tp, 0, model.cfg.vocab))
    model.vocab = VocabParallel(shard, tp)
    return model
