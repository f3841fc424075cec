"""The GPU check (project issue 9), run once on a lent GPU by scripts/gpu_check.sh.

Sweeps the micro-batch for two presets that fit one GPU (stages 0 and 3, dp = 1, bf16, activation
checkpointing), each trial `zerobench run` in its own process (an OOM ends only that trial), and
puts every measured record beside the performance model's prediction for the same configuration
on the device's hardware profile: `OUT/compare.csv` with the error of each predicted number.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from zerobench import results
from zerobench.config import ParallelConfig, PrecisionConfig, TrainConfig, preset

PRESETS = ("gpt-1.5b", "dp-6b")
STAGES = (0, 3)
MICRO_BATCHES = (1, 4, 16)
COLUMNS = ("model", "stage", "micro_batch", "status", "hardware", "step_time_s", "tflops_per_gpu", "mfu",
           "peak_allocated_bytes", "peak_reserved_bytes")  # fmt: skip


def _trial(out: Path, model: str, stage: int, micro_batch: int, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "zerobench.cli", "run", "--model", model, "--stage", str(stage),
           "--micro-batch", str(micro_batch), "--precision", "bf16", "--device", "cuda",
           "--checkpoint-activations", "--steps", "3", "--warmup", "1", "--out", str(out)]  # fmt: skip
    try:
        subprocess.run(cmd, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        pass
    if out.exists():
        return results.read_record(out)
    return {"status": "timeout", "error": f"no record after {timeout:.0f} s", "model": model, "stage": stage}


def _prediction(record: dict, hardware: str) -> dict:
    from zerobench.perfmodel import model_record

    parallel = ParallelConfig(stage=record["stage"], checkpoint_activations=True)
    train = TrainConfig(micro_batch=record["micro_batch"])
    return model_record(preset(record["model"]), parallel, PrecisionConfig("bf16"), train, hardware, gpus_per_node=1)


def _pct(ours, ref):
    return None if not ours or not ref else 100.0 * (ref - ours) / ours


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("--budget-s", type=float, default=300.0, help="stop starting trials after this long")
    args = p.parse_args(argv)
    import pandas as pd

    runs = args.out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    start, rows = time.monotonic(), []
    for model in PRESETS:
        for stage in STAGES:
            for mb in MICRO_BATCHES:
                left = args.budget_s - (time.monotonic() - start)
                if left < 20:
                    print(f"gpu_check: budget spent; skipping {model} stage {stage} micro-batch {mb}", flush=True)
                    continue
                rec = _trial(runs / f"{model}-s{stage}-mb{mb}.json", model, stage, mb, timeout=left)
                print(f"gpu_check: {model} stage {stage} mb {mb}: {rec['status']} "
                      f"{rec.get('tflops_per_gpu') or 0:.1f} TFLOPS", flush=True)  # fmt: skip
                row = {k: rec.get(k) for k in COLUMNS}
                if rec["status"] == "ok" and rec.get("hardware"):
                    pred = _prediction(rec, rec["hardware"])
                    row.update(
                        predicted_tflops=pred["tflops_per_gpu"],
                        predicted_peak_bytes=pred["peak_allocated_bytes"],
                        tflops_error_pct=_pct(rec["tflops_per_gpu"], pred["tflops_per_gpu"]),
                        peak_error_pct=_pct(rec["peak_allocated_bytes"], pred["peak_allocated_bytes"]),
                    )
                rows.append(row)
                if rec["status"] != "ok":
                    break  # larger micro-batches will not fit either
    pd.DataFrame(rows).to_csv(args.out / "compare.csv", index=False)
    print(pd.DataFrame(rows).to_string(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
