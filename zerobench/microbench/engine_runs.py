"""The calibrate benchmarks that run the engine itself (`zerobench run` in a fresh process, one
intra-op thread per rank as the workflow runs its ranks): what a process costs beyond its tensors,
and what an MP all-reduce costs inside a training step beyond its measured curve.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from zerobench.engine.config import ParallelConfig, PrecisionConfig, TrainConfig, preset
from zerobench.perfmodel import network, predict
from zerobench.perfmodel.engine_memory import engine_peak, tensor_peak
from zerobench.perfmodel.hardware import PROFILES, HardwareProfile
from zerobench.perfmodel.kernels import ENGINE_ATTENTION
from zerobench.runtime import allocator

# The MP step benchmark's models: tiny's 2 layers and vocabulary at (hidden, seq, micro-batch),
# whose activation all-reduces are 128-512 KiB (where the measured curve is flat) and whose compute
# between two all-reduces spans what cpu-sized models run (docs/perfmodel.md, calibrated profiles).
# None is the shape of a trial the model is judged on.
MP_STEP_SHAPES = ((128, 128, 2), (512, 64, 4), (1024, 32, 4))
MP_STEP_STEPS = 10  # timed steps per run
MP_STEP_ROUNDS = 3  # runs of each shape (a smoke profile: 1)


def _run(args: list[str]) -> dict:
    """The record of `zerobench run ARGS` in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        cmd = [sys.executable, "-m", "zerobench.cli", "run", "--out", out, *args]
        # both pools: Snakemake sets OMP_ and MKL_NUM_THREADS to a job's threads (calibrate's: 2), and
        # MKL's GEMMs on two threads per rank slow the MP steps' all-reduces (docs/engine-measurements.md)
        threads = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, **threads})
        return json.loads(Path(out).read_text())


def runtime_bytes(log) -> tuple[float, float]:
    """(runtime, checkpointing's runtime): RSS a fresh process gains by running a tiny model's
    first steps (one rank) beyond the tensors the engine holds at its peak
    (perfmodel/engine_memory.py): code paged in, thread pools, the allocator's own; and what the
    same run gains more with activation checkpointing, whose recomputation calls autograd's
    backward inside backward (none of it tensors). Measured under the allocator this process runs
    with (the workflow's calibrate: glibc; the memory trials it predicts run jemalloc, under which
    the tiny model reads about the same: docs/perfmodel.md gives the readings)."""

    model, precision, b = preset("tiny"), PrecisionConfig("fp32", "cpu"), TrainConfig().micro_batch
    beyond = []
    for ckpt in (False, True):
        args = [
            "--model",
            model.name,
            "--precision",
            "fp32",
            "--micro-batch",
            str(b),
            "--steps",
            "2",
            "--warmup",
            "1",
            "--allocator",
            allocator.in_use(),
            *(["--checkpoint-activations"] if ckpt else []),
        ]
        growth = _run(args)["rss_growth_bytes"]
        peak = engine_peak(model, ParallelConfig(checkpoint_activations=ckpt), precision, b, PROFILES["v100-32gb-dgx2"])
        beyond.append(max(0.0, growth - tensor_peak(peak)))
    runtime, ckpt = beyond[0], max(0.0, beyond[1] - beyond[0])
    log(
        f"runtime: {runtime / 2**20:.1f} MiB of RSS beyond the tensors (tiny model), "
        f"{ckpt / 2**20:.1f} MiB more with activation checkpointing"
    )
    return runtime, ckpt


def mp_step_waits(profile: HardwareProfile, log, rounds: int = MP_STEP_ROUNDS) -> list[list[float]]:
    """Rows (MP group size 2, seconds of compute between two MP all-reduces as `profile` models it,
    seconds each all-reduce takes beyond `profile`'s measured curve) of the engine's own MP 2 steps,
    one row per shape of MP_STEP_SHAPES: the median over `rounds` runs of each, the shapes taking
    turns. On a CPU host an all-reduce inside a step can cost more than the same one called back to
    back (the curve), for reasons no simpler benchmark reproduced (docs/perfmodel.md gives the
    readings), so the engine's own MP step measures it, at shapes no judged trial has; a shape's
    runs vary over time, hence rounds in turn and medians. A fitted term: judged on no row.
    Raises if the engine ran another number of MP all-reduces than the model counts
    (perfmodel/network.py, `mp_calls_per_step`)."""

    curve_only = dataclasses.replace(profile, sync_table=(), mp_sync_table=())
    calls = network.mp_calls_per_step(preset("tiny").layers, False, 1)
    shapes = []
    for hidden, seq, b in MP_STEP_SHAPES:
        model = dataclasses.replace(preset("tiny"), hidden=hidden, seq=seq)
        modelled = predict(
            model,
            ParallelConfig(mp=2),
            PrecisionConfig("fp32", "cpu"),
            TrainConfig(micro_batch=b),
            curve_only,
            attention=ENGINE_ATTENTION,
        )
        shapes.append((model, b, modelled, []))
    for i in range(rounds):
        for model, b, modelled, per_call in shapes:
            args = [
                "--model",
                model.name,
                "--seq",
                str(model.seq),
                "--hidden",
                str(model.hidden),
                "--mp",
                "2",
                "--precision",
                "fp32",
                "--micro-batch",
                str(b),
                "--steps",
                str(MP_STEP_STEPS),
            ]
            record = _run(args)
            entry = record["comm"]["all_reduce/mp"]
            ran = entry["calls"] / record["steps"]
            if ran != calls:
                raise RuntimeError(f"the engine ran {ran:g} MP all-reduces per step; the model counts {calls}")
            per_call.append(entry["seconds"] / record["steps"] / calls)
            log(
                f"MP step h{model.hidden} s{model.seq} b{b} ({i + 1}/{rounds}): {per_call[-1] * 1e3:.2f} ms per "
                f"all-reduce; the curve gives {modelled.mp_comm_s / calls * 1e3:.2f}"
            )
    return [
        [2, modelled.compute_s / calls, max(0.0, statistics.median(per_call) - modelled.mp_comm_s / calls)]
        for _, _, modelled, per_call in shapes
    ]
