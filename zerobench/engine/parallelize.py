"""`parallelize`: the plain GPT (model.py) composed into what this rank trains, in one function, as
torchtitan's `parallelize` sits beside its model. Each step is a function of its own module that
transforms the model in place; here is only their order and why:

1. Megatron MP (paper §4.3; parallel/megatron.py): each block's linears split over the MP group,
   the tied embedding by vocabulary rows. First: everything after sees this rank's shapes.
2. torch.compile per block (compile.py), where the trial asks for it: before checkpointing, so a
   checkpoint's boundary is never inside a graph and its recomputation calls the compiled compute.
3. ZeRO-R (§6; zero/activations.py): one checkpoint per block, kept whole, partitioned over MP
   (P_a), on the host (P_a+cpu), in one preallocated buffer (M_D).
4. The storage and compute dtypes (§3.1's mixed precision; model.py `set_dtypes`).
5. ZeRO-DP (§5; zero/apply.py): the stage's engine, with its C_B buckets (§6.2), allocates on the
   device only what its stage keeps and fills it from the single-process model's initial values,
   one parameter at a time. Last: it is the only step that allocates, and it hooks the parameters
   and blocks the steps above have put in place.

The model comes in on the meta device (shapes only), so no rank ever holds the whole model
(§5.3; DeepSpeed's zero.Init, FSDP2's meta-device init)."""

from __future__ import annotations

import torch

from zerobench.engine.compile import apply_compile
from zerobench.engine.config import ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.engine.model import GPT
from zerobench.engine.parallel.comms import Comms
from zerobench.engine.parallel.megatron import apply_tensor_parallel
from zerobench.engine.parallel.topology import ParallelContext
from zerobench.engine.zero.activations import apply_activation_checkpointing
from zerobench.engine.zero.apply import apply_zero
from zerobench.engine.zero.core import ZeroEngine


def parallelize(
    model: GPT,
    ctx: ParallelContext,
    parallel: ParallelConfig,
    precision: PrecisionConfig,
    train: TrainConfig,
    comms: Comms,
    device: torch.device,
) -> ZeroEngine:
    """The engine that trains the plain `model` (built on the meta device) on this rank of `ctx`,
    on `device`, as `parallel`, `precision` and `train` say; every collective goes through `comms`
    (the module docstring gives the order and why)."""
    apply_tensor_parallel(model, ctx.mp, comms)
    if train.compiles(device.type):
        apply_compile(model)
    if parallel.checkpoint_activations:
        apply_activation_checkpointing(model, parallel, ctx.mp, comms)
    model.set_dtypes(precision.storage_dtype, precision.compute_dtype)
    values = model.initial_values(train.seed, device)  # drawn one parameter at a time, as the engine takes them
    return apply_zero(model, ctx, parallel, precision, train, comms, device, values)
