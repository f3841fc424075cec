"""A plan's answer for a person and for a file: the top layouts as a table (the tied group said
so, with what would break the tie, and what the memory was modelled for), every layout as a CSV."""

from __future__ import annotations

import csv
import os
import tempfile
from pathlib import Path

from zerobench.perfmodel.implementation import DEFAULT_IMPLEMENTATION
from zerobench.perfmodel.kernels import ENGINE_ATTENTION
from zerobench.plan.request import PlanRequest

# the CSV's leading columns, in order; a verify adds its own after them
COLUMNS = ("rank", "tied", "offered", "layout", "checked", "tokens_per_s", "tflops_per_gpu", "mfu", "step_time_s",
           "memory_bytes", "usable_bytes", "headroom_bytes", "headroom_pct", "band_pct", "band_basis", "frontier",
           "mp", "dp", "stage", "micro_batch", "grad_accum", "checkpoint_activations", "partition_activations",
           "offload_activations", "contiguous_buffers", "bucket_mb")  # fmt: skip


def shown(rows: list[dict], top: int) -> list[dict]:
    """The first `top` distinct layouts in the rows' order (rank.ranked: the tied group, then the
    fastest): of layouts the model prices alike (one rank), the first, with `alike` the count of the
    others."""
    out: dict[int, dict] = {}
    for r in rows:
        if r["rank"] in out:
            out[r["rank"]]["alike"] += 1
        elif len(out) < top:
            out[r["rank"]] = {**r, "alike": 0}
    return list(out.values())


def picks(rows: list[dict], top: int) -> list[dict]:
    """The `top` distinct layouts offered as picks (`shown` of the offered rows), or, where none
    leaves the headroom asked, of every row."""
    return shown([r for r in rows if r["offered"]] or rows, top)


def tie_note(rows: list[dict]) -> str:
    """Which layouts are tied with the top and what would break the tie; which faster ones are not
    offered (too little headroom)."""
    group = [r for r in rows if r.get("tied")]
    lines = []
    if group:
        fastest = max(group, key=lambda r: r["tokens_per_s"])
        lines.append(
            f"tied: {len(group)} layouts ({len({r['rank'] for r in group})} distinct speeds) lie within "
            f"±{fastest['band_pct']:g}% of the fastest offered ({fastest['tokens_per_s']:.4g} tokens/s), the model's "
            "band: it cannot order them, so they are shown most headroom first (the least likely to fail). "
            "What would break the tie: `--verify emulate` on a GPU (one rank's compute measured, its "
            "collectives priced) or a measured step of each on the cluster (`zerobench run`); "
            "`--verify trace` checks their memory, not their speed."
        )  # fmt: skip
    left_out = [r for r in rows if r.get("rank") is not None and not r.get("offered", True)]
    if left_out:
        faster = [r for r in left_out if not group or r["tokens_per_s"] > max(g["tokens_per_s"] for g in group)]
        lines.append(f"not offered: {len(left_out)} layouts ({len(faster)} faster than the tied group) leave less "
                     "than the --headroom free")  # fmt: skip
    return "\n".join(lines)


def memory_note(req: PlanRequest) -> str:
    """What the memory was modelled for, where it is not this engine as `--verify trace` runs it."""
    if req.implementation == DEFAULT_IMPLEMENTATION and req.attention == ENGINE_ATTENTION:
        return ""
    return (f"memory: modelled for {req.implementation} with {req.attention} attention: this engine's tensors, "
            "the attention kernel's kept s² tensors (perfmodel/attention_memory.py) and the code's own terms where "
            f"its implementation profile has them; `--verify trace` checks this engine ({DEFAULT_IMPLEMENTATION}, "
            f"{ENGINE_ATTENTION} attention), not that code")  # fmt: skip


def heading(req: PlanRequest, rows: list[dict]) -> str:
    hw, m = req.profile, req.model
    batch = f"global batch {req.global_batch}" if req.global_batch else "one micro-batch a step"
    return (
        f"{m.name} ({m.num_params / 1e9:.1f}B params, seq {m.seq}) on {req.gpus} x {hw.gpu} ({hw.name}), "
        f"{req.precision}, {req.attention} attention, {batch}: {len(rows)} layouts fit; top picks leave at "
        f"least {req.headroom:g}% of the usable bytes free"
    )


def table(req: PlanRequest, rows: list[dict], top: list[dict]) -> str:
    """The `top` layouts of `rows` as a text table: speed, memory against the usable bytes with the
    headroom, the regime's band and how each row was checked."""
    head = (f"{'rank':>4} {'group':5s} {'layout':52s} {'tokens/s':>10} {'TFLOPS/GPU':>10} {'memory GB':>11} "
            f"{'headroom':>8} {'band':>12}  checked")  # fmt: skip
    lines = [heading(req, rows), "", head]
    for r in top:
        mem = f"{r['memory_bytes'] / 1e9:.1f}/{r['usable_bytes'] / 1e9:.1f}"
        band = f"±{r['band_pct']:g}%" + ("" if r["band_basis"].startswith("regime") else " pooled")
        alike = f" (+{r['alike']} alike)" if r.get("alike") else ""
        speed = f"{r['tokens_per_s']:>10.4g} {r['tflops_per_gpu']:>10.1f}"
        group = "tied" if r.get("tied") else "" if r.get("offered", True) else "tight"
        lines.append(f"{r['rank']:>4} {group:5s} {r['layout'] + alike:52s} {speed} {mem:>11} "
                     f"{r['headroom_pct']:>7.1f}% {band:>12}  {r['checked']}")  # fmt: skip
    notes = [tie_note(rows), memory_note(req)]
    lines += [n for n in notes if n]
    lines.append("rank: by modelled speed; memory: the layout's peak (training or construction) / usable per GPU; "
                 "headroom: what it leaves free, per cent of usable (tight: under --headroom); band: the held-out "
                 "error of the regime's modelled speed, or the pooled band where the regime has too few validation "
                 "runs (perfmodel/error_bands.py)")  # fmt: skip
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
