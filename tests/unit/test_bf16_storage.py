"""16-bit storage trains as fp32 does (paper §3.1's mixed precision, 2 + 2 + 12 bytes per parameter):
on CPU the engine stores parameters and gradients in bf16 and computes in fp32 (config.PrecisionConfig),
so a bf16 run differs from an fp32 run of the same steps only by the rounding of what is stored. The
same comparison runs on a GPU, where bf16 is also the compute dtype (tests/gpu/test_gpu.py).

The tokens are uniform random, which no model can learn: the loss wanders rather than falls, so the
check is that bf16 follows fp32 step by step, not that either improves."""

from __future__ import annotations

import pytest

from tests.engine_cases import engine_run, spec_for

# A bf16 weight is rounded to 8 significant bits, 2^-9 ≈ 2e-3 relative at most; the loss averages
# over every token and weight, so its error is far smaller.
CPU_REL = 1e-3


def loss_deviation(fp32: list[float], bf16: list[float]) -> tuple[float, float]:
    """(largest relative difference between the runs' losses at the same step, that difference as a
    share of the fp32 loss's own largest move between two steps): the second says how much of the
    training signal the rounding drowns, whatever the loss's scale."""
    assert len(fp32) == len(bf16) > 1
    gap = max(abs(a - b) for a, b in zip(fp32, bf16, strict=True))
    moves = max(abs(a - b) for a, b in zip(fp32, fp32[1:]))
    return max(abs(a - b) / abs(a) for a, b in zip(fp32, bf16, strict=True)), gap / moves


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_bf16_storage_tracks_fp32_training(stage):
    fp32 = engine_run(0, spec_for("tiny", device="cpu", stage=stage, steps=10))["losses"]
    bf16 = engine_run(0, spec_for("tiny", "bf16", device="cpu", stage=stage, steps=10))["losses"]
    assert fp32 != bf16  # the storage really is 16-bit: its rounding shows
    rel, share = loss_deviation(fp32, bf16)
    assert rel < CPU_REL
    assert share < 0.1  # the runs differ by under a tenth of the loss's own step-to-step movement
