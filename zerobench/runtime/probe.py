"""The host speed probe: a fixed fp32 GEMM and a fixed memory copy, each timed a few times (a
fraction of a second a reading), read beside every timed measured trial (runtime/train.py: rank 0,
before its build and after its timed steps) and by `zerobench calibrate` (at its start and its end, kept in the
profile). A shared host has slow spells of a minute or more; a trial's readings over its
calibration's say how fast the host ran for the trial, against when the rates the model predicts
from were measured (docs/perfmodel.md, "Measured comparisons on a noisy host").

A reading is one row (GEMM n, copy bytes, GEMM FLOP/s, bytes copied per s): the sizes it was taken
at, then its two rates, each the median of REPEATS timings of WINDOW_S or more. A record's
`host_probe` and a profile's `host_probe` are lists of readings (a record's: before, after). Readings compare
only at the same sizes. The ratio of two lists of readings and the slow-spell rule are
zerobench/slow_spells.py's (torch-free, so the tables read them without this module).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable

import torch

from zerobench.clock import device_clock, windowed_median

REPEATS = 5  # timings of each kernel per reading; the reading is their median
WINDOW_S = 0.01  # each timing the mean seconds per call over calls filling at least this window
# n of the n x n x n fp32 GEMM, and bytes of the copy (fp32, beyond the last-level cache), per device
GEMM_N = {"cpu": 512, "cuda": 4096}
COPY_BYTES = {"cpu": 2**25, "cuda": 2**28}


def read(device: str = "cpu", clock: Callable[[], float] | None = None) -> list:
    """One reading on `device` (`cpu` or `cuda`): [GEMM n, copy bytes, GEMM FLOP/s, bytes copied
    per s]. On CPU one intra-op thread (the workflow's ranks' setting, and the calibration's),
    restored after; on CUDA TF32 off, restored after: the same fixed work whatever the caller set.
    The buffers are given back when it returns (CPU: an anonymous mapping of their own, past any
    allocator, so no allocator keeps them in the process's RSS; CUDA: the cache emptied), yet the
    peak marks see them: a trial reads it outside the window its memory is measured in.
    `clock` (seconds) is the seam tests inject; by default the device clock (zerobench/clock.py)."""
    kind = torch.device(device).type
    n, nbytes = GEMM_N[kind], COPY_BYTES[kind]
    threads, tf32 = torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32
    if kind == "cpu":
        torch.set_num_threads(1)
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
    try:
        rates = _rates(device, n, nbytes, clock or device_clock(device))
    finally:
        torch.set_num_threads(threads)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        if kind == "cuda":
            torch.cuda.empty_cache()
    return [n, nbytes, *rates]


def _rates(device: str, n: int, nbytes: int, clock) -> tuple[float, float]:
    """(GEMM FLOP/s, bytes copied per s): the median of REPEATS timings each, after a warm-up; a
    timing is the mean seconds per call over the calls that fill WINDOW_S."""
    elements = 3 * n * n + 2 * (nbytes // 4)  # a, b, a @ b; the copy's source and destination (fp32)
    if torch.device(device).type == "cpu":
        buf = torch.frombuffer(mmap.mmap(-1, 4 * elements), dtype=torch.float32)
    else:
        buf = torch.empty(elements, device=device)
    a, b, c = (buf[i * n * n : (i + 1) * n * n].view(n, n) for i in range(3))
    src, dst = buf[3 * n * n :].chunk(2)
    a.normal_(generator=torch.Generator(device).manual_seed(0))
    b.copy_(a.T)
    src.fill_(1.0)

    def seconds(fn) -> float:  # a mean over a window: one call alone times unevenly (docs/perfmodel.md)
        return windowed_median(fn, clock, WINDOW_S, REPEATS)

    return 2 * n**3 / seconds(lambda: torch.mm(a, b, out=c)), nbytes / seconds(lambda: dst.copy_(src))
