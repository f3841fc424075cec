"""The collective schedule of one step, counted as the engine issues it: which DP collectives a
stage runs (its rule in zerobench/stages.py), how many calls, of what size. Stage 3 gathers one
bucket per module that owns parameters (zero/stage3.py: 6 per layer plus the root's) or, under an
implementation that gathers parameter by parameter (implementation.py), one call per parameter
above its persistence threshold. network.py prices each call (nccl_table.py for its latency).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from zerobench import stages as rules
from zerobench.engine.config import ModelConfig
from zerobench.perfmodel.constants import Calibration
from zerobench.perfmodel.implementation import Implementation


class Call(NamedTuple):
    """`calls` collectives of `op` of `nbytes` each over the DP group; `exposed`: not overlappable
    with backward (a gather the step waits for) rather than a gradient reduction. A named tuple:
    stage 3 of a deep model issues thousands a step, made again for every layout priced."""

    op: str
    nbytes: float
    calls: int
    exposed: bool


def stage3_parameters(model: ModelConfig, mp: int = 1) -> tuple[float, ...]:
    """Elements of each parameter on one MP rank, in the order stage3_modules groups them (per layer:
    ln1 weight, bias; qkv weight, bias; proj weight, bias; ln2 weight, bias; fc1 weight, bias; fc2
    weight, bias; then wte, wpe, the final layernorm's weight and bias)."""
    h, v = model.hidden, -(-model.vocab // mp)
    layer = (h, h, 3 * h * h / mp, 3 * h / mp, h * h / mp, h, h, h, 4 * h * h / mp, 4 * h / mp, 4 * h * h / mp, h)
    return layer * model.layers + (v * h, model.seq * h, h, h)


def stage3_modules(model: ModelConfig, mp: int = 1) -> tuple[float, ...]:
    """Parameters of each module that owns some, on one MP rank: stage 3 gathers and reduces one
    bucket per such module (zero/stage3.py; DeepSpeed's stage 3 fetches per submodule too). Each
    module owns a weight and a bias (`stage3_parameters`, in pairs; the root's embeddings count as
    one): 6L + 2 messages from a few KiB (a layernorm) to the embedding's V·h/mp."""
    p = stage3_parameters(model, mp)
    return tuple(w + b for w, b in zip(p[::2], p[1::2]))


def stage3_units(model: ModelConfig, mp: int, impl: Implementation) -> tuple[tuple[float, ...], float]:
    """(elements of each unit stage 3 gathers, elements kept whole on every rank) under `impl`: the
    engine's module buckets, or parameter by parameter with the small ones persistent."""
    pieces = stage3_parameters(model, mp) if impl.per_parameter else stage3_modules(model, mp)
    kept = sum(n for n in pieces if n <= impl.persistence_threshold)
    return tuple(n for n in pieces if n > impl.persistence_threshold), kept


def dp_schedule(
    params_per_rank: float, stage: int, grad_bytes: int, cal: Calibration, micro_batches: int = 1,
    units: tuple[float, ...] = (), persistent: float = 0.0, reduce_bucket_elems: int = 0,
) -> tuple[Call, ...]:  # fmt: skip
    """One step's DP collectives, in the engine's order, from the stage's rule (stages.py): stages
    0-2 once a step over all Ψ' (P_os's reduce-scatter an all-reduce as ZeRO-OS had it, with
    `zero_os_stage1`); stage 3 per micro-batch and per gathered unit (`units`, elements; one unit of
    all of Ψ' if empty): its forward and backward all-gathers, and its gradient reduce-scatter, per
    unit or in `reduce_bucket_elems` buckets; elements kept whole (`persistent`) are reduce-scattered
    per micro-batch and gathered once after the step (zero/stage3.py)."""
    return _schedule(params_per_rank, stage, grad_bytes, cal.zero_os_stage1, micro_batches, units, persistent,
                     reduce_bucket_elems)  # fmt: skip


# a deep model's stage 3 issues thousands of calls a step, and a search, a plan or the ledger's revert
# test prices the same layout again and again: each schedule is made once (~100 kB an entry at most)
@lru_cache(maxsize=1 << 10)
def _schedule(
    params_per_rank: float, stage: int, grad_bytes: int, zero_os_stage1: bool, micro_batches: int,
    units: tuple[float, ...], persistent: float, reduce_bucket_elems: int,
) -> tuple[Call, ...]:  # fmt: skip
    """`dp_schedule`'s calls, of the one Calibration field it reads."""
    ops = rules.rule(stage).collectives
    msg = params_per_rank * grad_bytes  # Ψ' in the 16-bit (or fp32) storage dtype
    if stage < 3:
        if stage == 1 and zero_os_stage1:  # ZeRO-OS as first released: all-reduce, 1.5x volume
            ops = ("all_reduce", "all_gather")
        return tuple(Call(op, msg, 1, op == "all_gather") for op in ops)
    m, sizes = micro_batches, units or (params_per_rank,)
    out = []
    for op in ops:
        if op == "reduce_scatter" and reduce_bucket_elems:
            buckets = max(1, math.ceil(sum(sizes) / reduce_bucket_elems))
            out.append(Call(op, sum(sizes) * grad_bytes / buckets, m * buckets, False))
        else:
            out += [Call(op, n * grad_bytes, m, False) for n in sizes]
    if persistent:  # stage 3's every call in the overlappable share, the gather after the step too:
        # the model's stage 3 as it was (no call of it is hidden; docs/perfmodel.md)
        out += [Call("reduce_scatter", persistent * grad_bytes, m, False),
                Call("all_gather", persistent * grad_bytes, 1, False)]  # fmt: skip
    return tuple(out)
