"""What differs between CPU and GPU runs: step timing, peak memory, and which hardware profile
(and so which peak FLOP/s, for MFU) a device is."""

from __future__ import annotations

import time

import torch

from zerobench import memory

# CUDA device-name fragments -> hardware profile of zerobench/perfmodel/hardware.py
_PROFILE_BY_NAME = (("H200", "h200-141gb"), ("H100", "h100-80gb"), ("A100", "a100-80gb"), ("V100", "v100-32gb-dgx2"))


class StepTimer:
    """Seconds per step. On GPU, CUDA events bracket each step (no host sync inside the timed
    region; one synchronize when the times are read); on CPU, the wall clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())

    def times(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self._marks, self._marks[1:])]  # ms -> s
        return [b - a for a, b in zip(self._marks, self._marks[1:])]


def peak_memory(device: torch.device) -> list[int]:
    """[peak RSS of this process, peak CUDA allocated, peak CUDA reserved] in bytes (0 on CPU)."""
    if device.type != "cuda":
        return [memory.peak_rss_bytes(), 0, 0]
    return [memory.peak_rss_bytes(), torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)]


def hardware_profile(device: torch.device) -> str | None:
    """The perfmodel profile name of a CUDA device, or None (CPU, or a GPU without a profile)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((profile for key, profile in _PROFILE_BY_NAME if key in name), None)


def mfu(tflops_per_gpu: float, profile: str | None) -> float | None:
    """Achieved over the profile's dense 16-bit peak; None without a profile."""
    if profile is None:
        return None
    from zerobench.perfmodel.hardware import get_profile

    return tflops_per_gpu * 1e12 / get_profile(profile).peak_flops
