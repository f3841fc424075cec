"""What differs between CPU and GPU runs: step timing, peak memory, and which hardware profile
(and so which peak FLOP/s, for MFU) a device is."""

from __future__ import annotations

from collections.abc import Callable

import torch

from zerobench import memory
from zerobench.clock import device_clock, stream_sync
from zerobench.gpus import profile_of


class StepTimer:
    """Seconds per step, between marks of the device clock (zerobench/clock.py): on CPU the wall
    clock; on CUDA the current stream waited for at each mark, so a step's time is its work (the
    optimizer step queued after the last loss.item() included), not its launch. The one wait per
    step stops the host from queueing the next step's first kernels early: microseconds of a step.
    `synchronize`: see `device_clock`."""

    def __init__(self, device: torch.device, synchronize: Callable[[torch.device], None] = stream_sync):
        self._clock = device_clock(device, synchronize)
        self._marks: list[float] = []

    def mark(self) -> None:
        self._marks.append(self._clock())

    def times(self) -> list[float]:
        return [b - a for a, b in zip(self._marks, self._marks[1:])]


def peak_memory(device: torch.device) -> list[int]:
    """[peak RSS of this process, peak CUDA allocated, peak CUDA reserved] in bytes (0 on CPU)."""
    if device.type != "cuda":
        return [memory.peak_rss_bytes(), 0, 0]
    return [memory.peak_rss_bytes(), torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)]


def hardware_profile(device: torch.device) -> str | None:
    """The perfmodel profile name of a CUDA device (zerobench/gpus.py), or None (CPU, or a GPU
    without a profile)."""
    return profile_of(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
