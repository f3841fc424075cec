"""What every implementation in the side-by-side comparison trains on: the same GPT with the same
initial weights, the same token batches, the rest of a torch peer's step, and, on CUDA, the NCCL
group its collectives go over. Each peer module (ours.py, torch_peers.py, plain.py,
deepspeed_peer.py) builds on these; the harness that measures them (harness.py) imports the peers."""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from zerobench.engine.model import GPT
from zerobench.engine.step import shifted
from zerobench.engine.zero.activations import apply_activation_checkpointing
from zerobench.runtime.batches import SyntheticTokens
from zerobench.runtime.train import rank_batch


class Unavailable(Exception):
    """The implementation cannot run here (a package missing, code not written yet)."""


def reference_model(spec, checkpoint: bool = True) -> GPT:
    """The GPT every peer trains: our model, fp32, on the trial's device (the current GPU on
    CUDA), with our seeded init drawn there as our engine draws it. With `checkpoint` and a trial
    that checkpoints activations, each block checkpointed by our engine's function (the same
    recomputation as ours)."""
    with torch.device(spec.precision.device):
        model = GPT(spec.model)
    if checkpoint and spec.parallel.checkpoint_activations:
        apply_activation_checkpointing(model, spec.parallel)
    model.init_weights(spec.train.seed)
    return model


@functools.cache
def device_group(device: str):
    """The process group for collectives on `device`'s tensors: the (gloo) world on CPU, None;
    on CUDA an NCCL group of every rank, made once per process (every rank calls this alike)."""
    return None if device == "cpu" else dist.new_group(backend="nccl")


def rank_batches(spec, dp_rank: int, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's (inputs, targets) micro-batches of `step`: the slices our engine takes."""
    data = SyntheticTokens(spec.model.vocab, spec.model.seq, spec.train.seed)
    return [shifted(mb) for mb in rank_batch(data, step, spec.train, dp_rank)]


def finish_step(loss: torch.Tensor, model: torch.nn.Module, opt: torch.optim.Optimizer, clip_norm: float) -> float:
    """The rest of a torch peer's step after its forward: backward, torch's global-norm clip where
    asked (DDP's gradients are replicated, FSDP2's are DTensors: either way the global norm), the
    optimizer step; the loss as a float."""
    loss.backward()
    if clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()
