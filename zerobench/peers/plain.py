"""The plain PyTorch loop as a peer on one device: the same GPT, initial weights and batches,
trained the way a single-GPU script trains it — fp32 parameters, `torch.autocast` to bf16 when the
trial is bf16, `torch.optim.AdamW(fused=True)`, one non-reentrant checkpoint per block
(`checkpoint_wrapper`, torch.utils.checkpoint) when the trial checkpoints activations, and global
gradient-norm clipping as our engine clips. No data parallelism and no partitioning: world size 1.

`plain-compile` is the same loop with each transformer block under `torch.compile` (inductor),
after its checkpoint wrapper, as torchtitan compiles a model (`apply_compile`): the blocks share
one structure, so one compiled graph serves them all and the compilation (in the warm-up step)
takes one block's time, not the model's. Embedding, final LayerNorm, loss and optimizer run eager.
"""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

from zerobench.peers.workload import Unavailable, finish_step, rank_batches, reference_model

AUTOCAST = {"fp32": None, "bf16": torch.bfloat16}  # precision -> autocast dtype (None: no autocast)


def check(impl: str, spec) -> None:
    if spec.parallel.world_size != 1:
        raise Unavailable(f"world size {spec.parallel.world_size}: the plain loop is one process on one device")
    if spec.precision.mode not in AUTOCAST:
        raise Unavailable(f"precision={spec.precision.mode}: the plain loop runs fp32 or bf16 (no loss scaler)")
    if spec.train.grad_accum != 1:
        raise Unavailable(f"grad_accum={spec.train.grad_accum}: the plain loop takes one micro-batch per step")


def versions() -> dict:
    return {"torch": torch.__version__}


class Trainer:
    """`backend`: torch.compile's backend for `plain-compile` ("eager" traces and runs the graphs
    without generating kernels: the wiring, in seconds, where inductor would take minutes)."""

    def __init__(self, impl: str, spec, backend: str = "inductor"):
        if impl not in ("plain", "plain-compile"):
            raise ValueError(f"impl={impl!r}: not a plain loop")
        self.spec, self.train = spec, spec.train
        self.device = torch.device(spec.precision.device)
        model = reference_model(spec, checkpoint=False)  # fp32 on the device, our initial weights
        for i, block in enumerate(model.blocks):
            if spec.parallel.checkpoint_activations:
                block = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
            if impl == "plain-compile":
                block = torch.compile(block, backend=backend)
            model.blocks[i] = block
        self.model = model
        t = self.train
        self.opt = torch.optim.AdamW(
            model.parameters(), lr=t.lr, betas=t.betas, eps=t.eps, weight_decay=t.weight_decay, fused=True
        )
        dtype = AUTOCAST[spec.precision.mode]
        self.autocast = (lambda: torch.autocast(self.device.type, dtype)) if dtype else contextlib.nullcontext
        self.note = (
            f"fp32 parameters{f', autocast {spec.precision.mode}' if dtype else ''}, AdamW(fused=True)"
            + (", non-reentrant checkpoint per block" if spec.parallel.checkpoint_activations else "")
            + (f", torch.compile per block (backend={backend})" if impl == "plain-compile" else "")
        )

    def step(self, step: int) -> float:
        ((x, y),) = rank_batches(self.spec, 0, step)  # one micro-batch (see check)
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        with self.autocast():
            loss = self.model(x, y)
        return finish_step(loss, self.model, self.opt, self.train.clip_norm)


def build(impl: str, spec) -> Trainer:
    return Trainer(impl, spec)
