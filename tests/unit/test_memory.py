"""The RSS measurement behind measured CPU trials' memory caps: after `reset_peak_rss`, the peak
counts only what was allocated since (zerobench/runtime/train.py checks the cap against that growth)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from zerobench import memory

MiB = 2**20


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux clear_refs")
def test_reset_peak_rss_forgets_earlier_peaks_and_sees_later_ones():
    before = np.ones(200 * MiB // 8)  # a 200 MiB peak, freed before the reset
    del before
    base = memory.reset_peak_rss()
    assert memory.peak_rss_bytes() - base < 40 * MiB
    after = np.ones(100 * MiB // 8)  # 100 MiB touched after the reset
    assert memory.peak_rss_bytes() - base >= 95 * MiB
    del after
