"""`apply_zero`: the engine of a stage around a plain model (paper §5)."""

from __future__ import annotations

from zerobench.engine.zero.stage0 import Stage0
from zerobench.engine.zero.stage1 import Stage1
from zerobench.engine.zero.stage2 import Stage2
from zerobench.engine.zero.stage3 import Stage3

ENGINES = {0: Stage0, 1: Stage1, 2: Stage2, 3: Stage3}


def apply_zero(model, ctx, parallel, precision, train, comms, device=None, values=None):
    """The engine that trains `model` with `parallel.stage` (0 = plain DP, 1 = P_os, 2 = P_os+g,
    3 = P_os+g+p) on this rank's groups `ctx`; every collective goes through `comms`. A model built
    on the meta device is built on `device` from `values`, its parameters' initial values in order
    (`GPT.initial_values`): the engine allocates only what its stage keeps."""
    return ENGINES[parallel.stage](model, ctx, parallel, precision, train, comms, device, values)
