"""Every layout of a plan request, priced and ranked by the performance model (`source: modelled`).

A layout is (MP degree, ZeRO-DP stage, activation policy, M_D, C_B, micro-batch, accumulation);
DP = GPUs / MP. The micro-batches tried: with a global batch B, every divisor of B / DP up to the
largest that fits (grad_accum makes up the rest); without one, the largest that fits and the powers
of two below it (one micro-batch a step). The largest that fits is found once per (MP, stage,
activations, M_D, C_B) by the memory model's own bisection (feasibility.max_micro_batch), so the
search prices only layouts that fit.

Memory is the model's (`memory`: feasibility.breakdown, the training and the construction peak
against the usable bytes of the card, with what the request's attention kernel keeps beyond this
engine's, attention_memory.surplus_bytes); speed is perfmodel.predict's, with the band it carries
(`band_pct`, `band_basis`: its regime's held-out band, else the pooled one; error_bands.carried).
Layouts rank by tokens per second, layouts the model prices alike (C_B and M_D move memory, not
time) sharing a rank; `frontier` marks the layouts no other beats in both tokens per second and
memory. A layout leaving less than the request's headroom free is not `offered` as a pick; the
offered layouts whose speed lies inside the band of the fastest offered one are `tied`: the model
cannot order them, so they come first, the most headroom (the least likely to fail) first.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable

from zerobench.engine.config import ParallelConfig, TrainConfig
from zerobench.perfmodel import implementation
from zerobench.perfmodel.attention_memory import surplus_bytes
from zerobench.perfmodel.constants import DEFAULT, Calibration
from zerobench.perfmodel.engine_memory import compute_bytes
from zerobench.perfmodel.error_bands import band, carried
from zerobench.perfmodel.feasibility import MemoryBreakdown, breakdown, largest_fitting, prices_code
from zerobench.perfmodel.paper_setups import PAPER_BUCKET
from zerobench.perfmodel.predict import predict
from zerobench.plan.request import PlanRequest
from zerobench.stages import STAGES
from zerobench.trial.errors import InputError
from zerobench.trial.fields import MiB

# (checkpoint_activations, partition_activations, offload_activations): none, one checkpoint per
# block, P_a (checkpoints split over MP), P_a+cpu (and moved to the host). At MP 1 P_a splits
# nothing, so it is one checkpoint per block; P_a+cpu moves the whole checkpoints to the host, as
# DeepSpeed's CPU checkpointing does without MP (zero/activations.py)
ACTIVATIONS = ((False, False, False), (True, False, False), (True, True, False), (True, True, True))
# C_B in bytes: the engine's default bucket, and the paper's (DeepSpeed's hyperscale buckets)
BUCKETS = (ParallelConfig.bucket_bytes, PAPER_BUCKET)
MOST_GPUS = 1 << 16  # the most GPUs a model that fits nowhere is tried on


@dataclasses.dataclass(frozen=True)
class Layout:
    mp: int
    dp: int
    stage: int
    micro_batch: int
    grad_accum: int
    checkpoint_activations: bool
    partition_activations: bool
    offload_activations: bool
    contiguous_buffers: bool
    bucket_mb: float  # C_B in MiB, as the `--bucket-mb` flag takes it

    def parallel(self) -> ParallelConfig:
        return ParallelConfig(
            dp=self.dp, mp=self.mp, stage=self.stage, bucket_bytes=round(self.bucket_mb * MiB),
            checkpoint_activations=self.checkpoint_activations, partition_activations=self.partition_activations,
            offload_activations=self.offload_activations, contiguous_buffers=self.contiguous_buffers,
        )  # fmt: skip

    def train(self) -> TrainConfig:
        return TrainConfig(micro_batch=self.micro_batch, grad_accum=self.grad_accum)

    @property
    def label(self) -> str:
        """'z2 mp16 dp25 b32x1 ckpt+P_a M_D C_B667': stage, degrees, micro-batch x accumulation, ZeRO-R."""
        act = ("P_a+cpu" if self.offload_activations else "P_a" if self.partition_activations else
               "ckpt" if self.checkpoint_activations else "no-ckpt")  # fmt: skip
        md = " M_D" if self.contiguous_buffers else ""
        return (f"z{self.stage} mp{self.mp} dp{self.dp} b{self.micro_batch}x{self.grad_accum} {act}{md} "
                f"C_B{self.bucket_mb:g}")  # fmt: skip


def micro_batches(largest: int, dp: int, global_batch: int | None) -> list[tuple[int, int]]:
    """(micro_batch, grad_accum) pairs to price, largest first (see the module's docstring)."""
    if largest < 1:
        return []
    if global_batch is None:
        powers = [1 << k for k in range(largest.bit_length()) if 1 << k < largest]
        return [(b, 1) for b in [largest, *reversed(powers)]]
    if global_batch % dp:
        return []
    per_rank = global_batch // dp
    return [(b, per_rank // b) for b in range(min(largest, per_rank), 0, -1) if not per_rank % b]


def configurations(req: PlanRequest):
    """Every (mp, stage, activations, M_D, C_B) the engine can express for `req`, as ParallelConfigs
    at micro-batch-independent settings."""
    for mp in req.mp_degrees():
        dp = req.gpus // mp
        if req.global_batch is not None and req.global_batch % dp:
            continue
        for stage in STAGES:
            for ckpt, pa, cpu in ACTIVATIONS:
                if pa and not cpu and mp == 1:  # nothing to partition over: one checkpoint per block
                    continue
                for md in (False, True):
                    for bucket in BUCKETS if stage else BUCKETS[:1]:  # stage 0 holds no C_B buckets
                        yield ParallelConfig(dp=dp, mp=mp, stage=stage, bucket_bytes=bucket,
                                             checkpoint_activations=ckpt, partition_activations=pa,
                                             offload_activations=cpu, contiguous_buffers=md)  # fmt: skip


def _progress(done: int, total: int, t0: float, stream) -> None:
    if stream is not None and total >= 50 and (done == total or done % max(1, total // 10) == 0):
        print(f"plan: {done}/{total} configurations priced ({time.perf_counter() - t0:.1f} s)", file=stream)


def memory(req: PlanRequest, parallel: ParallelConfig, micro_batch: int, cal: Calibration) -> MemoryBreakdown:
    """A layout's memory as the plan prices it: the model's (feasibility.breakdown) for the request's
    implementation, and where that is this engine's, what the request's attention kernel keeps beyond
    the engine's at the peak (attention_memory.surplus_bytes; a code's own formulas price its attention
    already)."""
    hw, precision, code = req.profile, req.precision_config, implementation.get(req.implementation)
    mem = breakdown(req.model, parallel, precision, micro_batch, hw, cal, req.attention, code)
    if prices_code(cal, code):  # another code's memory: its own formulas (implementation.py)
        return mem
    extra = surplus_bytes(req.model, parallel, micro_batch, compute_bytes(precision, hw), req.attention)
    return dataclasses.replace(mem, working_bytes=mem.working_bytes + extra)


def rank(req: PlanRequest, cal: Calibration = DEFAULT, progress=sys.stderr) -> list[dict]:
    """Every layout of `req` that fits, as rows (the Layout's fields and its modelled speed and
    memory), the tied group first, then fastest first (`ranked`); raises InputError naming `gpus`
    when none fits, with the fewest GPUs on which one would."""
    cal = cal.for_hardware(req.profile.name)
    configs = list(configurations(req))
    rows, smallest, t0 = [], None, time.perf_counter()
    speeds = {}  # the model's speed of each layout but for C_B and M_D, which it prices alike (_priced)
    for i, parallel in enumerate(configs, 1):
        largest = largest_fitting(lambda b, p=parallel: memory(req, p, b, cal).fits, 1 << 16)
        if largest == 0:
            need = memory(req, parallel, 1, cal)
            need_bytes = max(need.total_bytes, need.build_bytes)
            if smallest is None or need_bytes < smallest[0]:
                smallest = (need_bytes, need.usable_bytes, parallel)
        for b, ga in micro_batches(largest, parallel.dp, req.global_batch):
            rows.append(_priced(req, parallel, b, ga, cal, speeds))
        _progress(i, len(configs), t0, progress)
    if not rows:
        raise InputError(_nothing_fits(req, smallest, cal))
    return ranked(rows, req.headroom)


def _layout(parallel: ParallelConfig, b: int, ga: int) -> Layout:
    return Layout(parallel.mp, parallel.dp, parallel.stage, b, ga, parallel.checkpoint_activations,
                  parallel.partition_activations, parallel.offload_activations, parallel.contiguous_buffers,
                  parallel.bucket_bytes / MiB)  # fmt: skip


def _priced(req: PlanRequest, parallel: ParallelConfig, b: int, ga: int, cal: Calibration, speeds: dict) -> dict:
    """One layout's row: the model's speed, its memory against the card, its band. The speed is
    predicted once for the layouts that differ in C_B and M_D alone, which predict prices alike
    (they move memory, feasibility.py; tests/unit/test_plan.py holds it), so the stage-3 gathers,
    the costliest part of a prediction, are priced once per layout of the others (`speeds`)."""
    layout = _layout(parallel, b, ga)
    key = (parallel.mp, parallel.stage, parallel.checkpoint_activations, parallel.partition_activations,
           parallel.offload_activations, b, ga)  # fmt: skip
    if key not in speeds:
        speeds[key] = predict(req.model, parallel, req.precision_config, layout.train(), req.profile, cal=cal,
                              attention=req.attention, implementation=req.implementation)  # fmt: skip
    pred = speeds[key]
    mem = memory(req, parallel, b, cal)
    peak = max(mem.total_bytes, mem.build_bytes)  # training or construction, whichever is higher
    tokens = b * ga * parallel.dp * req.model.seq / pred.step_time_s
    pct, basis = carried(band(req.profile.name, parallel.world_size, parallel.mp, parallel.stage).value)
    return {
        "layout": layout.label, **dataclasses.asdict(layout), "step_time_s": pred.step_time_s, "tokens_per_s": tokens,
        "tflops_per_gpu": pred.tflops_per_gpu, "mfu": pred.mfu, "memory_bytes": peak,
        "usable_bytes": mem.usable_bytes, "headroom_bytes": mem.usable_bytes - peak, "band_pct": pct,
        "band_basis": basis, "checked": "modelled",
    }  # fmt: skip


def headroom_pct(row: dict) -> float:
    """The per cent of its card's usable bytes a layout leaves free."""
    return 100 * row["headroom_bytes"] / row["usable_bytes"]


def ranked(rows: list[dict], headroom: float) -> list[dict]:
    """The rows with `rank`, `frontier`, `offered` and `tied`, the tied group first (most headroom
    first), then the rest fastest first (among equals: less memory, then more headroom).
    `rank` counts distinct speeds, shared by equal ones (1, 2, 2, 3); `frontier` where no other
    layout is at least as fast with less memory, or faster with no more; `offered` where the layout
    leaves at least `headroom` per cent of its usable bytes free; `tied` for the offered layouts
    whose speed lies inside the fastest offered one's band (its `band_pct` below it)."""
    rows = sorted(rows, key=lambda r: (-r["tokens_per_s"], r["memory_bytes"], -r["headroom_bytes"]))
    least = float("inf")
    for i, r in enumerate(rows):
        tied = i and r["tokens_per_s"] == rows[i - 1]["tokens_per_s"]
        r["rank"] = rows[i - 1]["rank"] + (not tied) if i else 1
        # sorted by speed, then memory: on the frontier if it needs less than every faster layout
        r["frontier"] = r["memory_bytes"] < least
        least = min(least, r["memory_bytes"])
        r["headroom_pct"] = headroom_pct(r)
        r["offered"] = r["headroom_pct"] >= headroom
    lead = next((r for r in rows if r["offered"]), None)
    floor = lead["tokens_per_s"] * (1 - lead["band_pct"] / 100) if lead else math.inf
    for r in rows:
        r["tied"] = r["offered"] and r["tokens_per_s"] >= floor
    group = sorted((r for r in rows if r["tied"]), key=lambda r: (-r["headroom_pct"], -r["tokens_per_s"]))
    return group + [r for r in rows if not r["tied"]]


def fewest_gpus(req: PlanRequest, cal: Calibration, limit: int = MOST_GPUS) -> tuple[int, str] | None:
    """(GPUs, layout): the fewest whole nodes' GPUs, up to `limit`, on which `req`'s model fits at
    micro-batch 1 (the global batch aside), and the layout that fits there; None if none does. Only
    the leanest layouts are tried, stage 3 with P_a+cpu and the smaller C_B (M_D off and on, each MP
    degree): where none of them fits, no layout does. Memory falls as GPUs are added (stage 3
    partitions over a larger DP), so the nodes double from the request's until one fits, then a
    bisection finds the fewest."""
    gpn = req.profile.gpus_per_node

    def fits(nodes: int) -> str | None:
        probe = dataclasses.replace(req, gpus=nodes * gpn, global_batch=None)
        lean = (p for p in configurations(probe) if p.stage == 3 and p.offload_activations)
        found = next((p for p in lean if p.bucket_bytes == BUCKETS[0] and memory(probe, p, 1, cal).fits), None)
        return found and _layout(found, 1, 1).label

    lo, hi, top = -(-req.gpus // gpn) - 1, -(-req.gpus // gpn), limit // gpn  # lo: nodes known not to fit
    while (layout := fits(hi)) is None:
        if hi == top:
            return None
        lo, hi = hi, min(2 * hi, top)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if (found := fits(mid)) is None:
            lo = mid
        else:
            hi, layout = mid, found
    return hi * gpn, layout


def _nothing_fits(req: PlanRequest, smallest, cal: Calibration) -> str:
    hw = req.profile
    what = f"{req.model.name} ({req.model.num_params / 1e9:.1f}B)"
    if smallest is None:  # every configuration was ruled out before memory (a global batch no DP divides)
        return f"global_batch={req.global_batch}: no layout of {what} on {req.gpus} GPUs divides it"
    need, usable, parallel = smallest
    fewest = fewest_gpus(req, cal)
    where = f"it fits on no count of whole nodes up to {MOST_GPUS} GPUs"
    if fewest:
        nodes = fewest[0] // hw.gpus_per_node
        where = f"it fits from {fewest[0]} GPUs ({nodes} nodes of {hw.gpus_per_node}), at stage 3: {fewest[1]}"
    return (f"gpus={req.gpus}: no layout of {what} fits {hw.gpu}: the smallest (stage {parallel.stage}, "
            f"mp {parallel.mp}, micro-batch 1) needs {need / 1e9:.1f} GB per GPU, "
            f"{usable / 1e9:.1f} GB usable; {where}")  # fmt: skip


def find(rows: list[dict], match: Callable[[dict], bool]) -> dict | None:
    """The first (best-ranked) row `match` accepts, or None."""
    return next((r for r in rows if match(r)), None)
