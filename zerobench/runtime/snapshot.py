"""Snapshots of the full training state (sharded checkpoints) that load at any DP degree and ZeRO
stage. (Activation checkpoints are another thing: zerobench/engine/zero/activations.py.)

The format does not depend on the layout that wrote it. Each rank writes the fp32 master weights
and both Adam moments of the elements it owns (paper §5.1, P_os), indexed by (parameter name,
element range) rather than by flat offsets; a manifest lists every file with its ranges, size and
SHA-256, the step, the data position, the loss scaler, the optimizer step count, the parameter
shapes and the world layout. A loader of any dp and stage maps those ranges onto the pieces it
owns, so resharding is an index computation, exact to the bit.

Writes are atomic: everything goes to ``<dir>.partial`` and is renamed to ``<dir>`` only once the
manifest is complete. A missing, truncated, corrupted or mismatched file is refused with a
`CheckpointError` naming the file, on every rank together (the checks: zerobench/runtime/snapshot_files.py).

Engine interface used (every stage's engine, `zerobench.engine.zero.apply_zero`): ``layout``
(FlatLayout), ``owned`` (flat [lo, hi) of each optimizer piece), ``optimizer`` (ShardedAdam),
``scaler`` (LossScaler), ``ctx``, ``stage``, ``dtype``, ``device`` and ``sync_parameters()``.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
from pathlib import Path

import torch

from zerobench.engine.parallel.comms import Comms
from zerobench.engine.zero.partition import intersect, overlaps
from zerobench.runtime.snapshot_files import (
    FORMAT,
    MANIFEST,
    STATES,
    CheckpointError,
    check_sizes,
    read_manifest,
    read_shard,
)


# -- where each piece's elements belong ------------------------------------------------------------
def _ranges(engine) -> list[tuple[str, int, int, int, int]]:
    """(name, start, end, piece, offset in piece) for every parameter range this rank owns."""
    slots, owned = engine.layout.slots, engine.owned
    return [
        (slots[j].name, a - slots[j].offset, b - slots[j].offset, i, a - owned[i][0])
        for i, j, a, b in overlaps(slots, owned)
    ]


def _writes_state(engine) -> bool:
    """Stage 0 replicates the optimizer over DP, so one DP rank of each MP group writes it."""
    return engine.partitions_optimizer or engine.ctx.dp.rank == 0


def _max_flag(engine, raised: bool = False) -> bool:
    """A one-element MAX all-reduce over the world: a barrier that also tells every rank whether
    any rank raised its flag. On a ledger of its own, so the engine's traffic stays clean."""
    flag = torch.tensor([float(raised)], device=engine.device)
    Comms().all_reduce(flag, engine.ctx.world, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())


# -- save ---------------------------------------------------------------------------------------------
def save(engine, step: int, data_position: int, directory: str | os.PathLike, config: dict | None = None) -> Path:
    """Write this rank's shard and, on rank 0, the manifest; every rank must call it. `step` is the
    number of optimizer steps taken, `data_position` where the data stream resumes (for
    SyntheticTokens, the step index), `config` anything JSON-able the run wants kept."""
    final = Path(directory)
    tmp = final.with_name(final.name + ".partial")
    ctx = engine.ctx
    if ctx.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a crashed earlier save
        tmp.mkdir(parents=True)
    _max_flag(engine)
    opt = engine.optimizer
    ranges = _ranges(engine) if _writes_state(engine) else []
    index = [(name, a, b) for name, a, b, _, _ in ranges]
    state = {
        key: torch.cat([getattr(opt, key)[i][o : o + b - a].detach().float().cpu() for _, a, b, i, o in ranges])
        if ranges
        else torch.zeros(0)
        for key in STATES
    }
    rng = {"cpu": torch.get_rng_state()}
    if engine.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(engine.device)
    buf = io.BytesIO()
    torch.save({"index": index, **state, "rng": rng}, buf)
    data = buf.getvalue()
    name = f"rank{ctx.rank:05d}.pt"
    (tmp / name).write_bytes(data)
    entry = {
        "file": name,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "world_rank": ctx.rank,
        "dp_rank": ctx.dp.rank,
        "mp_rank": ctx.mp.rank,
        "shapes": {s.name: list(s.shape) for s in engine.layout.slots},
        "index": index,
    }
    (tmp / f"{name}.json").write_text(json.dumps(entry))
    _max_flag(engine)
    if ctx.rank == 0:
        files = []
        for r in range(ctx.world.size):
            side = tmp / f"rank{r:05d}.pt.json"
            files.append(json.loads(side.read_text()))
            side.unlink()
        shapes = {str(f["mp_rank"]): f.pop("shapes") for f in files}
        manifest = {
            "format": FORMAT,
            "step": step,
            "data_position": data_position,
            "optimizer_step": float(opt.steps[0]) if opt.steps else 0.0,
            "loss_scaler": {k: getattr(engine.scaler, k) for k in ("scale", "clean_steps", "skipped")},
            "layout": {"dp": ctx.dp.size, "mp": ctx.mp.size, "world_size": ctx.world.size, "stage": engine.stage},
            "storage_dtype": str(engine.dtype).removeprefix("torch."),
            "shapes": shapes,
            "files": files,
            "config": config or {},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if final.exists():  # replace an older checkpoint of the same name only once this one is whole
            old = final.with_name(final.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
    _max_flag(engine)  # no rank returns before the checkpoint is visible under its final name
    return final


# -- load ---------------------------------------------------------------------------------------------
def load(engine, directory: str | os.PathLike) -> dict:
    """Load a checkpoint of any dp and stage (same mp) into `engine`; every rank must call it.
    Returns the manifest plus ``rng_restored`` (RNG states come back only on an unchanged world).
    Raises CheckpointError on every rank if any rank finds a problem; the engine is then not
    usable for training (its states are partly overwritten)."""
    d = Path(directory)
    manifest = read_manifest(d)
    ctx = engine.ctx
    saved = manifest["layout"]
    if saved["mp"] != ctx.mp.size:
        raise CheckpointError(f"{d / MANIFEST}: saved at mp={saved['mp']}, cannot load at mp={ctx.mp.size}")
    shapes = manifest["shapes"][str(ctx.mp.rank)]
    mine = {s.name: list(s.shape) for s in engine.layout.slots}
    if shapes != mine:
        diff = sorted(n for n in set(shapes) | set(mine) if shapes.get(n) != mine.get(n))
        n = diff[0]
        raise CheckpointError(
            f"{d / MANIFEST}: parameter {n} has shape {shapes.get(n)} in the checkpoint, {mine.get(n)} in the model "
            f"({len(diff)} parameters differ)"
        )
    check_sizes(d, manifest)
    same_world = saved["world_size"] == ctx.world.size and saved["dp"] == ctx.dp.size
    error = None
    try:
        rng = _fill(engine, d, manifest, same_world)
    except CheckpointError as exc:
        error, rng = exc, None
    if _max_flag(engine, error is not None):
        raise error or CheckpointError(f"{d}: another rank rejected this checkpoint (see its error)")
    if rng is not None:
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and engine.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], engine.device)
    opt = engine.optimizer
    for t in opt.steps:
        t.fill_(manifest["optimizer_step"])
    for k, v in manifest["loss_scaler"].items():
        setattr(engine.scaler, k, v)
    opt.write_back()
    engine.sync_parameters()
    return {**manifest, "rng_restored": rng is not None}


def _fill(engine, d: Path, manifest: dict, same_world: bool) -> dict | None:
    """Copy every range this rank owns from the files that hold it; returns this rank's saved RNG
    states when the world is unchanged (None otherwise)."""
    opt = engine.optimizer
    ranges = _ranges(engine)
    wanted: dict[str, list] = {}
    for name, a, b, i, o in ranges:
        wanted.setdefault(name, []).append((a, b, i, o))
    for key in STATES:
        for piece in getattr(opt, key):
            piece.zero_()  # padding stays zero; every real element is overwritten below
    filled, rng = 0, None
    for f in manifest["files"]:
        own_rng = same_world and f["world_rank"] == engine.ctx.rank
        spans = [] if f["mp_rank"] != engine.ctx.mp.rank else f["index"]
        hits = [(s, e, pos) for (name, s, e), pos in zip(spans, _offsets(spans)) if _overlaps(wanted, name, s, e)]
        if not hits and not own_rng:
            continue
        shard = read_shard(d, f)
        rng = shard["rng"] if own_rng else rng
        pos = 0
        for name, s, e in spans:
            for a, b, i, o in wanted.get(name, ()):
                common = intersect((a, b), (s, e))
                if common is not None:
                    lo, hi = common
                    for key in STATES:
                        src = shard[key][pos + lo - s : pos + hi - s]
                        getattr(opt, key)[i][o + lo - a : o + hi - a].copy_(src)
                    filled += hi - lo
            pos += e - s
    need = sum(b - a for _, a, b, _, _ in ranges)
    if filled != need:
        raise CheckpointError(f"{d}: filled {filled} of the {need} elements rank {engine.ctx.rank} owns")
    return rng


def _offsets(spans) -> list[int]:
    out, pos = [], 0
    for _, s, e in spans:
        out.append(pos)
        pos += e - s
    return out


def _overlaps(wanted: dict, name: str, s: int, e: int) -> bool:
    return any(intersect((a, b), (s, e)) for a, b, _, _ in wanted.get(name, ()))


# -- export ------------------------------------------------------------------------------------------
def export_state_dict(directory: str | os.PathLike, state: str = "master") -> dict[str, torch.Tensor]:
    """The whole model as a plain fp32 state_dict of `zerobench.engine.model.GPT` (from the master
    weights), for a checkpoint saved at mp = 1; every file is verified. `state` = "exp_avg" or
    "exp_avg_sq" gives Adam's moments in the same form."""
    if state not in STATES:
        raise ValueError(f"state={state!r}: must be one of {STATES}")
    d = Path(directory)
    manifest = read_manifest(d)
    if manifest["layout"]["mp"] != 1:
        raise CheckpointError(f"{d / MANIFEST}: saved at mp={manifest['layout']['mp']}; export needs mp=1")
    check_sizes(d, manifest)
    shapes = manifest["shapes"]["0"]
    flat = {name: torch.empty(math.prod(shape)) for name, shape in shapes.items()}
    for f in manifest["files"]:
        shard = read_shard(d, f)
        pos = 0
        for name, s, e in f["index"]:
            flat[name][s:e].copy_(shard[state][pos : pos + e - s])
            pos += e - s
    return {name: flat[name].view(shape) for name, shape in shapes.items()}
