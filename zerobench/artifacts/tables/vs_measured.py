"""`model_vs_measured`: the performance model on a calibrated profile of this machine beside real
steps of `zerobench run` (workflows/config/sheets/model_vs_measured.yaml).

Per measured trial one row: on the system allocator the predicted step time against the median
over the trial's runs (the sheet's `repeat`) of each run's median step, on jemalloc the predicted
peak memory against the measured peak RSS growth of the worst rank (zerobench/runtime/allocator.py says
why each metric is taken on its allocator); beside them the model's breakdown (compute, DP and MP
collectives, optimizer) and the seconds the ledger measured in collectives per step. `expected`
is the measurement, `ours` the prediction, `error_pct` 100·(ours − expected)/expected.

Terms of the profile fitted, not measured (FITTED_TERMS): `mp_sync_table`, what an MP all-reduce
costs inside the engine's own MP steps beyond the model's collective curve (microbench/engine_runs.py),
a correction to the model's error taken from runs like the judged ones (at other shapes); and
`runtime_bytes` / `checkpoint_runtime_bytes`, a tiny model's RSS growth over its first steps less
its own tensors (calibrate's memory runs), fitted the same way for memory. Each row gives the
prediction without them too (`ours_without_fitted`, `error_without_fitted_pct`); a row whose
prediction they change has role `fitted` and names them (`fitted_terms`; artifacts/judging/common.py), and
no verdict reads it: the report gives the verdict without them beside (report.without_fitted).

Each run carries the host speed probe (runtime/probe.py), compared with the profile's: a step row
gives each run's host speed, sets aside the runs taken in a slow spell, and gives the step also
normalized by the probe (`expected_normalized`, `error_normalized_pct`; artifacts/judging/host_speed.py).
A row whose every run was in a slow spell is `slow_spell` and no verdict reads it (report.stats).

The profile is $ZEROBENCH_PROFILE, else results/profiles/calibrated-<device>.json (the workflow's
`calibrate` rule); when absent it is measured first (`zerobench calibrate`, under a minute). The
engine runs torch's fused scaled_dot_product_attention: `fused`.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from statistics import median

import numpy as np
import pandas as pd

from zerobench.artifacts.judging.host_speed import timed_runs
from zerobench.engine.config import ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.perfmodel.constants import DEFAULT
from zerobench.perfmodel.feasibility import breakdown, max_layers
from zerobench.perfmodel.hardware import HardwareProfile, get_profile
from zerobench.perfmodel.predict import predict
from zerobench.perfmodel.profile_file import profile_dir

MiB = 2**20
# the profile's fields fitted on engine runs (the module's docstring)
TIME_TERMS, MEMORY_TERMS = ("mp_sync_table",), ("runtime_bytes", "checkpoint_runtime_bytes")
FITTED_TERMS = TIME_TERMS + MEMORY_TERMS


def profile_path(device: str = "cpu") -> Path:
    return Path(os.environ.get("ZEROBENCH_PROFILE", profile_dir() / f"calibrated-{device}.json"))


def calibrated_profile(device: str = "cpu") -> HardwareProfile:
    """The calibrated profile of this machine, measured now if there is none yet."""
    path = profile_path(device)
    if not path.exists():  # a process of its own: the allocator the trials run with (runtime/allocator.py)
        subprocess.run([sys.executable, "-m", "zerobench.cli", "calibrate", "--device", device, "--out", str(path)],
                       check=True)  # fmt: skip
    return get_profile(str(path))


def _configs(r: dict):
    model = ModelConfig(layers=r["layers"], hidden=r["hidden"], heads=r["heads"], seq=r["seq"], vocab=r["vocab"],
                        name=r["model"])  # fmt: skip
    parallel = ParallelConfig(dp=r["dp"], mp=r["mp"], stage=r["stage"], bucket_bytes=r["bucket_bytes"],
                              checkpoint_activations=r["checkpoint_activations"],
                              partition_activations=r["partition_activations"],
                              offload_activations=r["offload_activations"],
                              contiguous_buffers=r["contiguous_buffers"])  # fmt: skip
    return (
        model,
        parallel,
        PrecisionConfig(r["precision"], r["device"]),
        TrainConfig(micro_batch=r["micro_batch"], grad_accum=r["grad_accum"]),
    )


def predicted_peak_bytes(r: dict, hw: HardwareProfile | None = None, layers: int | None = None) -> float:
    """The calibrated model's peak memory per rank of trial `r` (at `layers` deep, if given): model
    states, activations, buffers and the runtime, as a CPU rank's RSS grows under jemalloc."""
    model, parallel, precision, train = _configs(r)
    model = dataclasses.replace(model, layers=layers or model.layers)
    hw = hw or calibrated_profile()
    return breakdown(model, parallel, precision, train.micro_batch, hw, DEFAULT, attention="fused").total_bytes


def largest_under_budget(r: dict, hw: HardwareProfile | None = None) -> float:
    """Parameters of the largest model of `r`'s width that the calibrated model fits in the trial's
    per-rank budget, activations and buffers counted (capacity). Between the deepest model that
    fits and one layer more, memory and parameters both grow linearly with depth, so the budget's
    crossing is read off that line: a size in parameters, not a whole number of layers."""
    hw = dataclasses.replace(hw or calibrated_profile(), memory_bytes=float(r["mem_cap_bytes"]))
    model, parallel, precision, train = _configs(r)
    n = max_layers(model, parallel, precision, train.micro_batch, hw, DEFAULT, attention="fused")
    if not n:
        return 0.0
    depths = (n, n + 1)
    peaks = [predicted_peak_bytes(r, hw, d) for d in depths]
    params = [dataclasses.replace(model, layers=d).num_params for d in depths]
    return float(np.interp(hw.memory_bytes, peaks, params))


def _label(r: dict) -> str:
    """The trial in a few words (a failed trial's record may lack the model's shape)."""
    shape = r.get("model") if r.get("model") != "tiny" else f"L{r['layers']} h{r['hidden']} a{r['heads']} s{r['seq']}"
    ckpt = " ckpt" if r.get("checkpoint_activations") else ""
    layout = f"dp{r.get('dp')} mp{r.get('mp')} stage {r.get('stage')} b{r.get('micro_batch')}"
    return f"{shape} {r.get('precision')} {layout}{ckpt}"


def _runs(records: list[dict]) -> list[list[dict]]:
    """The ok records grouped by trial and allocator (a trial's repeats together), in the order
    first seen; each failed record alone."""
    groups: dict[tuple, list[dict]] = {}
    for i, r in enumerate(records):
        key = (_label(r), r.get("allocator") or "system") if r["status"] == "ok" else i
        groups.setdefault(key, []).append(r)
    return list(groups.values())


def without_fitted(hw: HardwareProfile) -> HardwareProfile:
    """`hw` less its fitted terms (FITTED_TERMS), each at its datasheet default: an MP all-reduce then
    waits what the matmul benchmark's ranks wait (`sync_table`, measured), as the model reads it where
    no MP steps ran, and a rank's memory is its tensors alone."""
    defaults = {f.name: f.default for f in dataclasses.fields(hw)}
    return dataclasses.replace(hw, **{field: defaults[field] for field in FITTED_TERMS})


def model_vs_measured(records: list[dict], hw: HardwareProfile | None = None) -> pd.DataFrame:
    hw = hw or calibrated_profile()
    bare_hw = without_fitted(hw)
    rows = []
    for runs in _runs(records):
        r = runs[0]
        key = _label(r)
        if r["status"] != "ok":
            rows.append(dict(key=f"{key}: step", source="measured", status=r["status"], error=r.get("error"),
                             role="judged"))  # fmt: skip
            continue
        pred = predict(*_configs(r), hw, attention="fused")
        bare = predict(*_configs(r), bare_hw, attention="fused")
        allocator = r.get("allocator") or "system"
        common = dict(source="modelled vs measured", status="ok", hardware=hw.name, dp=r["dp"], mp=r["mp"],
                      stage=r["stage"], micro_batch=r["micro_batch"], num_params=r["num_params"],
                      allocator=allocator, runs=len(runs))  # fmt: skip
        # Time on the allocator users run (glibc); memory where RSS is the tensors (jemalloc): under
        # glibc RSS adds 40-110 % of allocator retention, under jemalloc steps slow (runtime/allocator.py).
        if allocator == "system":
            timed, host = timed_runs(runs, hw.host_probe)  # runs in a slow spell set aside (host_speed.py)
            steps = [run["step_time_s"] for run in timed]  # each run's median step (s)
            every = [run["step_time_s"] for run in runs]
            ledger = [sum(e["seconds"] for e in (run.get("comm") or {}).values()) / run["steps"] for run in runs]
            rows.append(dict(
                key=f"{key}: step (s)", series="step time (s)", ours=pred.step_time_s, expected=median(steps),
                ours_without_fitted=bare.step_time_s, **_role(pred.step_time_s, bare.step_time_s, TIME_TERMS),
                compute_s=pred.compute_s, dp_comm_s=pred.dp_comm_s, mp_comm_s=pred.mp_comm_s + pred.host_copy_s,
                optimizer_s=pred.optimizer_s, measured_comm_s=median(ledger),
                measured_runs_s=" ".join(f"{v:.4g}" for v in every),
                runs_spread_pct=100 * (max(every) - min(every)) / median(every), **host, **common,
            ))  # fmt: skip
        if allocator == "jemalloc":  # one run: memory does not wander with the host's speed
            rows.append(dict(
                key=f"{key}: peak memory (MiB)", series="peak memory (MiB)", ours=pred.memory.total_bytes / MiB,
                ours_without_fitted=bare.memory.total_bytes / MiB,
                **_role(pred.memory.total_bytes, bare.memory.total_bytes, MEMORY_TERMS),
                expected=r["rss_growth_bytes"] / MiB, model_states_mib=pred.memory.model_state_bytes / MiB,
                activations_mib=pred.memory.activation_bytes / MiB, buffers_mib=pred.memory.buffer_bytes / MiB,
                **common,
            ))  # fmt: skip
    df = pd.DataFrame(rows)
    df["paper"] = None  # not a paper artifact: the reference is the measurement (`expected`)
    df["error_pct"] = 100 * (df.ours - df.expected) / df.expected
    df["error_without_fitted_pct"] = 100 * (df.ours_without_fitted - df.expected) / df.expected
    normalized = pd.to_numeric(df["expected_normalized"], errors="coerce") if "expected_normalized" in df else np.nan
    df["error_normalized_pct"] = 100 * (df.ours - normalized) / normalized
    return df


def _role(with_fitted: float, without: float, terms: tuple[str, ...]) -> dict:
    """`fitted` (and the `terms` that can move this quantity) where the fitted terms change the
    prediction, else `judged`."""
    if with_fitted == without:
        return dict(role="judged", fitted_terms="")
    return dict(role="fitted", fitted_terms=" ".join(terms))
