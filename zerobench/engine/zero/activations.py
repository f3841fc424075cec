"""Activation checkpointing with ZeRO-R's P_a, P_a+cpu and M_D (paper §6.1, §6.3).

One checkpoint per transformer block, its input (b·s·h elements). Without P_a every MP rank keeps
the whole input (Megatron replicates it). With P_a rank r of the N_m MP ranks keeps only chunk r
of it, 1/N_m of the bytes, and the chunks are all-gathered (b·s·h elements out) just before the
block is recomputed in backward. P_a+cpu also moves each kept chunk to host memory after the
block's forward and back before its recomputation, so the device holds no checkpoints between
forward and backward; at N_m = 1 P_a splits nothing and P_a+cpu moves the whole input (DeepSpeed's
CPU checkpointing without MP, paper §6.1). M_D writes the checkpoints into one buffer preallocated for all layers (and
reuses one gather and one reload buffer) instead of allocating a tensor per layer per step.

`apply_activation_checkpointing` applies it to a plain model (zerobench/engine/model.py). The
recomputation is reentrant (as Megatron and DeepSpeed do it): the block is run again inside
its checkpoint's backward and its parameters' gradients accumulate there, so the engine's
post-accumulate-grad hooks fire as usual.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from zerobench.engine.config import ParallelConfig
from zerobench.engine.parallel.comms import Comms


@dataclass
class _Saved:
    data: torch.Tensor  # what is kept: the input, this rank's chunk of it, or the chunk on host
    shape: torch.Size
    device_bytes: int  # bytes of it on the compute device


class CheckpointStore:
    """Where block-input checkpoints live between a block's forward and its recomputation; counts
    the bytes it holds (`peak_device_bytes`, `peak_host_bytes`) and the buffers it allocates."""

    def __init__(
        self,
        layers: int,
        mp_group=None,
        comms: Comms | None = None,
        partition: bool = False,
        offload: bool = False,
        contiguous: bool = False,
    ):
        if offload and not partition:
            raise ValueError("offload=True: P_a+cpu offloads the partitioned checkpoints, so it needs partition=True")
        self.layers, self.group, self.comms = layers, mp_group, comms or Comms()
        self.mp = 1 if mp_group is None else mp_group.size
        self.partition, self.offload, self.contiguous = partition and self.mp > 1, offload, contiguous
        self.device_bytes = self.host_bytes = 0  # held now
        self.peak_device_bytes = self.peak_host_bytes = 0
        self.allocations = 0  # tensors this store allocated (M_D: only its preallocated buffers)
        self._slots: torch.Tensor | None = None  # M_D: [layers, kept] on the device, or on host with offload
        self._gathered: torch.Tensor | None = None  # M_D: one whole checkpoint, reused layer by layer
        self._reload: torch.Tensor | None = None  # M_D with offload: one chunk's way back
        # entered around each host allocation: a memory counter books what is made inside as the
        # host's (runtime/counter.py), where host and device are one (a CPU rank, a trace)
        self.host_booking = contextlib.nullcontext

    def _new(self, numel: int, like: torch.Tensor, host: bool = False) -> torch.Tensor:
        self.allocations += 1
        if host:  # pinned where there is a GPU to copy from, so the copies can be asynchronous
            with self.host_booking():
                return torch.empty(numel, dtype=like.dtype, device="cpu", pin_memory=torch.cuda.is_available())
        return torch.empty(numel, dtype=like.dtype, device=like.device)

    def _buffer(self, name: str, numel: int, like: torch.Tensor, host: bool = False) -> torch.Tensor:
        """M_D: a buffer kept across steps; reallocated only when the activation shape changes."""
        buf = getattr(self, name)
        if buf is None or buf.numel() != numel or buf.dtype != like.dtype:
            buf = self._new(numel, like, host)
            setattr(self, name, buf)
        return buf

    def save(self, x: torch.Tensor, layer: int) -> _Saved:
        flat = x.detach().reshape(-1)
        elem = flat.element_size()
        kept = flat
        if self.partition:  # hidden divides by N_m (ParallelConfig.check_model), so b·s·h does too
            n = flat.numel() // self.mp
            kept = flat[self.group.rank * n : (self.group.rank + 1) * n]
        if self.offload or self.contiguous or self.partition:
            if self.contiguous:
                slot = self._buffer("_slots", self.layers * kept.numel(), kept, host=self.offload)
                dst = slot[layer * kept.numel() : (layer + 1) * kept.numel()]
            else:
                dst = self._new(kept.numel(), kept, host=self.offload)
            if self.offload:
                self.comms.copy(dst, kept, "copy_to_host")
            else:
                dst.copy_(kept)  # its own storage, so the whole input can be freed (P_a)
            kept = dst
        saved = _Saved(kept, x.shape, 0 if self.offload else kept.numel() * elem)
        self.device_bytes += saved.device_bytes
        self.host_bytes += kept.numel() * elem if self.offload else 0
        self.peak_device_bytes = max(self.peak_device_bytes, self.device_bytes)
        self.peak_host_bytes = max(self.peak_host_bytes, self.host_bytes)
        return saved

    def load(self, saved: _Saved, device: torch.device) -> torch.Tensor:
        """The whole checkpoint back on the device (reloaded and all-gathered as needed); releases it."""
        kept = saved.data
        self.device_bytes -= saved.device_bytes
        if self.offload:
            self.host_bytes -= kept.numel() * kept.element_size()
            like = torch.empty(0, dtype=kept.dtype, device=device)
            back = self._buffer("_reload", kept.numel(), like) if self.contiguous else self._new(kept.numel(), like)
            self.comms.copy(back, kept, "copy_to_device")
            kept = back
        if self.partition:
            n = kept.numel() * self.mp
            whole = self._buffer("_gathered", n, kept) if self.contiguous else self._new(n, kept)
            self.comms.all_gather(whole, kept, self.group)
            kept = whole
        saved.data = None
        return kept.view(saved.shape)

    def buffer_bytes(self) -> int:
        """M_D: bytes of the preallocated buffers (device and host together)."""
        bufs = [b for b in (self._slots, self._gathered, self._reload) if b is not None]
        return sum(b.numel() * b.element_size() for b in bufs)


class _Checkpointed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, block: CheckpointedForward):
        ctx.block, ctx.device = block, x.device
        ctx.saved = block.store.save(x, block.layer)
        return block.inner(x)  # grad mode is off inside Function.forward: nothing of the block is kept

    @staticmethod
    def backward(ctx, grad):
        x = ctx.block.store.load(ctx.saved, ctx.device).detach().requires_grad_()
        ctx.saved = None
        with torch.enable_grad():
            y = ctx.block.recompute(x)
        torch.autograd.backward(y, grad)
        return x.grad, None


class CheckpointedForward:
    """A block's forward that keeps only its input (through `store`) and recomputes the block in
    backward; without grad (evaluation) it is the block's own forward. The recomputation calls the
    block as a module, so hooks on it (an FSDP peer's unshard) fire as in its first forward."""

    def __init__(self, block, store: CheckpointStore, layer: int):
        self.block, self.inner, self.store, self.layer = block, block.forward, store, layer
        self._recomputing = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._recomputing or not torch.is_grad_enabled():
            return self.inner(x)
        return _Checkpointed.apply(x, self)

    def recompute(self, x: torch.Tensor) -> torch.Tensor:
        self._recomputing = True
        try:
            return self.block(x)
        finally:
            self._recomputing = False


def apply_activation_checkpointing(
    model, parallel: ParallelConfig, mp_group=None, comms: Comms | None = None
) -> CheckpointStore:
    """Checkpoint every block of the plain `model` in place (paper §3.2: one checkpoint per block,
    its input), kept as `parallel` says — whole, P_a over `mp_group`, P_a+cpu, M_D — with the
    gathers and host copies counted in `comms`. The module tree and parameter names are unchanged
    (each block's forward is wrapped). Returns the store; `checkpoint_store(model)` finds it again."""
    store = CheckpointStore(
        len(model.blocks),
        mp_group,
        comms,
        partition=parallel.partition_activations,
        offload=parallel.offload_activations,
        contiguous=parallel.contiguous_buffers,
    )
    for i, block in enumerate(model.blocks):
        block.forward = CheckpointedForward(block, store, i)
    return store


def checkpoint_store(model) -> CheckpointStore | None:
    """The store `apply_activation_checkpointing` gave `model`'s blocks, or None."""
    forward = model.blocks[0].forward if len(model.blocks) else None
    return forward.store if isinstance(forward, CheckpointedForward) else None
