"""Every layout of a plan request, priced and ranked by the performance model (`source: modelled`).

A layout is (MP degree, ZeRO-DP stage, activation policy, M_D, C_B, micro-batch, accumulation);
DP = GPUs / MP. The micro-batches tried: with a global batch B, every divisor of B / DP up to the
largest that fits (grad_accum makes up the rest); without one, the largest that fits and the powers
of two below it (one micro-batch a step). The largest that fits is found once per (MP, stage,
activations, M_D, C_B) by the memory model's own bisection (feasibility.max_micro_batch), so the
search prices only layouts that fit.

Memory is the model's (feasibility.breakdown: the training and the construction peak against the
usable bytes of the card); speed is perfmodel.predict's, with the band it carries (`band_pct`,
`band_basis`: its regime's held-out band, else the pooled one; error_bands.carried). Layouts rank
by tokens per second, ties (layouts the model prices alike: C_B and M_D move memory, not time)
sharing a rank; `frontier` marks the layouts no
other beats in both tokens per second and memory.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from zerobench.engine.config import ParallelConfig, TrainConfig
from zerobench.perfmodel.constants import DEFAULT, Calibration
from zerobench.perfmodel.error_bands import band, carried
from zerobench.perfmodel.feasibility import breakdown, max_micro_batch
from zerobench.perfmodel.paper_setups import PAPER_BUCKET
from zerobench.perfmodel.predict import predict
from zerobench.plan.request import PlanRequest
from zerobench.stages import STAGES
from zerobench.trial.errors import InputError
from zerobench.trial.fields import MiB

# (checkpoint_activations, partition_activations, offload_activations): none, one checkpoint per
# block, P_a (checkpoints split over MP), P_a+cpu (and moved to the host); P_a needs MP > 1
ACTIVATIONS = ((False, False, False), (True, False, False), (True, True, False), (True, True, True))
# C_B in bytes: the engine's default bucket, and the paper's (DeepSpeed's hyperscale buckets)
BUCKETS = (ParallelConfig.bucket_bytes, PAPER_BUCKET)


@dataclass(frozen=True)
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
                if pa and mp == 1:  # nothing to partition over
                    continue
                for md in (False, True):
                    for bucket in BUCKETS if stage else BUCKETS[:1]:  # stage 0 holds no C_B buckets
                        yield ParallelConfig(dp=dp, mp=mp, stage=stage, bucket_bytes=bucket,
                                             checkpoint_activations=ckpt, partition_activations=pa,
                                             offload_activations=cpu, contiguous_buffers=md)  # fmt: skip


def _progress(done: int, total: int, t0: float, stream) -> None:
    if stream is not None and total >= 50 and (done == total or done % max(1, total // 10) == 0):
        print(f"plan: {done}/{total} configurations priced ({time.perf_counter() - t0:.1f} s)", file=stream)


def rank(req: PlanRequest, cal: Calibration = DEFAULT, progress=sys.stderr) -> list[dict]:
    """Every layout of `req` that fits, as rows (the Layout's fields and its modelled speed and
    memory), fastest first; raises InputError naming `gpus` when none fits."""
    hw, precision = req.profile, req.precision_config
    cal = cal.for_hardware(hw.name)
    model = req.model
    configs = list(configurations(req))
    rows, smallest, t0 = [], None, time.perf_counter()
    speeds = {}  # the model's speed of each layout but for C_B and M_D, which it prices alike (_priced)
    for i, parallel in enumerate(configs, 1):
        largest = max_micro_batch(model, parallel, precision, hw, cal, attention=req.attention)
        if largest == 0:
            need = breakdown(model, parallel, precision, 1, hw, cal, req.attention)
            need_bytes = max(need.total_bytes, need.build_bytes)
            if smallest is None or need_bytes < smallest[0]:
                smallest = (need_bytes, need.usable_bytes, parallel)
        for b, ga in micro_batches(largest, parallel.dp, req.global_batch):
            rows.append(_priced(req, parallel, b, ga, cal, speeds))
        _progress(i, len(configs), t0, progress)
    if not rows:
        raise InputError(_nothing_fits(req, smallest))
    return ranked(rows)


def _priced(req: PlanRequest, parallel: ParallelConfig, b: int, ga: int, cal: Calibration, speeds: dict) -> dict:
    """One layout's row: the model's speed, its memory against the card, its band. The speed is
    predicted once for the layouts that differ in C_B and M_D alone, which predict prices alike
    (they move memory, feasibility.py; tests/unit/test_plan.py holds it), so the stage-3 gathers,
    the costliest part of a prediction, are priced once per layout of the others (`speeds`)."""
    layout = Layout(parallel.mp, parallel.dp, parallel.stage, b, ga, parallel.checkpoint_activations,
                    parallel.partition_activations, parallel.offload_activations, parallel.contiguous_buffers,
                    parallel.bucket_bytes / MiB)  # fmt: skip
    key = (parallel.mp, parallel.stage, parallel.checkpoint_activations, parallel.partition_activations,
           parallel.offload_activations, b, ga)  # fmt: skip
    if key not in speeds:
        speeds[key] = predict(req.model, parallel, req.precision_config, layout.train(), req.profile, cal=cal,
                              attention=req.attention, implementation=req.implementation)  # fmt: skip
    pred = speeds[key]
    mem = breakdown(req.model, parallel, req.precision_config, b, req.profile, cal, req.attention)
    peak = max(mem.total_bytes, mem.build_bytes)  # training or construction, whichever is higher
    tokens = b * ga * parallel.dp * req.model.seq / pred.step_time_s
    pct, basis = carried(band(req.profile.name, parallel.world_size, parallel.mp, parallel.stage).value)
    return {
        "layout": layout.label, **asdict(layout), "step_time_s": pred.step_time_s, "tokens_per_s": tokens,
        "tflops_per_gpu": pred.tflops_per_gpu, "mfu": pred.mfu, "memory_bytes": peak,
        "usable_bytes": mem.usable_bytes, "headroom_bytes": mem.usable_bytes - peak, "band_pct": pct,
        "band_basis": basis, "checked": "modelled",
    }  # fmt: skip


def ranked(rows: list[dict]) -> list[dict]:
    """Fastest first (among equals: less memory, then more headroom); `rank` counts distinct speeds,
    shared by equal ones (1, 2, 2, 3);
    `frontier` where no other layout is at least as fast with less memory, or faster with no more."""
    rows = sorted(rows, key=lambda r: (-r["tokens_per_s"], r["memory_bytes"], -r["headroom_bytes"]))
    least = float("inf")
    for i, r in enumerate(rows):
        tied = i and r["tokens_per_s"] == rows[i - 1]["tokens_per_s"]
        r["rank"] = rows[i - 1]["rank"] + (not tied) if i else 1
        # sorted by speed, then memory: on the frontier if it needs less than every faster layout
        r["frontier"] = r["memory_bytes"] < least
        least = min(least, r["memory_bytes"])
    return rows


def _nothing_fits(req: PlanRequest, smallest) -> str:
    hw = req.profile
    what = f"{req.model.name} ({req.model.num_params / 1e9:.1f}B)"
    if smallest is None:  # every configuration was ruled out before memory (a global batch no DP divides)
        return f"global_batch={req.global_batch}: no layout of {what} on {req.gpus} GPUs divides it"
    need, usable, parallel = smallest
    return (f"gpus={req.gpus}: no layout of {what} fits {hw.gpu}: the smallest (stage {parallel.stage}, "
            f"mp {parallel.mp}, micro-batch 1) needs {need / 1e9:.1f} GB per GPU, "
            f"{usable / 1e9:.1f} GB usable")  # fmt: skip


def find(rows: list[dict], match: Callable[[dict], bool]) -> dict | None:
    """The first (best-ranked) row `match` accepts, or None."""
    return next((r for r in rows if match(r)), None)
