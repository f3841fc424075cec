"""A GPT-2 style decoder (pre-LN, learned positions, tied embeddings, 4h GELU MLP).

Weights are stored in the precision policy's storage dtype and cast to its compute dtype at use,
so on CPU a 16-bit model holds 2 bytes per weight while its matmuls run in fp32 (paper §3.1's
mixed-precision layout, measurable where 16-bit matmul is slow). Activation checkpointing keeps
one checkpoint per block, the block input (paper §3.2), in a `CheckpointStore` (ZeRO-R's P_a,
P_a+cpu and M_D live there, zerobench/zero/activations.py).

Built with a `TensorParallel` context (`tp`), the model is Megatron's: QKV and the first MLP
linear column-parallel, the attention output and second MLP linear row-parallel, the heads split
across the MP ranks, the tied embedding vocab-parallel (zerobench/parallel/tensor_parallel.py).
Without one it is the single-process model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from zerobench.config import ModelConfig
from zerobench.zero.activations import CheckpointStore, checkpoint


class _Cast(nn.Module):
    """Base for modules whose weights are cast to the compute dtype when used."""

    compute_dtype: torch.dtype = torch.float32

    def w(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.dtype == self.compute_dtype else t.to(self.compute_dtype)


class Linear(_Cast):
    def __init__(self, fan_in: int, fan_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(fan_out, fan_in))
        self.bias = nn.Parameter(torch.zeros(fan_out))

    def forward(self, x):
        return F.linear(x, self.w(self.weight), self.w(self.bias))


class LayerNorm(_Cast):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.w(self.weight), self.w(self.bias), eps=1e-5)


def _tp():
    # imported late: the MP layers are built on Linear above
    from zerobench.parallel import tensor_parallel

    return tensor_parallel


def _column(fan_in: int, fan_out: int, tp, parts: int = 1) -> Linear:
    return Linear(fan_in, fan_out) if tp is None else _tp().ColumnParallelLinear(fan_in, fan_out, tp, parts)


def _row(fan_in: int, fan_out: int, tp) -> Linear:
    return Linear(fan_in, fan_out) if tp is None else _tp().RowParallelLinear(fan_in, fan_out, tp)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, tp=None):
        super().__init__()
        self.heads = cfg.heads // (1 if tp is None else tp.size)  # heads on this rank
        self.qkv = _column(cfg.hidden, 3 * cfg.hidden, tp, parts=3)
        self.proj = _row(cfg.hidden, cfg.hidden, tp)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        h = q.shape[-1]  # this rank's share of the hidden size
        # (b, s, h) -> (b, heads, s, head_dim)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp=None):
        super().__init__()
        self.fc = _column(cfg.hidden, 4 * cfg.hidden, tp)
        self.proj = _row(4 * cfg.hidden, cfg.hidden, tp)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, tp=None):
        super().__init__()
        self.ln1 = LayerNorm(cfg.hidden)
        self.attn = Attention(cfg, tp)
        self.ln2 = LayerNorm(cfg.hidden)
        self.mlp = MLP(cfg, tp)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(_Cast):
    """`tp`: a TensorParallel context to split the model over (None: the single-process model).
    `checkpoints`: where the block checkpoints go (default: kept whole, on the device)."""

    def __init__(
        self,
        cfg: ModelConfig,
        checkpoint_activations: bool = False,
        tp=None,
        checkpoints: CheckpointStore | None = None,
    ):
        super().__init__()
        self.cfg, self.tp = cfg, tp
        self.checkpoint_activations = checkpoint_activations
        if checkpoint_activations and checkpoints is None:
            checkpoints = CheckpointStore(cfg.layers)
        self.checkpoints = checkpoints
        # tied with the output layer; with MP each rank holds its rows of the padded vocabulary
        self.vocab_shard = None if tp is None else _tp().VocabShard.of(cfg.vocab, tp)
        rows = cfg.vocab if tp is None else self.vocab_shard.rows
        self.wte = nn.Parameter(torch.empty(rows, cfg.hidden))
        if tp is not None:
            _tp().mark_split(self.wte, _tp().Split(0, cfg.vocab))
        self.wpe = nn.Parameter(torch.empty(cfg.seq, cfg.hidden))
        self.blocks = nn.ModuleList(Block(cfg, tp) for _ in range(cfg.layers))
        self.ln_f = LayerNorm(cfg.hidden)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """GPT-2 init from a seeded generator on the weights' device, so every rank builds the
        same weights (and a GPU builds a large model without a trip through host memory). An MP
        rank draws each full tensor, as the single-process model does, and keeps its slice."""
        gen = torch.Generator(device=self.wte.device).manual_seed(seed)
        std = 0.02
        residual_std = std / math.sqrt(2 * self.cfg.layers)  # GPT-2: scale residual projections
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif "ln" in name:
                p.fill_(1.0)
            else:
                s = residual_std if name.endswith("proj.weight") else std
                split = getattr(p, "mp_split", None)
                shape = p.shape if split is None else split.full_shape(p.shape)
                full = torch.randn(shape, generator=gen, device=gen.device) * s
                p.copy_(full if split is None else split.local(full, self.tp.rank, self.tp.size))

    def set_dtypes(self, storage: torch.dtype, compute: torch.dtype) -> GPT:
        self.to(storage)
        for m in self.modules():
            if isinstance(m, _Cast):
                m.compute_dtype = compute
        return self

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy over the micro-batch."""
        s = idx.shape[1]
        wte, tp = self.w(self.wte), self.tp
        x = F.embedding(idx, wte) if tp is None else _tp().vocab_parallel_embedding(idx, wte, self.vocab_shard, tp)
        x = x + self.w(self.wpe)[:s]
        for i, block in enumerate(self.blocks):
            if self.checkpoint_activations and torch.is_grad_enabled():
                x = checkpoint(block, x, self.checkpoints, i)
            else:
                x = block(x)
        if tp is None:
            logits = F.linear(self.ln_f(x), wte)
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
        logits = F.linear(_tp().copy_to_mp(self.ln_f(x), tp), wte)  # this rank's vocabulary columns
        return _tp().vocab_parallel_cross_entropy(logits, targets, self.vocab_shard, tp)
