"""Megatron-style tensor model parallelism (the paper's MP baseline, §4.3 and §7.1 of Shoeybi et al.):
the pieces `parallel/megatron.apply_tensor_parallel` splits the plain model with — column- and
row-parallel linears, a vocab-parallel embedding and cross-entropy, and the two
conjugate operators f (identity forward, all-reduce backward) and g (all-reduce forward, identity
backward). Per transformer block that is two all-reduces of b·s·h in forward (after attention and
after the MLP) and two in backward (before QKV and before the first MLP linear): paper §7 /
paper.md §1.4.

Every collective goes through the `Comms` instance of the `TensorParallel` context, over its MP
group. Sharded parameters carry a `Split` (attribute `mp_split`) saying how this rank's slice sits
in the single-process tensor, so weights are initialised from the full tensor and gathered back
whole; parameters without one are replicated across the MP group (LayerNorms, row-parallel biases,
position embeddings).

The vocabulary is padded to a multiple of N_m as Megatron does (GPT-2's 50257 divides by nothing):
padded rows start at zero and their logits are masked to −∞, so they never win, get no gradient
and never move.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from zerobench.engine.model import Linear
from zerobench.engine.parallel.comms import Comms
from zerobench.engine.parallel.topology import Group


@dataclass(frozen=True)
class TensorParallel:
    """The MP group a model is split over and the Comms its collectives are counted in."""

    group: Group
    comms: Comms

    @property
    def size(self) -> int:
        return self.group.size

    @property
    def rank(self) -> int:
        return self.group.rank


@dataclass(frozen=True)
class Split:
    """How a parameter is split: dimension `dim` of the full tensor (length `full`, padded up to a
    multiple of parts·N_m) is cut into `parts` stacked blocks, each cut into N_m (`mp`) slices;
    rank `rank` holds slice `rank` of every block (QKV: parts = 3, so each rank keeps whole heads
    of q, k and v). This is the `mp_split` the plain model's init reads (zerobench/engine/model.py)."""

    dim: int
    full: int
    parts: int = 1
    rank: int = 0
    mp: int = 1

    def padded(self) -> int:
        unit = self.parts * self.mp
        return -(-self.full // unit) * unit

    def full_shape(self, local_shape: torch.Size) -> tuple[int, ...]:
        shape = list(local_shape)
        shape[self.dim] = self.full
        return tuple(shape)

    def _blocks(self, full_padded: torch.Tensor) -> torch.Tensor:
        """A view [..., parts, mp, slice, ...] of the padded full tensor."""
        n = full_padded.shape[self.dim]
        return full_padded.unflatten(self.dim, (self.parts, self.mp, n // (self.parts * self.mp)))

    def local(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice (a copy) of the single-process tensor, its padding zero. Copied block
        by block from `full` as it is, never from a padded copy of it: beside the full tensor the
        engine's construction holds only this slice (memory.build_peak_bytes)."""
        n = self.padded() // (self.parts * self.mp)  # one block's slice, along `dim`
        shape = list(full.shape)
        shape[self.dim] = self.parts * n
        out = full.new_zeros(shape)
        for j in range(self.parts):
            start = j * self.mp * n + self.rank * n  # in the padded tensor: block j, slice `rank`
            length = min(n, self.full - start)  # past `full` is padding
            if length > 0:
                out.narrow(self.dim, j * n, length).copy_(full.narrow(self.dim, start, length))
        return out

    def assemble(self, slices: list[torch.Tensor]) -> torch.Tensor:
        """The single-process tensor from every rank's slice, in rank order (inverse of `local`)."""
        shape = list(slices[0].shape)
        shape[self.dim] = self.padded()
        full = slices[0].new_empty(shape)
        blocks = self._blocks(full)
        for r, s in enumerate(slices):
            target = blocks.select(self.dim + 1, r)
            target.copy_(s.unflatten(self.dim, (self.parts, s.shape[self.dim] // self.parts)))
        return full.narrow(self.dim, 0, self.full)


def mark_split(p: nn.Parameter, split: Split) -> nn.Parameter:
    """`p.mp_split`: how MP splits p. A parameter without it is replicated over MP; ZeRO's global
    gradient norm counts those once (zerobench.engine.zero.partition.counted_ranges)."""
    p.mp_split = split
    return p


# -- the conjugate operators -------------------------------------------------------------------
class _CopyToMP(torch.autograd.Function):
    """f: the input of a column-parallel layer; its gradient is summed over the MP group."""

    @staticmethod
    def forward(ctx, x, tp: TensorParallel):
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()  # the incoming gradient may be shared with a residual branch
        ctx.tp.comms.all_reduce(grad, ctx.tp.group)
        return grad, None


class _ReduceFromMP(torch.autograd.Function):
    """g: the output of a row-parallel layer (partial sums) is summed over the MP group."""

    @staticmethod
    def forward(ctx, x, tp: TensorParallel):
        ctx.mark_dirty(x)  # x is a fresh matmul output nothing else reads: reduce it in place
        tp.comms.all_reduce(x, tp.group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_mp(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    return _CopyToMP.apply(x, tp)


def reduce_from_mp(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    return _ReduceFromMP.apply(x, tp)


# -- layers ------------------------------------------------------------------------------------
def split_of(tp: TensorParallel, dim: int, full: int, parts: int = 1) -> Split:
    return Split(dim, full, parts, tp.rank, tp.size)


class ColumnParallelLinear(Linear):
    """y_r = x W_rᵀ + b_r: output features split across MP (`parts` stacked blocks split each)."""

    def __init__(self, fan_in: int, fan_out: int, tp: TensorParallel, parts: int = 1):
        if fan_out % (parts * tp.size):
            raise ValueError(f"fan_out={fan_out}: must be divisible by {parts} × mp ({tp.size})")
        super().__init__(fan_in, fan_out // tp.size)
        self.tp = tp
        mark_split(self.weight, split_of(tp, 0, fan_out, parts))
        mark_split(self.bias, split_of(tp, 0, fan_out, parts))

    def forward(self, x):
        return super().forward(copy_to_mp(x, self.tp))


class RowParallelLinear(Linear):
    """y = Σ_r x_r W_rᵀ + b: input features split across MP, partial outputs all-reduced, the bias
    (replicated) added once after the sum."""

    def __init__(self, fan_in: int, fan_out: int, tp: TensorParallel):
        if fan_in % tp.size:
            raise ValueError(f"fan_in={fan_in}: must be divisible by mp ({tp.size})")
        super().__init__(fan_in // tp.size, fan_out)
        self.tp = tp
        mark_split(self.weight, split_of(tp, 1, fan_in))

    def forward(self, x):
        return reduce_from_mp(F.linear(x, self.w(self.weight)), self.tp) + self.w(self.bias)


@dataclass(frozen=True)
class VocabShard:
    """This rank's rows [start, start + rows) of the padded vocabulary of `vocab` real tokens."""

    vocab: int
    start: int
    rows: int

    @classmethod
    def of(cls, vocab: int, tp: TensorParallel) -> VocabShard:
        rows = split_of(tp, 0, vocab).padded() // tp.size
        return cls(vocab, tp.rank * rows, rows)


def vocab_parallel_embedding(idx: torch.Tensor, weight: torch.Tensor, shard: VocabShard, tp: TensorParallel):
    """Each rank looks up the tokens in its rows (zeros elsewhere); the sum over MP is the lookup."""
    local = idx - shard.start
    outside = (local < 0) | (local >= shard.rows)
    out = F.embedding(local.masked_fill(outside, 0), weight).masked_fill(outside.unsqueeze(-1), 0.0)
    return reduce_from_mp(out, tp)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy from vocab-sharded logits [N, V/N_m] without gathering them: the max, the
    softmax denominator and the target logit are all-reduced (N elements each). One buffer of the
    logits' size beside them, as Megatron's: the shifted logits, exponentiated and normalised in
    place into the softmax that is saved, which backward turns into the gradient in place (a
    second backward through it is refused by autograd: the saved tensor has been modified)."""

    @staticmethod
    def forward(ctx, logits, targets, shard: VocabShard, tp: TensorParallel):
        if shard.start + shard.rows > shard.vocab:  # this shard holds padded rows: they never win
            cols = torch.arange(shard.start, shard.start + shard.rows, device=logits.device)
            logits = logits.masked_fill(cols >= shard.vocab, float("-inf"))
        peak = logits.max(dim=-1).values
        tp.comms.all_reduce(peak, tp.group, op=dist.ReduceOp.MAX)
        shifted = logits - peak.unsqueeze(-1)
        local_t = targets - shard.start
        mine = (local_t >= 0) & (local_t < shard.rows)
        local_t = local_t.masked_fill(~mine, 0)
        picked = shifted.gather(1, local_t.unsqueeze(1)).squeeze(1).masked_fill(~mine, 0.0)
        tp.comms.all_reduce(picked, tp.group)
        softmax = shifted.exp_()
        denom = softmax.sum(dim=-1)
        tp.comms.all_reduce(denom, tp.group)
        softmax /= denom.unsqueeze(-1)
        ctx.save_for_backward(softmax, local_t, mine)
        return (denom.log() - picked).mean()

    @staticmethod
    def backward(ctx, grad):
        g, local_t, mine = ctx.saved_tensors  # the softmax, made the gradient in place
        g[torch.arange(g.shape[0], device=g.device), local_t] -= mine.to(g.dtype)
        g *= grad / g.shape[0]
        return g, None, None, None


def vocab_parallel_cross_entropy(logits, targets, shard: VocabShard, tp: TensorParallel) -> torch.Tensor:
    return _VocabParallelCrossEntropy.apply(logits.float().flatten(0, -2), targets.reshape(-1), shard, tp)


# -- whole tensors back ------------------------------------------------------------------------
def gather_full(
    named: dict[str, torch.Tensor], model: nn.Module, mp_group: Group, comms: Comms | None = None
) -> dict[str, torch.Tensor]:
    """`named` (this rank's whole-over-DP parameters, e.g. an engine's `full_parameters()`) as the
    single-process model holds them, in fp32: MP slices all-gathered and reassembled by the split
    recorded on `model`'s parameter of the same name. Collective over the MP group."""
    comms = comms or Comms()
    params = dict(model.named_parameters())
    out = {}
    for name, value in named.items():
        local = value.detach().float().contiguous()
        split = getattr(params[name], "mp_split", None)
        if split is None or mp_group.size == 1:
            out[name] = local.clone()
            continue
        flat = torch.empty(mp_group.size * local.numel(), dtype=local.dtype, device=local.device)
        comms.all_gather(flat, local.reshape(-1), mp_group)
        out[name] = split.assemble(list(flat.view(mp_group.size, *local.shape)))
    return out
