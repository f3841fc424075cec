"""A GPT-2 style decoder (pre-LN, learned positions, tied embeddings, 4h GELU MLP): the plain,
single-process model. It knows neither ZeRO nor tensor parallelism; functions that build the
trained thing transform it: `parallel.tensor_parallel.apply_tensor_parallel` (Megatron MP),
`zero.activations.apply_activation_checkpointing` (ZeRO-R) and `zero.apply_zero` (ZeRO-DP).

Weights are stored in the precision policy's storage dtype and cast to its compute dtype at use,
so on CPU a 16-bit model holds 2 bytes per weight while its matmuls run in fp32 (paper §3.1's
mixed-precision layout, measurable where 16-bit matmul is slow).

A parameter may be one rank's slice of the single-process tensor (after a split): it then carries
`mp_split`, an object with `full_shape(local_shape)` and `local(full)`, and `initial_values` draws
the whole tensor and yields its slice, so every layout starts from the single-process weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:  # the shape only; at run time the model imports nothing of zerobench
    from zerobench.engine.config import ModelConfig


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


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.hidden // cfg.heads
        self.qkv = Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = Linear(cfg.hidden, cfg.hidden)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        h = q.shape[-1]  # the hidden size this layer computes (a share of it when split by heads)
        # (b, s, h) -> (b, heads, s, head_dim)
        q, k, v = (t.view(b, s, h // self.head_dim, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = Linear(cfg.hidden, 4 * cfg.hidden)
        self.proj = Linear(4 * cfg.hidden, cfg.hidden)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = LayerNorm(cfg.hidden)
        self.attn = Attention(cfg)
        self.ln2 = LayerNorm(cfg.hidden)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TiedVocab(nn.Module):
    """The token embedding lookup and the output layer's loss, both on the tied embedding matrix
    (no parameters of its own: the GPT holds `wte`). A split model swaps in its own."""

    def embed(self, idx: torch.Tensor, wte: torch.Tensor) -> torch.Tensor:
        return F.embedding(idx, wte)

    def loss(self, x: torch.Tensor, wte: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, wte)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


class GPT(_Cast):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Parameter(torch.empty(cfg.vocab, cfg.hidden))  # tied with the output layer
        self.wpe = nn.Parameter(torch.empty(cfg.seq, cfg.hidden))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = LayerNorm(cfg.hidden)
        self.vocab = TiedVocab()

    # Not under torch.no_grad(): its generator wrapper keeps the last value it yielded while the
    # next is drawn (two parameters at once); fresh tensors that need no gradient record nothing.
    def initial_values(self, seed: int, device: torch.device) -> Iterator[torch.Tensor]:
        """This rank's initial value of every parameter, in `named_parameters` order, one at a
        time and in fp32: GPT-2 init from a seeded generator on `device`, so every rank draws the
        same stream (and a GPU builds a large model without a trip through host memory). A sliced
        parameter draws its full tensor, as the single-process model does, and yields its slice.
        Drawing one parameter at a time is what lets an engine build in the memory it trains in:
        beside what it keeps, it holds at most one full parameter in fp32."""
        gen = torch.Generator(device=device).manual_seed(seed)
        std = 0.02
        residual_std = std / math.sqrt(2 * self.cfg.layers)  # GPT-2: scale residual projections
        one = torch.ones((), device=device)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                yield one.new_zeros(()).expand(p.shape)  # a constant needs no storage of its shape
            elif "ln" in name:
                yield one.expand(p.shape)
            else:
                s = residual_std if name.endswith("proj.weight") else std
                split = getattr(p, "mp_split", None)
                shape = p.shape if split is None else split.full_shape(p.shape)
                full = torch.randn(shape, generator=gen, device=device).mul_(s)  # in place: one full tensor
                yield full if split is None else split.local(full)
                del full  # before the next is drawn (the caller drops its reference too)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Every parameter set to its initial value (`initial_values`), in place."""
        for p, value in zip(self.parameters(), self.initial_values(seed, self.wte.device)):
            p.copy_(value)

    def set_dtypes(self, storage: torch.dtype, compute: torch.dtype) -> GPT:
        splits = {n: p.mp_split for n, p in self.named_parameters() if hasattr(p, "mp_split")}
        self.to(storage)  # under fake tensors (a trace) this makes new Parameters: their splits go on
        params = dict(self.named_parameters())
        for name, split in splits.items():
            params[name].mp_split = split
        for m in self.modules():
            if isinstance(m, _Cast):
                m.compute_dtype = compute
        return self

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy over the micro-batch."""
        wte = self.w(self.wte)
        x = self.vocab.embed(idx, wte) + self.w(self.wpe)[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.vocab.loss(self.ln_f(x), wte, targets)
