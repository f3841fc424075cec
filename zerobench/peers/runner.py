"""`zerobench peers`: the same GPT, initial weights, data, global batch, precision and world size
trained by our engine (stages 0–3) and by the systems people already use at the equivalent stage
(DDP, ZeroRedundancyOptimizer, FSDP2, DeepSpeed 0–3), one implementation at a time, each in its own
spawned world. One `measured` row per implementation, with the ratios ours / peer. Each stage's
rows follow a `floor` row of their own: a single rank at the same per-rank batch, with no
communication (our engine at dp = 1, where every group has one rank and issues nothing), the compute
every implementation must do, measured right beside the rows it is compared with (a shared host's
speed drifts over the minutes a whole comparison takes). After the first stage's floor a
`floor-concurrent` row: dp such ranks stepping at once, each alone (no communication), as the dp
ranks of a world share the machine's memory bandwidth and caches; what it adds over `floor` is the
cost of running beside each other, which no communication scheme can remove. Each implementation's
step time is also shown over both. Per stage a `bound` row: that stage's floor plus the seconds our
engine's collectives at that stage take with no compute (the same ops, message sizes and calls per
step, from its ledger, issued again after its timed steps in the same spawned world; ours.py): on a
CPU host the ranks' compute and gloo share the cores, so this is what this machine allows that
stage's communication to cost. Every step time is shown over its stage's bound.

On one device (world size 1, `zerobench peers --device cuda` by default: harness.SINGLE_DEVICE)
there is no communication to bound: no floors and no bounds; each row is compared with ours at
its stage (the plain loop, eager and compiled, with ours-0), with TFLOPS per device
(zerobench/flops.py), MFU (zerobench/gpus.py) and on CUDA peak allocated device memory.

Rounds (`--rounds R`): the floors and every implementation run R times, the order reversed every
other round, so a slow spell of a shared host falls on the rows compared with each other. Each
round's ratios are taken within the round; a row gives the median over the rounds of its step
times and of its ratios, and each round's ratio to the floor and to its bound."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics

from zerobench import slow_spells, trial
from zerobench.peers import deepspeed_peer, ours, plain, torch_peers
from zerobench.peers.harness import IMPLEMENTATIONS, default_impls, family, measure, summarise
from zerobench.peers.summary import BOUND, FLOOR, FLOOR_CONCURRENT
from zerobench.peers.workload import Unavailable
from zerobench.runtime import probe
from zerobench.trial.errors import InputError

COLUMNS = (
    "impl", "family", "stage", "source", "status", "error", "model", "num_params", "dp", "world_size",
    "device", "hardware", "precision", "checkpoint_activations", "micro_batch", "global_batch", "warmup", "steps",
    "clip_norm", "threads_per_rank",
    "step_time_s", "step_time_min_s", "step_time_max_s", "step_time_iqr_s", "warmup_time_s", "tflops_per_gpu", "mfu",
    "peak_rss_bytes", "peak_rss_bytes_per_rank", "base_rss_bytes", "peak_allocated_bytes",
    "comm_bytes_per_step", "comm_per_step", "losses", "loss_ref", "loss_max_rel_diff",
    "time_ratio_ours_over", "rss_ratio_ours_over", "allocated_ratio_ours_over", "time_over_floor",
    "time_over_floor_concurrent",
    "collective_s_per_step", "time_over_bound", "note",
    "peer_version", "versions", "git_rev", "host", "loadavg_before", "loadavg_after", "host_probe", "host_speed",
    "rounds", "time_over_floor_rounds", "time_over_bound_rounds",
)  # fmt: skip
# Per-round values a merged row gives as the median over its rounds (min and max: the extremes).
_MEDIAN = (
    "step_time_s", "step_time_iqr_s", "collective_s_per_step", "time_over_floor", "time_over_floor_concurrent",
    "time_over_bound", "time_ratio_ours_over", "rss_ratio_ours_over", "allocated_ratio_ours_over", "host_speed",
    "tflops_per_gpu", "mfu",
)  # fmt: skip


def _base_row(impl: str, spec) -> dict:
    fam, stage = IMPLEMENTATIONS[impl]
    vers = {**trial.versions(), **fam.versions()}
    peer = {ours: "zerobench", torch_peers: "torch", plain: "torch", deepspeed_peer: "deepspeed"}[fam]
    return {
        **dict.fromkeys(COLUMNS),
        "impl": impl,
        "family": peer,
        "stage": stage,
        "source": "measured",
        **{k: v for k, v in trial.model_columns(spec.model).items() if k in ("model", "num_params")},
        "dp": spec.parallel.dp,
        "world_size": spec.parallel.world_size,
        "device": spec.precision.device,
        "precision": spec.precision.mode,
        "checkpoint_activations": spec.parallel.checkpoint_activations,
        "micro_batch": spec.train.micro_batch,
        "global_batch": spec.global_batch,
        "warmup": spec.train.warmup,
        "steps": spec.train.steps,
        "clip_norm": spec.train.clip_norm,
        "threads_per_rank": 1,
        "peer_version": f"{peer} {vers.get(peer, '0.1.0')}" + (f" / torch {vers['torch']}" if peer != "torch" else ""),
        "versions": json.dumps(vers),
        "git_rev": trial.git_revision(),
        "host": platform.node(),
    }


def floor_spec(spec):
    """`spec` on a single rank at the same per-rank batch: dp = 1 (so the global batch is one
    rank's), stage 0 — nothing to partition, nothing to communicate."""
    return dataclasses.replace(spec, parallel=dataclasses.replace(spec.parallel, dp=1, stage=0))


def run_floor(spec, log=print, stage: int | None = None) -> dict:
    """The `floor` row of `stage`'s rows: our engine on `floor_spec(spec)`."""
    row = run_one("ours-0", floor_spec(spec), log, name=FLOOR)
    row["stage"] = stage
    return row


def run_floor_concurrent(spec, log=print) -> dict:
    """The `floor-concurrent` row: `floor_spec(spec)` on each of dp processes at once (rank 0's
    times; world_size is the number of processes)."""
    row = run_one("ours-0", floor_spec(spec), log, name=FLOOR_CONCURRENT, ranks=spec.parallel.dp)
    row["world_size"] = spec.parallel.dp
    return row


def run_one(impl: str, spec, log=print, name: str | None = None, ranks: int | None = None) -> dict:
    """One implementation's row (named `name`, if given, in place of `impl`, in a family of that
    name; `ranks` as `measure` takes it); a peer that cannot run here is a `skipped` row with the
    reason."""
    row = _base_row(impl, spec)
    if name is not None:
        row.update(impl=name, family=name, stage=None)
    row["loadavg_before"] = round(os.getloadavg()[0], 2)
    before = probe.read("cpu")  # the host's speed beside each row (runtime/probe.py), outside its timing
    try:
        row.update(summarise(measure(impl, spec, ranks), spec), status="ok")
    except Unavailable as exc:
        row.update(status="skipped", error=str(exc))
    except Exception as exc:  # noqa: BLE001 - a peer failing is a result, reported with its error
        row.update(status="error", error=f"{type(exc).__name__}: {str(exc).strip()[-400:]}")
    row["loadavg_after"] = round(os.getloadavg()[0], 2)
    row["host_probe"] = json.dumps([before, probe.read("cpu")])
    log(f"{row['impl']:28s} {row['status']:8s} " + (_measured(row) if row["status"] == "ok" else row["error"]))
    return row


def _measured(row: dict) -> str:
    """A row's numbers on its log line, as it finishes (what is left if the run is cut short)."""
    text = f"{row['step_time_s']:.3f} s/step, {row['tflops_per_gpu']:.3g} TFLOPS, warm-up {row['warmup_time_s']:.1f} s"
    if row.get("peak_allocated_bytes"):
        text += f", peak allocated {row['peak_allocated_bytes'] / 2**30:.2f} GiB"
    return text


def floor_of(rows: list[dict], stage) -> dict | None:
    """The `floor` row that `stage`'s rows are compared with: its own, else the one measured first
    (a row of no stage, the concurrent floor, sits beside the first stage's)."""
    floors = [r for r in rows if r["family"] == FLOOR and r["status"] == "ok"]
    return next((r for r in floors if r["stage"] == stage), floors[0] if floors else None)


def with_bounds(rows: list[dict]) -> list[dict]:
    """`rows` with a `bound` row before each of ours that timed its collectives: its stage's
    floor's step time (and spread) plus their median seconds per step; the same bytes per step as
    ours."""
    out = []
    for r in rows:
        extra = r.get("collective_s_per_step")
        floor = floor_of(rows, r["stage"])
        if floor is not None and r["family"] == "zerobench" and r["status"] == "ok" and extra is not None:
            copied = ("model", "num_params", "dp", "world_size", "precision", "micro_batch", "global_batch",
                      "warmup", "steps", "clip_norm", "threads_per_rank", "comm_bytes_per_step", "comm_per_step",
                      "collective_s_per_step", "peer_version", "versions", "git_rev", "host")  # fmt: skip
            out.append({
                **dict.fromkeys(COLUMNS), **{k: r[k] for k in copied},
                "impl": BOUND, "family": BOUND, "stage": r["stage"], "source": "measured", "status": "ok",
                **{k: floor[k] + extra for k in ("step_time_s", "step_time_min_s", "step_time_max_s")},
                "step_time_iqr_s": floor["step_time_iqr_s"],
                "loadavg_before": r["loadavg_before"], "loadavg_after": r["loadavg_after"],
                "note": f"floor + {r['impl']}'s collectives with no compute ({extra:.3f} s/step)",
            })  # fmt: skip
        out.append(r)
    return out


def compare(rows: list[dict]) -> list[dict]:
    """Fill the loss agreement with ours (same stage, else our lowest), ours / peer ratios and
    every step time over each floor's and over its stage's bound, and each row's host speed
    against the floor's (zerobench/slow_spells.py: < 1, the host ran slower than for the floor).
    The floors train a different global batch, and a bound trains nothing: no loss check."""
    ours = {r["stage"]: r for r in rows if r["family"] == "zerobench" and r["status"] == "ok"}
    concurrent = next((r for r in rows if r["family"] == FLOOR_CONCURRENT and r["status"] == "ok"), None)
    bounds = {r["stage"]: r for r in rows if r["family"] == BOUND}
    for r in rows:
        if r["status"] != "ok":
            continue
        floor = floor_of(rows, r["stage"])
        if r.get("host_probe") and floor is not None:
            r["host_speed"] = slow_spells.host_speed(json.loads(r["host_probe"]), json.loads(floor["host_probe"]))
        for ref, column in ((floor, "time_over_floor"), (concurrent, "time_over_floor_concurrent")):
            if ref is not None:
                r[column] = r["step_time_s"] / ref["step_time_s"]
        if r["stage"] in bounds:
            r["time_over_bound"] = r["step_time_s"] / bounds[r["stage"]]["step_time_s"]
        if r["family"] in (FLOOR, FLOOR_CONCURRENT, BOUND):
            continue
        ref = ours.get(r["stage"]) or ours.get(min(ours, default=None))
        if ref is None:
            continue
        a, b = json.loads(r["losses"]), json.loads(ref["losses"])
        r["loss_ref"] = ref["impl"]
        r["loss_max_rel_diff"] = max(abs(x - y) / abs(y) for x, y in zip(a, b))
        if r["family"] != "zerobench" and r["stage"] in ours:
            r["time_ratio_ours_over"] = ours[r["stage"]]["step_time_s"] / r["step_time_s"]
            r["rss_ratio_ours_over"] = ours[r["stage"]]["peak_rss_bytes"] / r["peak_rss_bytes"]
            if r.get("peak_allocated_bytes") and ours[r["stage"]].get("peak_allocated_bytes"):
                r["allocated_ratio_ours_over"] = ours[r["stage"]]["peak_allocated_bytes"] / r["peak_allocated_bytes"]
    return rows


def peers_trial(values: dict) -> tuple[trial.TrialSpec, list[str]]:
    """The compared trial and implementations of `zerobench peers`' parsed flags; refuses what the
    peers cannot compare, naming the field."""
    model, parallel, precision, train = trial.configs(values)
    compared = {"cpu": ("fp32",), "cuda": ("fp32", "bf16")}[precision.device]
    if precision.mode not in compared:
        raise InputError(f"precision={precision.mode}: the peers on {precision.device} compare {'/'.join(compared)}")
    if train.grad_accum != 1:
        raise InputError(f"grad_accum={train.grad_accum}: the peers compare one micro-batch per step")
    if precision.device == "cuda" and parallel.world_size != 1:
        raise InputError(f"dp={parallel.dp}, mp={parallel.mp}: the peers on cuda compare one GPU (world size 1)")
    impls = values["impls"].split(",") if values["impls"] else default_impls(parallel.world_size, values["stage"])
    unknown = [i for i in impls if i not in IMPLEMENTATIONS]
    if unknown:
        raise InputError(f"impls={unknown}: unknown; choose from {list(IMPLEMENTATIONS)}")
    return trial.TrialSpec(model, parallel, precision, train, timeout_s=values["timeout"]), impls


def run_peers(spec, impls=None, log=print, rounds: int = 1) -> list[dict]:
    """Per stage, in order of stage, its floor (the concurrent floor after the first; none on one
    device), then its implementations in the order given, each stage's bound before ours; with
    `rounds` > 1 each run that many times, interleaved, and merged (`merge_rounds`)."""
    impls = list(impls or IMPLEMENTATIONS)
    for impl in impls:
        family(impl)  # an unknown name fails before anything runs
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: run each row at least once")
    runs = []
    for k, stage in enumerate(sorted({IMPLEMENTATIONS[i][1] for i in impls})):
        if spec.parallel.world_size > 1:  # one device: nothing communicated, nothing to bound
            runs.append(lambda stage=stage: run_floor(spec, log, stage))
            if k == 0:
                runs.append(lambda: run_floor_concurrent(spec, log))
        runs += [lambda impl=impl: run_one(impl, spec, log) for impl in impls if IMPLEMENTATIONS[impl][1] == stage]
    each = []
    for r in range(rounds):
        if rounds > 1:
            log(f"-- round {r + 1} of {rounds}")
        order = range(len(runs)) if r % 2 == 0 else reversed(range(len(runs)))
        rows = {i: runs[i]() for i in order}
        each.append(compare(with_bounds([rows[i] for i in range(len(runs))])))
    return merge_rounds(each)


def merge_rounds(each: list[list[dict]]) -> list[dict]:
    """One row per row of the first round, from that row in every round (matched by implementation
    and stage): the medians of `_MEDIAN`, the extremes of the step's min and max, the largest
    peak RSS, the first round's losses and bytes (the same every round), and each round's ratio to
    the floor and to its bound. A row that failed in any round is that round's failed row."""
    merged = []
    for first in each[0]:
        same = [next(r for r in rows if (r["impl"], r["stage"]) == (first["impl"], first["stage"])) for rows in each]
        failed = next((r for r in same if r["status"] != "ok"), None)
        row = dict(failed or first, rounds=len(each))
        if failed is None:
            for col in _MEDIAN:
                values = [r[col] for r in same if r.get(col) is not None]
                row[col] = statistics.median(values) if values else None
            row["step_time_min_s"] = min(r["step_time_min_s"] for r in same)
            row["step_time_max_s"] = max(r["step_time_max_s"] for r in same)
            for col in ("peak_rss_bytes", "peak_allocated_bytes"):
                row[col] = max(r[col] or 0 for r in same) or None
            row["loadavg_before"] = min(r["loadavg_before"] for r in same)
            row["loadavg_after"] = max(r["loadavg_after"] for r in same)
            for col in ("time_over_floor", "time_over_bound"):
                row[f"{col}_rounds"] = json.dumps([r.get(col) for r in same])
        merged.append(row)
    return merged


def write_csv(rows: list[dict], path) -> None:
    import pandas as pd

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(tmp, index=False)
    os.replace(tmp, path)
