"""The CI smoke benchmark: the machine-independent numbers of a few small trials, gated against a
committed baseline, and same-run timing ratios, reported only.

Gated, exactly: model-state bytes per rank (paper §5: (2 + 2 + K)Ψ split by stage), the comms
ledger's calls and bytes per collective and group (§7), and the traced engine's memory by
category. Gated with a tolerance: the training loss at every step (`LOSS_RTOL`). A change to any
of them fails until the baseline is rewritten (`--update`) in the same commit, so a reviewer sees
the new numbers beside the code that moved them. No torch import.

    python -m zerobench.checks.smoke RECORD.json... --baseline FILE [--update] --out RESULT.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

# Relative tolerance on losses. Steps are bit-identical run to run here (one thread per rank, gloo
# sums two ranks in a fixed order); another CPU or thread count may reorder a reduction and move
# the last bits (~1e-7 relative in fp32). A change in the mathematics moves the loss by far more.
LOSS_RTOL = 1e-5
STATE_FIELDS = ("param_bytes", "grad_bytes", "optimizer_bytes")
TRACED_FIELDS = ("activation_bytes", "peak_allocated_bytes", "temporary_bytes")


def numbers(record: dict) -> dict:
    """The gated numbers of one record."""
    fields = STATE_FIELDS + (TRACED_FIELDS if record["source"] == "traced" else ())
    out = {f: record.get(f) for f in fields}
    out["comm"] = {op: {"calls": c["calls"], "bytes": c["bytes"]} for op, c in sorted(record["comm"].items())}
    if record.get("losses"):
        out["losses"] = record["losses"]
    out["status"] = record["status"]
    return out


def differences(current: dict, baseline: dict, path: str = "") -> list[str]:
    """Every place where `current` differs from `baseline`: exact, except losses (LOSS_RTOL)."""
    if isinstance(baseline, dict) and isinstance(current, dict):
        diffs = [f"{path}/{k}: in the baseline, not measured" for k in baseline.keys() - current.keys()]
        diffs += [f"{path}/{k}: measured, not in the baseline" for k in current.keys() - baseline.keys()]
        for k in sorted(baseline.keys() & current.keys()):
            diffs += differences(current[k], baseline[k], f"{path}/{k}")
        return diffs
    if path.endswith("/losses"):
        if len(current) != len(baseline):
            return [f"{path}: {len(current)} steps, baseline {len(baseline)}"]
        return [
            f"{path}[{i}]: {c!r}, baseline {b!r} (rtol {LOSS_RTOL:g})"
            for i, (c, b) in enumerate(zip(current, baseline))
            if not math.isclose(c, b, rel_tol=LOSS_RTOL)
        ]
    return [] if current == baseline else [f"{path}: {current!r}, baseline {baseline!r}"]


def timing_ratios(records: dict[str, dict]) -> dict[str, float]:
    """Median step time of each measured trial over that of the first one, all from this run."""
    timed = {name: r["step_time_s"] for name, r in records.items() if r.get("step_time_s")}
    if not timed:
        return {}
    first = next(iter(timed.values()))
    return {name: t / first for name, t in timed.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zerobench.checks.smoke", description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", help="the smoke trials' record files (named by trial id)")
    ap.add_argument("--baseline", required=True, help="the committed baseline (JSON)")
    ap.add_argument("--update", action="store_true", help="rewrite the baseline from these records")
    ap.add_argument("--out", required=True, help="this run's numbers, differences and timing ratios (JSON)")
    args = ap.parse_args(argv)
    records = {Path(p).stem: json.loads(Path(p).read_text()) for p in args.records}
    current = {name: numbers(r) for name, r in records.items()}
    baseline_path = Path(args.baseline)
    if args.update:
        baseline_path.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    baseline = json.loads(baseline_path.read_text()) if baseline_path.exists() else {}
    diffs = differences(current, baseline) if baseline else ["no baseline: run with --update and commit it"]
    ratios = timing_ratios(records)
    result = dict(ok=not diffs, differences=diffs, timing_ratios_not_gated=ratios, numbers=current)
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    for name, ratio in ratios.items():
        print(f"step time {name} / {next(iter(ratios))}: {ratio:.2f} (this run; not gated)")
    for d in diffs:
        print(f"CHANGED {d}", file=sys.stderr)
    if diffs:
        print(
            f"smoke: {len(diffs)} number(s) differ from {args.baseline}; if the change is intended, "
            "rerun with --update (make smoke-baseline) and commit the baseline with it",
            file=sys.stderr,
        )
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
