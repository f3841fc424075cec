"""The on-disk form of a training-state snapshot (zerobench/runtime/snapshot.py) and its checks: the
manifest must cover every parameter exactly once, each file must have the listed size and SHA-256,
and each shard's index must match its manifest entry. Every refusal is a `CheckpointError` that
names the file."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import torch

FORMAT = "zerobench-checkpoint/1"
MANIFEST = "manifest.json"
STATES = ("master", "exp_avg", "exp_avg_sq")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or loaded as asked; the message names the file."""


# -- validation -------------------------------------------------------------------------------------
def read_manifest(directory: str | os.PathLike) -> dict:
    """The manifest of a complete checkpoint, checked for coverage; raises CheckpointError."""
    d = Path(directory)
    path = d / MANIFEST
    if not d.is_dir():
        partial = d.with_name(d.name + ".partial")
        hint = f" ({partial} is an unfinished save)" if partial.exists() else ""
        raise CheckpointError(f"{d}: no such checkpoint directory{hint}")
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing; {d} is not a complete checkpoint") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    for mp_rank, shapes in manifest["shapes"].items():
        covered = {name: [] for name in shapes}
        for f in manifest["files"]:
            if str(f["mp_rank"]) == mp_rank:
                for name, a, b in f["index"]:
                    covered.setdefault(name, []).append((a, b, f["file"]))
        for name, spans in covered.items():
            numel = math.prod(shapes.get(name, ()))
            pos = 0
            for a, b, file in sorted(spans):
                if a != pos:
                    what = "overlaps" if a < pos else f"leaves [{pos}, {a}) uncovered"
                    raise CheckpointError(f"{d / file}: range [{a}, {b}) of {name} {what} (mp rank {mp_rank})")
                pos = b
            if pos != numel:
                raise CheckpointError(f"{d}: {name} covered up to element {pos} of {numel} (mp rank {mp_rank})")
    return manifest


def check_sizes(d: Path, manifest: dict) -> None:
    for f in manifest["files"]:
        path = d / f["file"]
        if not path.exists():
            raise CheckpointError(f"{path}: missing (listed in the manifest, {f['bytes']} bytes)")
        size = path.stat().st_size
        if size != f["bytes"]:
            raise CheckpointError(f"{path}: {size} bytes, the manifest says {f['bytes']} (truncated or replaced)")


def read_shard(d: Path, f: dict) -> dict:
    """One rank's file, checked against its manifest entry. The file is hashed in chunks and its
    tensors are memory-mapped, not read: a loader copies out only the ranges it owns, so loading a
    file written at a smaller dp (a larger shard) costs no more memory than the loader's own
    states."""
    path = d / f["file"]
    digest = _sha256(path)
    if digest != f["sha256"]:
        raise CheckpointError(f"{path}: SHA-256 {digest[:12]}… does not match the manifest's {f['sha256'][:12]}…")
    shard = torch.load(path, mmap=True, weights_only=True)
    index = [tuple(e) for e in shard["index"]]
    if index != [tuple(e) for e in f["index"]]:
        raise CheckpointError(f"{path}: its index does not match the manifest's entry for it")
    n = sum(b - a for _, a, b in index)
    for key in STATES:
        if shard[key].numel() != n:
            raise CheckpointError(f"{path}: {key} holds {shard[key].numel()} elements, its index {n}")
    return shard


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    """SHA-256 of a file read in chunks of `chunk` bytes (4 MiB)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()
