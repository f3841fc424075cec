"""The one clock every measured second is read from: the step timer (runtime/devices.py),
calibrate's microbenchmarks (calibrate/), and the marks the ledger's seconds come from
(parallel/comms.py).

A CUDA op returns to the host when it is queued, not when it has run, so a host clock read around
it times the launch. On CUDA the clock therefore waits for the device's current stream before each
read: the seconds between two reads are the work queued between them (kernels, a synchronous
collective, or an asynchronous one once it has been waited for, which makes the current stream
wait on it). Only the current stream is waited for: an asynchronous collective still in flight on
its own stream is not charged to the read before it is waited for. On CPU every op has run when it
returns, and the clock is `time.perf_counter` itself: nothing added to a CPU run's timings.

The ledger's per-call seconds (parallel/comms.py) are read from marks instead, so that timing a
collective never stops the host from running ahead of the device: `HostMarks` on a CPU (the
perf_counter, read at once), `EventMarks` on CUDA (an event recorded on the current stream, read
once it has run: no host wait). A call timed by events covers the same stretch of the stream as one
timed by the synchronizing clock: from the end of the work queued before its first mark to the end
of the work queued before its second (docs/gpu.md, "What a ledger call's seconds include").

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


class HostMarks:
    """Marks on the host clock (`time.perf_counter`), ready at once: on a CPU every op has run when
    it returns, so the seconds between two marks are the work between them."""

    def mark(self, device: torch.device) -> float:
        return time.perf_counter()

    def ready(self, end) -> bool:
        return True

    def seconds(self, start, end) -> float:
        return end - start


class EventMarks:
    """Marks on a CUDA device's current stream: a timing event recorded there (`torch.cuda.Event`,
    `enable_timing=True`), which the host does not wait for. The seconds between two marks are the
    device's own timestamps (`Event.elapsed_time`, in ms), readable once the end mark has run
    (`ready`: `Event.query()`, no wait); `seconds` waits for that event alone when it has not.
    `event` and `stream` are the seams tests inject (a simulated stream on a host without CUDA)."""

    def __init__(self, event=None, stream: Callable[[torch.device], object] | None = None):
        self.event, self.stream = event, stream

    def mark(self, device: torch.device):
        e = (self.event or torch.cuda.Event)(enable_timing=True)
        e.record((self.stream or torch.cuda.current_stream)(device))
        return e

    def ready(self, end) -> bool:
        return end.query()

    def seconds(self, start, end) -> float:
        end.synchronize()  # elapsed_time needs both events done; start ran before end on the stream
        return start.elapsed_time(end) / 1e3


HOST_MARKS, CUDA_MARKS = HostMarks(), EventMarks()


def tensor_marks(t: torch.Tensor) -> HostMarks | EventMarks:
    """The marks that time work on `t`'s device: events on CUDA, the host clock anywhere else
    (`is_cuda`: read in ~0.1 us, in the ledger's hot path)."""
    return CUDA_MARKS if t.is_cuda else HOST_MARKS


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
