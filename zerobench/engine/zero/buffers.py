"""ZeRO-R's buffer rules, measured (paper §6.2–6.3).

C_B: every fused communication buffer of the engine is one bucket of the flat layout, packed up to
`bucket_bytes` (zerobench/engine/zero/partition.py). A parameter larger than C_B is not split: it gets a
bucket of its own, so the precise bound on any fused buffer is max(C_B, the largest parameter),
rounded up to a multiple of N_d elements — independent of the number of layers, and of the model's
width for as long as no single parameter outgrows C_B. `largest_bucket_bytes` is that number for
an engine.

M_D: long-lived tensors (checkpoints, gradients) written into buffers allocated once instead of a
tensor per layer per step. `AllocationCounter` counts the tensors the operators of a region
allocate (outputs whose storage is new), on any device, so runs with and without M_D can be
compared on a CPU.

`BufferPool`: the engine's own reuse of freed bucket buffers on CPU, where PyTorch has no caching
allocator.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def largest_bucket_bytes(layout, elem_bytes: int) -> int:
    """Bytes of the largest fused buffer (bucket, padded to N_d) of a FlatLayout."""
    return max(b.padded for b in layout.buckets) * elem_bytes


class AllocationCounter(TorchDispatchMode):
    """Counts, per region, the tensors operators allocate and their bytes. Views and in-place
    results share an input's storage and are not counted. Thread-local, like every dispatch mode,
    so each rank of a threaded world counts its own."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 0:
                ptr = t.untyped_storage().data_ptr()
                if ptr not in seen:
                    seen.add(ptr)
                    self.count += 1
                    self.bytes += t.untyped_storage().nbytes()
        return out


class BufferPool:
    """Freed 1-D buffers kept by length and dtype and handed out again, until `clear()`. Active for
    real CPU tensors only: PyTorch's CPU allocator keeps no cache, so every large tensor is fresh
    memory from the OS, page-faulted in on first write (the kernel zeroes each 4 KiB page), and
    stage 3 allocates ~3Ψ elements of bucket buffers per micro-batch (gathers twice, gradient
    staging once). CUDA's caching allocator already reuses freed blocks; a traced step (fake
    tensors) allocates nothing. What the pool holds is what a caching allocator reserves: freed,
    not in use; the engine clears it at the end of forward and of backward."""

    reuse = True  # every pool's; off inside `no_reuse`

    def __init__(self, dtype: torch.dtype, device: torch.device):
        self.dtype, self.device = dtype, device
        self.active = device.type == "cpu" and not isinstance(torch.empty(0, device=device), FakeTensor)
        self._free: dict[int, list[torch.Tensor]] = {}

    def take(self, numel: int) -> torch.Tensor:
        """A buffer of `numel` elements, contents undefined."""
        free = self._free.get(numel)
        return free.pop() if free else torch.empty(numel, dtype=self.dtype, device=self.device)

    def give(self, t: torch.Tensor) -> None:
        """Take back `t`, which nothing else may use any more (not inside `no_reuse`)."""
        if self.active and BufferPool.reuse:
            self._free.setdefault(t.numel(), []).append(t)

    def clear(self) -> None:
        self._free.clear()


@contextmanager
def no_reuse():
    """No pool keeps a freed buffer in this block: an emulated rank's counted step
    (runtime/emulate.py), where a kept buffer would count as a live tensor that the trace and a
    GPU's allocator see freed."""
    BufferPool.reuse = False
    try:
        yield
    finally:
        BufferPool.reuse = True
