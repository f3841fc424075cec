"""A GPT-2 style decoder (pre-LN, learned positions, tied embeddings, 4h GELU MLP).

Weights are stored in the precision policy's storage dtype and cast to its compute dtype at use,
so on CPU a 16-bit model holds 2 bytes per weight while its matmuls run in fp32 (paper §3.1's
mixed-precision layout, measurable where 16-bit matmul is slow). Activation checkpointing keeps
one checkpoint per block, the block input (paper §3.2).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from zerobench.config import ModelConfig


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
        self.heads = cfg.heads
        self.qkv = Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = Linear(cfg.hidden, cfg.hidden)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=-1)
        # (b, s, h) -> (b, heads, s, head_dim)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
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


class GPT(_Cast):
    def __init__(self, cfg: ModelConfig, checkpoint_activations: bool = False):
        super().__init__()
        self.cfg = cfg
        self.checkpoint_activations = checkpoint_activations
        self.wte = nn.Parameter(torch.empty(cfg.vocab, cfg.hidden))  # tied with the output layer
        self.wpe = nn.Parameter(torch.empty(cfg.seq, cfg.hidden))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = LayerNorm(cfg.hidden)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """GPT-2 init from a seeded generator on the weights' device, so every rank builds the
        same weights (and a GPU builds a large model without a trip through host memory)."""
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
                p.copy_(torch.randn(p.shape, generator=gen, device=gen.device) * s)

    def set_dtypes(self, storage: torch.dtype, compute: torch.dtype) -> GPT:
        self.to(storage)
        for m in self.modules():
            if isinstance(m, _Cast):
                m.compute_dtype = compute
        return self

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy over the micro-batch."""
        s = idx.shape[1]
        wte = self.w(self.wte)
        x = F.embedding(idx, wte) + self.w(self.wpe)[:s]
        for block in self.blocks:
            if self.checkpoint_activations and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = F.linear(self.ln_f(x), wte)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
