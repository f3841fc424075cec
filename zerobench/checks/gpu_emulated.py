"""The emulated part of the GPU check (scripts/gpu_check.sh): what one GPU can show of many ranks.

1. dp-6b at N_d 8, stages 1-3, one rank emulated on the GPU (`zerobench emulate`), each beside the
   trace of the same trial: the rank's counted tensor peak must equal the trace's exactly (a gate),
   and the caching allocator's peak is set beside it (`emulated_peaks.csv`).
2. The paper-scale emulated sheets, trial by trial while the deadline allows (Fig 3, then Fig 6:
   workflows/config/sheets/*_emulated.yaml), each trial `zerobench emulate` in its own process (a
   sheet's modelled trials, the line beside, through the model at once); each sheet's table and
   figure made from what ran (`<sheet>.csv`, `<sheet>.png`).

Every trial runs in a process of its own, killed at the time left (a `timeout` row). The card
decides what runs (checks/card.py). Exits 1 when a part 1 rank did not run and equal its trace (a
card too small for it aside), or a sheet trial errored or was killed (`failures`), and 2 when
`--device cuda` finds no CUDA device; a one-line summary names what failed; the numbers go under OUT.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from zerobench import record_files
from zerobench.checks.card import CARD_ENV, Card, cuda_only_bytes, misfit
from zerobench.checks.gpu_check import run_cli
from zerobench.engine.config import preset
from zerobench.sweeps import sheets
from zerobench.sweeps.groups import model_trial
from zerobench.trial.fields import takes

SHEETS = ("fig3_emulated", "fig6_emulated")
RESERVE_S = 20.0  # seconds kept for the tables and figures after the last trial
PEAKS = ("status", "error", "stage", "tensor_peak_bytes", "traced_peak_bytes", "peak_allocated_bytes",
         "peak_reserved_bytes", "step_time_s", "compute_s", "collective_stall_s")  # fmt: skip


def peaks(
    out: Path, deadline: float, model: str = "dp-6b", dp: int = 8, device: str = "cuda", card: Card | None = None
) -> list[dict]:
    """Part 1: each stage's emulated rank beside its trace, both on `device` (one device's semantics:
    on CUDA both compute in 16 bits): equal, on CUDA up to the tensors its kernels keep beyond the
    host's (`cuda_only_bytes`, a few KB, stated in the row). A rank whose trace does not fit `card`
    is not emulated: a `skipped` row saying why."""
    rows, shape = [], preset(model)
    # on CUDA the rank keeps a few tensors the host's kernels do not (card.py): at most these bytes
    extra = cuda_only_bytes(shape.layers, shape.seq) if device == "cuda" else 0
    for stage in (1, 2, 3):
        values = {
            "model": model,
            "dp": dp,
            "stage": stage,
            "precision": "bf16",
            "checkpoint_activations": True,
            "micro_batch": 1,
            "device": device,
        }
        trace = run_cli("trace", values, out / f"traced-{model}-dp{dp}-z{stage}.json", deadline - time.monotonic())
        if trace["status"] != "ok":
            record = {"status": "error", "error": f"trace {trace['status']}: {trace.get('error')}"}
        elif card is not None and (why := misfit(trace, card)):
            record = {"status": "skipped", "error": why}
        else:
            run = {**values, "compile": "off", "steps": 2, "warmup": 1}
            path = out / f"emulated-{model}-dp{dp}-z{stage}.json"
            record = run_cli("emulate", run, path, deadline - time.monotonic())
        row = {k: record.get(k) for k in PEAKS}
        row.update(stage=stage, traced_peak_bytes=trace.get("peak_allocated_bytes"), cuda_only_bytes=extra)
        above = (row["tensor_peak_bytes"] or 0) - (row["traced_peak_bytes"] or 0)
        row["equal"] = row["status"] == "ok" and 0 <= above <= extra
        rows.append(row)
        print(
            f"gpu_emulated: {model} N_d {dp} stage {stage}: {row['status']}, tensor peak "
            f"{row['tensor_peak_bytes']} vs traced {row['traced_peak_bytes']}"
            + (f" ({row['error']})" if row["error"] else ""),
            flush=True,
        )
    return rows


def failures(rows: list[dict], records: list[dict]) -> list[str]:
    """What fails the emulated part: part 1's rank that did not run and equal its trace, unless the
    card cannot hold it (`skipped`); a sheet trial that errored or was killed (`timeout`). A sheet
    trial out of memory is a result (the largest that fits found none)."""
    out = []
    for r in rows:
        if r["status"] == "ok" and not r["equal"]:
            out.append(f"stage {r['stage']}: tensor peak {r['tensor_peak_bytes']} != traced {r['traced_peak_bytes']}")
        elif r["status"] not in ("ok", "skipped"):
            out.append(f"stage {r['stage']}: {r['status']} ({r['error']})")
    out += [
        f"{r.get('trial') or r.get('model')}: {r['status']} ({r.get('error')})"
        for r in records
        if r["status"] in ("error", "timeout")
    ]
    return out


def sheet(name: str, out: Path, deadline: float, device: str | None = None, card: Card | None = None) -> list[dict]:
    """Part 2 for one sheet: its emulated trials while time is left, then its table and figure. A
    trial whose memory cap is more than `card` leaves the allocator is not run (said why)."""
    # pandas and matplotlib: not for the trials' processes
    from zerobench.artifacts.plots.draw import plot
    from zerobench.artifacts.tables.build import build

    path = Path(name) if name.endswith(".yaml") else sheets.SHEET_DIR / f"{name}.yaml"
    spec, name = sheets.load_sheet(path), path.stem
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    records, files = [], []
    trials = [t for group in sheets.sheet_trials(spec) for t in group]
    for trial in trials:  # a sheet's modelled trials (the line beside): the model's, no device, at once
        if trial["source"] == "modelled":
            record_files.write_record(model_trial(trial), runs / f"{sheets.trial_id(trial)}.json")
    for trial in [t for t in trials if t["source"] == "emulated"]:
        record_path = runs / f"{sheets.trial_id(trial)}.json"
        left = deadline - time.monotonic() - RESERVE_S
        if left < 30:
            print(f"gpu_emulated: {name}: no time left for {record_path.stem}", flush=True)
            continue
        values = {k: v for k, v in trial.items() if k != "source" and takes("emulate", k)}
        cap = (values.get("mem_cap_mb") or 0) * 2**20
        if card is not None and cap > card.usable_bytes():
            print(
                f"gpu_emulated: {name}: skipped {record_path.stem}: its cap {cap / 1e9:.1f} GB is more than the "
                f"{card.usable_bytes() / 1e9:.1f} GB {card.name} leaves the allocator",
                flush=True,
            )
            continue
        record = run_cli("emulate", {**values, **({"device": device} if device else {})}, record_path, left)
        records.append(record)
        files.append(str(record_path))
        print(
            f"gpu_emulated: {record_path.stem}: {record['status']} micro-batch {record.get('micro_batch')}, "
            f"{record.get('tflops_per_gpu') or 0:.1f} TFLOPS",
            flush=True,
        )
    done = [f for f in files if Path(f).exists()]
    if done:  # what the emulated trials wrote, and the modelled line beside it
        done += [str(runs / f"{sheets.trial_id(t)}.json") for t in trials if t["source"] == "modelled"]
        table = spec["table"]
        build(table, done, str(path)).to_csv(out / f"{name}.csv", index=False)
        plot(table, out / f"{name}.csv", out / f"{name}.png", spec["title"])
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("--deadline-s", type=float, default=240.0, help="seconds from now to stop starting trials")
    p.add_argument("--sheets", default=",".join(SHEETS), help="emulated sheets to run, in order (comma-separated)")
    p.add_argument("--model", default="dp-6b", help="part 1's model")
    p.add_argument("--dp", type=int, default=8, help="part 1's N_d")
    p.add_argument("--device", default="cuda", choices=("cpu", "cuda"), help="where the ranks run (cpu: tests)")
    p.add_argument("--card", default=os.environ.get(CARD_ENV), help="NAME=BYTES: a stand-in card (a rehearsal)")
    args = p.parse_args(argv)
    import pandas as pd
    import torch  # the device's own answer, before any trial is started

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_emulated: FAILED: device=cuda: no CUDA device is available here", file=sys.stderr, flush=True)
        return 2
    card = Card.parse(args.card) if args.card else Card.of_device() if args.device == "cuda" else None
    deadline = time.monotonic() + args.deadline_s
    args.out.mkdir(parents=True, exist_ok=True)
    rows = peaks(args.out, deadline, args.model, args.dp, args.device, card)
    pd.DataFrame(rows).to_csv(args.out / "emulated_peaks.csv", index=False)
    records = [r for name in filter(None, args.sheets.split(",")) for r in sheet(name, args.out, deadline,
                                                                                  args.device, card)]  # fmt: skip
    failed = failures(rows, records)
    skipped = [r["stage"] for r in rows if r["status"] == "skipped"]
    ok = sum(r["status"] == "ok" for r in records)
    print(
        f"gpu_emulated: peaks {sum(r['equal'] for r in rows)}/{len(rows)} equal to the trace"
        f"{f' (stages {skipped} skipped: the card cannot hold them)' if skipped else ''}; sheets {ok} ok of "
        f"{len(records)} run" + (f"; FAILED: {'; '.join(failed)}" if failed else "; every gate passed"),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
