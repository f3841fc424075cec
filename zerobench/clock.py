"""The one clock every measured second is read from: the ledger's seconds (parallel/comms.py), the
step timer (runtime/devices.py) and calibrate's microbenchmarks (calibrate/).

A CUDA op returns to the host when it is queued, not when it has run, so a host clock read around
it times the launch. On CUDA the clock therefore waits for the device's current stream before each
read: the seconds between two reads are the work queued between them (kernels, a synchronous
collective, or an asynchronous one once it has been waited for, which makes the current stream
wait on it). Only the current stream is waited for: an asynchronous collective still in flight on
its own stream is not charged to the read before it is waited for. On CPU every op has run when it
returns, and the clock is `time.perf_counter` itself: nothing added to a CPU run's timings.

It sits on the ground floor (beside memory.py, whose peak-RSS helpers play the same role for
bytes) so that parallel/comms.py, below runtime/, can read it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def stream_sync(device: torch.device) -> None:
    """Wait for the work queued on `device`'s current CUDA stream."""
    torch.cuda.current_stream(device).synchronize()


def device_clock(
    device: torch.device | str, synchronize: Callable[[torch.device], None] = stream_sync
) -> Callable[[], float]:
    """A clock in seconds for timing work on `device`: `time.perf_counter` on any device but CUDA;
    on CUDA one `synchronize(device)` before each read of `time.perf_counter`. `synchronize` is the
    seam tests inject (a counter, a sleep standing in for queued work)."""
    device = torch.device(device)
    if device.type != "cuda":
        return time.perf_counter

    def clock() -> float:
        synchronize(device)
        return time.perf_counter()

    return clock


def tensor_clock(t: torch.Tensor, synchronize: Callable[[torch.device], None] = stream_sync) -> Callable[[], float]:
    """`device_clock` of the device `t` is on, chosen per call in the ledger's hot path: `is_cuda`
    is read in ~0.1 us where building the device and reading its type take ~1 us."""
    return device_clock(t.device, synchronize) if t.is_cuda else time.perf_counter


def windowed_median(fn: Callable[[], object], clock: Callable[[], float], window_s: float, reps: int) -> float:
    """Median seconds per call of `fn()` over `reps` timings on `clock`, each the mean over the calls
    that fill at least `window_s` seconds, after one warm-up call (first touch of pages, a kernel's
    first launch): short calls vary call to call far more than their windowed mean does."""
    fn()
    samples = []
    for _ in range(reps):
        calls, t0 = 0, clock()
        while True:
            fn()
            calls += 1
            if (elapsed := clock() - t0) >= window_s:
                break
        samples.append(elapsed / calls)
    return statistics.median(samples)
