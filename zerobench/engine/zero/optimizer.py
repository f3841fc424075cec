"""Adam on a rank's shard (paper §5.1, P_os): fp32 master weights and Adam moments for the owned
elements only, global-norm clipping across shards, and dynamic loss scaling for fp16.

The update is torch's own functional Adam (`torch.optim.adam.adam`), so it matches
`torch.optim.Adam`: on CPU and CUDA its fused kernel (what `torch.optim.Adam(fused=True)` runs:
one pass over each piece instead of a kernel per elementwise op; docs/engine-measurements.md has
the CPU speed-up), equal to rounding; elsewhere the single-tensor path, element for element.

16-bit gradients are never upcast whole (§5: the states are (2 + 2 + K)Ψ/N_d bytes, with no
fp32 copy of the gradient beside them): the overflow check reads them as they are, the norm
upcasts one piece at a time, and Adam gets each piece's fp32 gradient made just before its
update (`upcast`), so the step's temporary memory is one piece (bucket or chunk) in fp32.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.optim.adam import adam

from zerobench.engine.config import TrainConfig
from zerobench.engine.parallel.comms import Comms
from zerobench.engine.parallel.topology import Group


class ShardedAdam:
    """Adam over a list of 1-D pieces (views into the engine's flat buffers).

    `params` are the pieces of the model's storage this rank updates. When they are 16-bit a
    contiguous fp32 master copy is kept (4 bytes per element) and written back after each step;
    the moments are two contiguous fp32 buffers (8 bytes per element). So k = 12 bytes per owned
    element in mixed precision and k = 8 in fp32, as paper §3.1 counts.
    """

    def __init__(self, params: list[torch.Tensor], train: TrainConfig):
        self.train = train
        self.params = params
        sizes = [p.numel() for p in params]
        total = sum(sizes)
        self.mixed = params[0].dtype != torch.float32
        dev = params[0].device
        self.master_flat = None
        if self.mixed:  # filled piece by piece: a cat of fp32 upcasts would hold the master twice
            self.master_flat = torch.empty(total, device=dev)
            for dst, p in zip(self.master_flat.split(sizes), params):
                dst.copy_(p)
        self.exp_avg_flat = torch.zeros(total, device=dev)
        self.exp_avg_sq_flat = torch.zeros(total, device=dev)
        self.master = list(self.master_flat.split(sizes)) if self.mixed else params
        self.exp_avg = list(self.exp_avg_flat.split(sizes))
        self.exp_avg_sq = list(self.exp_avg_sq_flat.split(sizes))
        self.fused = dev.type in ("cpu", "cuda")  # the devices torch's fused Adam kernel runs on
        # step counts where torch.optim.Adam keeps them: on the parameters' device for the fused
        # kernel (which reads them there), on CPU otherwise
        self.steps = [torch.tensor(0.0, device=dev if self.fused else "cpu") for _ in params]

    def state_bytes(self) -> int:
        flats = [self.exp_avg_flat, self.exp_avg_sq_flat] + ([self.master_flat] if self.mixed else [])
        return sum(t.numel() * t.element_size() for t in flats)

    def step(
        self,
        grads: list[torch.Tensor],
        after_piece=lambda i: None,
        order=None,
        before_piece=lambda i: None,
        fp32=lambda g: g,
    ):
        """One Adam update with `grads` (same pieces as `params`), piece by piece, in `order`
        (default: index order; the pieces are independent, so any order gives the same result).
        `fp32(g)` makes piece g's unscaled, clipped fp32 gradient, just before its update (the
        default: `grads` are that already); `before_piece(i)` runs before piece i is read (the
        engine waits for its gradient), `after_piece(i)` once its parameters are final, so the
        engine can send them while the next piece is updated."""
        t = self.train
        for i in range(len(self.params)) if order is None else order:
            before_piece(i)
            adam(
                [self.master[i]],
                [fp32(grads[i])],
                [self.exp_avg[i]],
                [self.exp_avg_sq[i]],
                [],
                [self.steps[i]],
                foreach=False,
                fused=self.fused,
                amsgrad=False,
                beta1=t.betas[0],
                beta2=t.betas[1],
                lr=t.lr,
                weight_decay=t.weight_decay,
                eps=t.eps,
                maximize=False,
            )
            self._write_back(i)
            after_piece(i)

    def write_back(self) -> None:
        """Copy the fp32 master into the 16-bit parameter pieces (nothing to do in fp32)."""
        for i in range(len(self.params)):
            self._write_back(i)

    def _write_back(self, i: int) -> None:
        if self.mixed:
            self.params[i].copy_(self.master[i])


def upcast(g: torch.Tensor, unscale: float = 1.0) -> torch.Tensor:
    """`g` in fp32 divided by the loss scale `unscale`: `g` itself when it is fp32 and unscaled,
    otherwise a copy the size of `g` (one piece, never the whole gradient)."""
    return g.float() if unscale == 1.0 else g.to(torch.float32, copy=True).div_(unscale)


def global_grad_norm(
    grads: list[torch.Tensor], comms: Comms, groups: list[Group], unscale: float = 1.0
) -> torch.Tensor:
    """L2 norm of the gradient divided by `unscale` across all shards: local sum of squares,
    summed over `groups` (the groups across which the gradient is partitioned). fp32 pieces are
    read in place (runs of them as one); any other piece is upcast on its own, one at a time."""
    sq = torch.zeros(1, dtype=torch.float64, device=grads[0].device)
    in_place = unscale == 1.0 and all(g.dtype == torch.float32 for g in grads)
    for g in coalesce(grads) if in_place else grads:
        sq += _sum_of_squares(upcast(g, unscale))
    for group in groups:
        comms.all_reduce(sq, group)
    return sq.sqrt().float()


def _sum_of_squares(g: torch.Tensor, row: int = 4096) -> torch.Tensor:
    """Σ g² in fp64 without an fp64 copy of g: fp32 norms of 4096-element rows (accurate at that
    length), squared and summed in fp64: faster than g.double().pow(2).sum() and within ~1e-8 of
    it, where a single fp32 norm of 10⁷+ elements is off by ~1e-3."""
    n = g.numel() // row * row
    rows = torch.linalg.vector_norm(g[:n].reshape(-1, row), dim=1, dtype=torch.float32)
    return rows.double().square().sum() + g[n:].double().square().sum()


def clip_coef(norm: torch.Tensor, max_norm: float) -> torch.Tensor | None:
    """The factor torch.nn.utils.clip_grad_norm_ scales by (max/(norm+1e-6), ≤ 1); None when
    clipping is off (`max_norm` 0)."""
    return torch.clamp(max_norm / (norm + 1e-6), max=1.0) if max_norm > 0 else None


def clip_(grads: list[torch.Tensor], norm: torch.Tensor, max_norm: float) -> None:
    """Scale fp32 `grads` in place as torch.nn.utils.clip_grad_norm_ does."""
    coef = clip_coef(norm, max_norm)
    if coef is not None:
        for g in coalesce(grads):
            g.mul_(coef)


class LossScaler:
    """Dynamic loss scaling for fp16 (its gradients are what `found_overflow` reads): halve on
    overflow and skip the step; double after `window` clean steps."""

    def __init__(self, enabled: bool, initial: float, window: int):
        self.enabled = enabled
        self.scale = initial if enabled else 1.0
        self.window = window
        self.clean_steps = 0
        self.skipped = 0

    def found_overflow(self, grads: list[torch.Tensor], comms: Comms, groups: list[Group]) -> bool:
        if not self.enabled:
            return False
        flag = torch.zeros(1, device=grads[0].device)
        # Piece by piece, and no branch on the values, so a traced step (FakeTensorMode) runs it
        # too. The fp32 sum of an fp16 piece is finite exactly when every element is (65504 times
        # any piece's length is far inside fp32's range), and needs no temporary the size of the
        # piece on a GPU, where isfinite() makes 5 bytes per element (abs, compares).
        for g in grads:
            flag.add_(torch.isfinite(g.sum(dtype=torch.float32)).logical_not())
        for group in groups:  # every rank must agree to skip
            comms.all_reduce(flag, group, op=torch.distributed.ReduceOp.MAX)
        return False if isinstance(flag, FakeTensor) else bool(flag.item())  # traced: no overflow

    def update(self, overflow: bool) -> None:
        if not self.enabled:
            return
        if overflow:
            self.scale /= 2.0
            self.clean_steps = 0
            self.skipped += 1
        else:
            self.clean_steps += 1
            if self.clean_steps % self.window == 0:
                self.scale *= 2.0


def coalesce(pieces: list[torch.Tensor]) -> list[torch.Tensor]:
    """`pieces` with every run of 1-D contiguous pieces that follow one another in one storage
    (a shard split by bucket) joined into one view: the same elements in the same order, so an
    elementwise op or a reduction over them costs one kernel, not one per bucket."""
    runs: list[list[torch.Tensor]] = []
    for p in pieces:
        last = runs[-1][-1] if runs else None
        if (
            last is not None
            and p.dim() == last.dim() == 1
            and p.stride(0) == last.stride(0) == 1
            and p.dtype == last.dtype
            and p.untyped_storage() is last.untyped_storage()
            and p.storage_offset() == last.storage_offset() + last.numel()
        ):
            runs[-1].append(p)
        else:
            runs.append([p])
    return [
        run[0] if len(run) == 1 else run[0].as_strided((sum(p.numel() for p in run),), (1,), run[0].storage_offset())
        for run in runs
    ]
