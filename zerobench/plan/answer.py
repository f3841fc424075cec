"""A plan's answer for a person and for a file: the top layouts as a table, every layout as a CSV."""

from __future__ import annotations

import csv
import os
import tempfile
from pathlib import Path

from zerobench.plan.request import PlanRequest

# the CSV's leading columns, in order; a verify adds its own after them
COLUMNS = ("rank", "layout", "checked", "tokens_per_s", "tflops_per_gpu", "mfu", "step_time_s", "memory_bytes",
           "usable_bytes", "headroom_bytes", "band_pct", "band_basis", "frontier", "mp", "dp", "stage", "micro_batch",
           "grad_accum", "checkpoint_activations", "partition_activations", "offload_activations", "contiguous_buffers",
           "bucket_mb")  # fmt: skip


def shown(rows: list[dict], top: int) -> list[dict]:
    """The `top` fastest distinct layouts: of layouts the model prices alike (one rank), the first
    (least memory), with `alike` the count of the others."""
    out = []
    for r in rows:
        if out and out[-1]["rank"] == r["rank"]:
            out[-1]["alike"] += 1
            continue
        if len(out) == top:
            break
        out.append({**r, "alike": 0})
    return out


def heading(req: PlanRequest, rows: list[dict]) -> str:
    hw, m = req.profile, req.model
    batch = f"global batch {req.global_batch}" if req.global_batch else "one micro-batch a step"
    return (
        f"{m.name} ({m.num_params / 1e9:.1f}B params, seq {m.seq}) on {req.gpus} x {hw.gpu} ({hw.name}), "
        f"{req.precision}, {req.attention} attention, {batch}: {len(rows)} layouts fit"
    )


def table(req: PlanRequest, rows: list[dict], top: list[dict]) -> str:
    """The `top` layouts of `rows` as a text table: speed, memory against the usable bytes with the
    headroom, the regime's band and how each row was checked."""
    head = f"{'rank':>4}  {'layout':52s} {'tokens/s':>10} {'TFLOPS/GPU':>10} {'memory GB':>17} {'band':>16}  checked"
    lines = [heading(req, rows), "", head]
    for r in top:
        usable = r["usable_bytes"]
        mem = f"{r['memory_bytes'] / 1e9:.1f}/{usable / 1e9:.1f} ({r['headroom_bytes'] / usable:+.0%})"
        band = f"±{r['band_pct']:g}%" + ("" if r["band_basis"].startswith("regime") else " pooled")
        alike = f" (+{r['alike']} alike)" if r.get("alike") else ""
        speed = f"{r['tokens_per_s']:>10.4g} {r['tflops_per_gpu']:>10.1f}"
        lines.append(f"{r['rank']:>4}  {r['layout'] + alike:52s} {speed} {mem:>17} {band:>16}  {r['checked']}")
    lines.append("memory: the layout's peak (training or construction) / usable per GPU (headroom); band: the "
                 "held-out error of the regime's modelled speed, or the pooled band where the regime has too few "
                 "validation runs (perfmodel/error_bands.py)")  # fmt: skip
    return "\n".join(lines)


def write_csv(rows: list[dict], path: str | os.PathLike) -> None:
    """Every row, COLUMNS first then whatever a verify added; written atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = [k for r in rows for k in r if k not in COLUMNS]
    fields = [*COLUMNS, *dict.fromkeys(extra)]
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)
