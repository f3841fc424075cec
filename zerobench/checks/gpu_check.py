"""The GPU check, run once on a lent GPU by scripts/gpu_check.sh: measured steps beside the
performance model.

Sweeps the micro-batch for two presets that fit one GPU (stages 0 and 3, dp = 1, bf16, activation
checkpointing), each trial `zerobench run` in its own process (an OOM ends only that trial), and
puts every measured record beside the model's prediction for the same trial: on the datasheet
profile of the device (the record's `hardware`) and, when given, on the profile `zerobench
calibrate` measured on it just before. The prediction uses the attention kernel the engine runs
(perfmodel/kernels.py, ENGINE_ATTENTION). `OUT/compare.csv`: one row per trial, each predicted
number with its error 100·(predicted − measured)/measured.

`--compare DIR` remakes DIR/compare.csv from the records already in DIR/runs (no GPU, no run): the
current model's predictions beside the measurements, on the datasheet profile and, when
DIR/calibrated-cuda.json exists, on that calibrated profile, given the allocator's fragmentation the
records measured where calibrate measured none (`with_measured_margins`).
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import time
from pathlib import Path

from zerobench import results
from zerobench.engine.fields import FIELDS
from zerobench.engine.trial import configs
from zerobench.perfmodel import model_record, profile_file
from zerobench.perfmodel.kernels import ENGINE_ATTENTION

PRESETS = ("dp-6b", "gpt-1.5b")  # dp-6b first: the larger, and the one the peak gate reads
STAGES = (0, 3)
MICRO_BATCHES = (1, 4, 16)
PEAK_GATE = ("dp-6b", 1, 100e9)  # (model, micro-batch, bytes): its peak allocated above this fails the check
COLUMNS = ("model", "stage", "micro_batch", "status", "hardware", "step_time_s", "tflops_per_gpu", "mfu",
           "peak_allocated_bytes", "peak_reserved_bytes")  # fmt: skip
# measured column -> the prediction's column of the same quantity (a modelled record's)
PREDICTED = {"tflops_per_gpu": "tflops", "peak_allocated_bytes": "peak_bytes"}


def trial(model: str, stage: int, micro_batch: int) -> dict:
    """The trial's fields (zerobench/engine/fields.py): what `zerobench run` is given and what the model
    predicts, from the same mapping."""
    # eager: a compile per trial, each in a process of its own, would spend the check's time
    # compiling cold (the GPU tests compile once, in one test)
    return {"model": model, "stage": stage, "micro_batch": micro_batch, "precision": "bf16", "device": "cuda",
            "checkpoint_activations": True, "steps": 3, "warmup": 1, "compile": "off"}  # fmt: skip


def flags(values: dict) -> list[str]:
    """`zerobench run`'s flags for trial `values` (a switch given when true)."""

    out = []
    for name, value in values.items():
        option = FIELDS[name].option
        out += ([option] if value else []) if FIELDS[name].kind is bool else [option, str(value)]
    return out


def run_cli(command: str, values: dict, out: Path, timeout: float) -> dict:
    """`zerobench <command>` of trial `values` in its own process (an OOM or a crash ends only it);
    its record, or a `timeout` row where it wrote none in time."""
    cmd = [sys.executable, "-m", "zerobench.cli", command, *flags(values), "--out", str(out)]
    try:
        subprocess.run(cmd, timeout=max(1.0, timeout), check=False)
    except subprocess.TimeoutExpired:
        pass
    if out.exists():
        return results.read_record(out)
    return {"status": "timeout", "error": f"no record after {timeout:.0f} s", **values}


def prediction(values: dict, hardware) -> dict:
    """The modelled record of trial `values` on the profile `hardware` (a name, a profile path or a profile),
    one GPU per node, with the engine's attention kernel."""

    model, parallel, precision, train = configs({**values, "command": "run"})
    return model_record(model, parallel, precision, train, hardware, gpus_per_node=1, attention=ENGINE_ATTENTION)


def error_pct(predicted: float | None, measured: float | None) -> float | None:
    return None if not predicted or not measured else 100.0 * (predicted - measured) / measured


def compare_row(record: dict, values: dict, profiles: dict) -> dict:
    """One row of compare.csv: the measured columns and, for an ok record, per profile (prefix ->
    hardware) each prediction and its error. The datasheet profile is the record's own `hardware`
    (None where the device has no profile: nothing predicted on it)."""
    row = {k: record.get(k) for k in COLUMNS}
    if record.get("status") != "ok":
        return row
    for prefix, hardware in profiles.items():
        if hardware is None:
            continue
        pred = prediction(values, hardware)
        for measured, name in PREDICTED.items():
            row[f"{prefix}predicted_{name}"] = pred[measured]
            row[f"{prefix}{name}_error_pct"] = error_pct(pred[measured], record[measured])
    return row


def values_of(record: dict) -> dict:
    """The trial's fields (`trial`) of a record on disk."""
    return trial(record["model"], record["stage"], record["micro_batch"])


def with_measured_margins(path: Path, records: list[dict]):
    """The calibrated profile at `path`, with the caching allocator's fragmentation the sweep measured on
    the same card (the largest of its records' `fragmentation_bytes`) where calibrate measured none."""
    profile = profile_file.load(path)
    measured = [r["fragmentation_bytes"] for r in records if r.get("fragmentation_bytes") is not None]
    if profile.fragmentation_bytes is None and measured:
        profile = dataclasses.replace(profile, fragmentation_bytes=float(max(measured)))
    return profile


def compare(directory: Path, profile: str = "calibrated-cuda.json") -> list[dict]:
    """compare.csv's rows remade from the records in `directory`/runs (sweep order: preset, stage,
    micro-batch) by the current model; written to `directory`/compare.csv."""
    import pandas as pd

    records = [results.read_record(path) for path in sorted((directory / "runs").glob("*.json"))]
    records.sort(key=lambda r: (PRESETS.index(r["model"]), r["stage"], r["micro_batch"]))
    calibrated = directory / profile
    on_card = with_measured_margins(calibrated, records) if calibrated.exists() else None
    rows = [compare_row(r, values_of(r), {"": r.get("hardware"), "calibrated_": on_card}) for r in records]
    pd.DataFrame(rows).to_csv(directory / "compare.csv", index=False)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out", type=Path, nargs="?")
    p.add_argument("--budget-s", type=float, default=240.0, help="stop starting trials after this long")
    p.add_argument("--profile", type=Path, help="a `zerobench calibrate` profile of this GPU, predicted on too")
    p.add_argument("--compare", type=Path, metavar="DIR", help="remake DIR/compare.csv from DIR/runs; no GPU")
    args = p.parse_args(argv)
    import pandas as pd

    if args.compare is not None:
        print(pd.DataFrame(compare(args.compare)).to_string(), flush=True)
        return 0
    if args.out is None:
        p.error("OUT is required unless --compare is given")
    runs = args.out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    calibrated = str(args.profile) if args.profile and args.profile.exists() else None
    if args.profile and not calibrated:
        print(f"gpu_check: no calibrated profile at {args.profile}; the datasheet profile only", flush=True)
    start, rows = time.monotonic(), []
    for model in PRESETS:
        for stage in STAGES:
            for mb in MICRO_BATCHES:
                left = args.budget_s - (time.monotonic() - start)
                if left < 20:
                    print(f"gpu_check: budget spent; skipping {model} stage {stage} micro-batch {mb}", flush=True)
                    continue
                values = trial(model, stage, mb)
                rec = run_cli("run", values, runs / f"{model}-s{stage}-mb{mb}.json", timeout=left)
                print(f"gpu_check: {model} stage {stage} mb {mb}: {rec['status']} "
                      f"{rec.get('tflops_per_gpu') or 0:.1f} TFLOPS", flush=True)  # fmt: skip
                rows.append(compare_row(rec, values, {"": rec.get("hardware"), "calibrated_": calibrated}))
                if rec["status"] != "ok":
                    break  # larger micro-batches will not fit either
    pd.DataFrame(rows).to_csv(args.out / "compare.csv", index=False)
    print(pd.DataFrame(rows).to_string(), flush=True)
    failed = gates(rows)
    print(f"gpu_check: {len(rows)} trials, {sum(r['status'] == 'ok' for r in rows)} ok"
          + (f"; FAILED: {'; '.join(failed)}" if failed else "; every gate passed"), flush=True)  # fmt: skip
    return 1 if failed else 0


def gates(rows: list[dict]) -> list[str]:
    """What fails the check: a trial that errored, and the gated trial's peak above its bound (or the
    gated trial not run at all)."""
    failed = [f"{r['model']} stage {r['stage']} mb {r['micro_batch']}: {r['status']}" for r in rows
              if r["status"] == "error"]  # fmt: skip
    model, mb, bound = PEAK_GATE
    gated = [r for r in rows if r["model"] == model and r["micro_batch"] == mb]
    if not gated:
        failed.append(f"{model} mb {mb} did not run")
    for r in gated:
        peak = r.get("peak_allocated_bytes")
        if r["status"] != "ok" or peak is None or peak > bound:
            failed.append(f"{model} stage {r['stage']} mb {mb}: peak {peak} bytes, gate {bound:.0f} ({r['status']})")
    return failed


if __name__ == "__main__":
    sys.exit(main())
