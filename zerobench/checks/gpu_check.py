"""The GPU check, run once on a lent GPU by scripts/gpu_check.sh: measured steps beside the
performance model.

Sweeps the micro-batch for two presets that fit one GPU (stages 0 and 3, dp = 1, bf16, activation
checkpointing), each trial `zerobench run` in its own process (an OOM ends only that trial), and
puts every measured record beside the model's prediction for the same trial: on the datasheet
profile of the device (the record's `hardware`) and, when given, on the profile `zerobench
calibrate` measured on it just before. The prediction uses the attention kernel the engine runs
(perfmodel/kernels.py, ENGINE_ATTENTION). `OUT/compare.csv`: one row per trial, each predicted
number with its error 100·(predicted − measured)/measured.

The card decides what runs: every trial is traced first, with CUDA's semantics (checks/card.py), and
runs only where its trace fits the card; the others are `skipped` rows saying why. Gates: every
trial that ran stays within its trace plus the allocator's slack, none errors, times out or runs
out of memory, and every trial at micro-batch 1 that fits runs (`gates`).

`--compare DIR` remakes DIR/compare.csv from the records already in DIR/runs (no GPU, no run): the
current model's predictions beside the measurements, on the datasheet profile and, when
DIR/calibrated-cuda.json exists, on that calibrated profile, given the allocator's fragmentation the
records measured where calibrate measured none (`with_measured_margins`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from zerobench import record_files
from zerobench.checks.card import CARD_ENV, Card, bound_bytes, misfit
from zerobench.perfmodel import model_record, profile_file
from zerobench.perfmodel.kernels import ENGINE_ATTENTION
from zerobench.trial import configs
from zerobench.trial.fields import FIELDS, takes

CLI_ENV = "GPU_CHECK_CLI"  # a command standing in for `python -m zerobench.cli` (a rehearsal on a CPU)
PRESETS = ("dp-6b", "gpt-1.5b")  # dp-6b first: the larger, and the one the peak gate reads
STAGES = (0, 3)
MICRO_BATCHES = (1, 4, 16)
COLUMNS = ("model", "stage", "micro_batch", "status", "hardware", "step_time_s", "tflops_per_gpu", "mfu",
           "peak_allocated_bytes", "peak_reserved_bytes")  # fmt: skip
# measured column -> the prediction's column of the same quantity (a modelled record's)
PREDICTED = {"tflops_per_gpu": "tflops", "peak_allocated_bytes": "peak_bytes"}


def trial(model: str, stage: int, micro_batch: int) -> dict:
    """The trial's fields (zerobench/trial/fields.py): what `zerobench run` is given and what the model
    predicts, from the same mapping."""
    # eager: a compile per trial, each in a process of its own, would spend the check's time
    # compiling cold (the GPU tests compile once, in one test)
    return {
        "model": model,
        "stage": stage,
        "micro_batch": micro_batch,
        "precision": "bf16",
        "device": "cuda",
        "checkpoint_activations": True,
        "steps": 3,
        "warmup": 1,
        "compile": "off",
    }


def flags(values: dict) -> list[str]:
    """`zerobench run`'s flags for trial `values` (a switch given when true)."""

    out = []
    for name, value in values.items():
        option = FIELDS[name].option
        out += ([option] if value else []) if FIELDS[name].kind is bool else [option, str(value)]
    return out


def run_cli(command: str, values: dict, out: Path, timeout: float) -> dict:
    """`zerobench <command>` of trial `values` in its own process (an OOM or a crash ends only it);
    its record; a `timeout` row where it was killed at `timeout` seconds before writing one; an
    `error` row naming the exit status and the child's last line where it ended without one."""
    cli = shlex.split(os.environ[CLI_ENV]) if os.environ.get(CLI_ENV) else [sys.executable, "-m", "zerobench.cli"]
    cmd = [*cli, command, *flags(values), "--out", str(out)]
    out.unlink(missing_ok=True)  # a record left by an earlier run is not this one's
    try:
        done = subprocess.run(cmd, timeout=max(1.0, timeout), check=False, stderr=subprocess.PIPE, text=True)
    except subprocess.TimeoutExpired:
        done = None
    if done is not None:
        sys.stderr.write(done.stderr)  # the child's log stays in the part's log
    if out.exists():
        return record_files.read_record(out)
    if done is None:
        return {**values, "status": "timeout", "error": f"zerobench {command}: no record after {timeout:.0f} s"}
    last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {
        **values,
        "status": "error",
        "error": f"zerobench {command} exited with status {done.returncode} without a record: {last}",
    }


def trace_all(trials: list[dict], out: Path, timeout: float, workers: int) -> list[dict]:
    """Each trial's trace (`zerobench trace` with the trial's own device, so a CUDA trial is traced
    with CUDA's semantics: 16-bit compute), `workers` processes at a time, into `out`."""
    out.mkdir(parents=True, exist_ok=True)

    def one(values: dict) -> dict:
        name = f"{values['model']}-s{values['stage']}-mb{values['micro_batch']}.json"
        return run_cli("trace", {k: v for k, v in values.items() if takes("trace", k)}, out / name, timeout)

    with ThreadPoolExecutor(max(1, workers)) as pool:
        return list(pool.map(one, trials))


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

    records = [record_files.read_record(path) for path in sorted((directory / "runs").glob("*.json"))]
    records.sort(key=lambda r: (PRESETS.index(r["model"]), r["stage"], r["micro_batch"]))
    calibrated = directory / profile
    on_card = with_measured_margins(calibrated, records) if calibrated.exists() else None
    rows = [compare_row(r, values_of(r), {"": r.get("hardware"), "calibrated_": on_card}) for r in records]
    pd.DataFrame(rows).to_csv(directory / "compare.csv", index=False)
    return rows


def _name(values: dict) -> str:
    return f"{values['model']} stage {values['stage']} mb {values['micro_batch']}"


def _row(values: dict, status: str, error: str | None, traced_peak: float | None = None) -> dict:
    """A compare.csv row of a trial that did not run (or whose trace failed)."""
    return {**{k: values.get(k) for k in COLUMNS}, "status": status, "error": error, "traced_peak_bytes": traced_peak}


def plan(card: Card, trials: list[dict], traces: list[dict]) -> tuple[list[tuple[dict, float]], list[dict]]:
    """What runs on `card`: each trial whose trace (`traces`, in the same order) fits it, with its
    traced peak; and a row for each that will not run: `skipped` saying why it does not fit, or
    `error` where its trace failed."""
    planned, rows = [], []
    for values, trace in zip(trials, traces, strict=True):
        peak = trace.get("peak_allocated_bytes")
        if trace.get("status") != "ok":
            rows.append(_row(values, "error", f"trace {trace.get('status')}: {trace.get('error')}"))
        elif why := misfit(trace, card):
            rows.append(_row(values, "skipped", why, peak))
        else:
            planned.append((values, peak))
    return planned, rows


def sweep(planned: list[tuple[dict, float]], runs: Path, budget_s: float, calibrated: str | None) -> list[dict]:
    """Each planned trial run (`run_cli`) while the budget lasts, beside the model; a trial after one
    of the same preset and stage that did not run ok is not started (a larger micro-batch fits no
    better), nor one the budget leaves under 20 s: `not_run` rows saying why."""
    start, rows, failed_at = time.monotonic(), [], {}
    for values, traced_peak in planned:
        left = budget_s - (time.monotonic() - start)
        key = (values["model"], values["stage"])
        if key in failed_at:
            rows.append(_row(values, "not_run", f"micro-batch {failed_at[key]} did not run ok", traced_peak))
            continue
        if left < 20:
            rows.append(_row(values, "not_run", f"budget spent ({left:.0f} s left of {budget_s:.0f})", traced_peak))
            continue
        rec = run_cli(
            "run", values, runs / f"{values['model']}-s{values['stage']}-mb{values['micro_batch']}.json", timeout=left
        )
        print(f"gpu_check: {_name(values)}: {rec['status']} {rec.get('tflops_per_gpu') or 0:.1f} TFLOPS", flush=True)
        row = compare_row(rec, values, {"": rec.get("hardware"), "calibrated_": calibrated})
        rows.append({**row, "error": rec.get("error"), "traced_peak_bytes": traced_peak})
        if rec["status"] != "ok":
            failed_at[key] = values["micro_batch"]
    return rows


def gates(rows: list[dict]) -> list[str]:
    """What fails the sweep: a trial that errored, timed out, or ran out of memory where its trace
    fits the card; a peak allocated above its trace plus the allocator's slack (card.py); a trial at
    micro-batch 1 that fits and did not run; and no trial fitting the card at all. A trial the
    card cannot hold (`skipped`) fails nothing, and passes nothing: the summary names it."""
    failed = []
    for r in rows:
        name, peak, traced = _name(r), r.get("peak_allocated_bytes"), r.get("traced_peak_bytes")
        if r["status"] in ("error", "timeout", "oom"):
            failed.append(f"{name}: {r['status']} ({r.get('error')})")
        elif r["status"] == "not_run" and r["micro_batch"] == 1:
            failed.append(f"{name}: fits the card and did not run ({r.get('error')})")
        elif r["status"] == "ok" and (peak is None or traced is None or peak > bound_bytes(traced)):
            failed.append(f"{name}: peak {peak} bytes over its trace {traced} and the allocator's slack")
    if not any(r["status"] != "skipped" for r in rows):
        failed.append("no trial fits this card")
    return failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out", type=Path, nargs="?")
    p.add_argument("--budget-s", type=float, default=240.0, help="stop starting trials after this long")
    p.add_argument("--profile", type=Path, help="a `zerobench calibrate` profile of this GPU, predicted on too")
    p.add_argument("--compare", type=Path, metavar="DIR", help="remake DIR/compare.csv from DIR/runs; no GPU")
    p.add_argument("--presets", default=",".join(PRESETS), help="models swept, in order (comma-separated)")
    p.add_argument("--card", default=os.environ.get(CARD_ENV), help="NAME=BYTES: a stand-in card (a rehearsal)")
    p.add_argument("--trace-workers", type=int, default=os.cpu_count() or 1, help="traces made at once")
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
    start = time.monotonic()
    card = Card.parse(args.card) if args.card else Card.of_device()
    trials = [trial(m, s, mb) for m in args.presets.split(",") for s in STAGES for mb in MICRO_BATCHES]
    traces = trace_all(trials, args.out / "traced", args.budget_s, args.trace_workers)
    planned, rows = plan(card, trials, traces)
    print(
        f"gpu_check: {card}: {len(planned)} of {len(trials)} trials fit by their trace "
        f"(traced in {time.monotonic() - start:.0f} s)",
        flush=True,
    )
    for r in rows:
        print(f"gpu_check: {r['status']} {_name(r)}: {r['error']}", flush=True)
    rows += sweep(planned, runs, args.budget_s - (time.monotonic() - start), calibrated)
    order = {(t["model"], t["stage"], t["micro_batch"]): i for i, t in enumerate(trials)}
    rows.sort(key=lambda r: order[(r["model"], r["stage"], r["micro_batch"])])
    pd.DataFrame(rows).to_csv(args.out / "compare.csv", index=False)
    print(pd.DataFrame(rows).to_string(), flush=True)
    failed = gates(rows)
    counts = Counter(r["status"] for r in rows)
    print(
        f"gpu_check: {len(rows)} trials: "
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        + (f"; FAILED: {'; '.join(failed)}" if failed else "; every gate passed"),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
