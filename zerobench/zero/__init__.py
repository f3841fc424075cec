"""ZeRO-DP (paper §5): `apply_zero` wraps a plain model in the engine of its stage."""

from __future__ import annotations


def apply_zero(model, ctx, parallel, precision, train, comms):
    """The engine that trains `model` with `parallel.stage` (0 = plain DP, 1 = P_os, 2 = P_os+g,
    3 = P_os+g+p) on this rank's groups `ctx`; every collective goes through `comms`."""
    if parallel.stage == 3:
        from zerobench.zero.stage3 import Stage3Engine as Engine
    else:
        from zerobench.zero.engine import ZeroEngine as Engine
    return Engine(model, ctx, parallel, precision, train, comms)
