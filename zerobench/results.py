"""The record every trial writes, and loading records and the paper's reference numbers.

A record is one JSON object. `source` says where its numbers come from — `measured` (real steps
of the engine), `traced` (the engine under FakeTensorMode), `modelled` (the performance model) —
and `status` whether the trial produced them (`ok`) or why not (`oom`, `infeasible`, `timeout`,
`error`, with `error` holding the message). This module imports no torch, so the workflow's
aggregate and report steps stay light.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

SOURCES = ("measured", "traced", "modelled")
STATUSES = ("ok", "oom", "infeasible", "timeout", "error")

# Fields every record carries (None when not applicable to its source).
RECORD_FIELDS = (
    "source", "status", "error",
    "model", "num_params", "layers", "hidden", "heads", "seq", "vocab",
    "dp", "mp", "world_size", "stage",
    "checkpoint_activations", "partition_activations", "offload_activations", "contiguous_buffers",
    "bucket_bytes", "precision", "device", "hardware",
    "micro_batch", "grad_accum", "global_batch", "steps",
    "step_time_s", "step_time_min_s", "step_time_max_s", "samples_per_s", "tokens_per_s",
    "tflops_per_gpu", "mfu",
    "param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes",
    "peak_allocated_bytes", "peak_reserved_bytes", "peak_rss_bytes",
    "comm", "losses", "first_loss", "last_loss",
    "versions", "git_rev",
)  # fmt: skip


def new_record(source: str, **fields) -> dict:
    """A record with every schema field present; unknown field names are refused."""
    if source not in SOURCES:
        raise ValueError(f"source={source!r}: must be one of {SOURCES}")
    unknown = set(fields) - set(RECORD_FIELDS)
    extras = fields.pop("extra", None)
    if unknown - {"extra"}:
        raise ValueError(f"unknown record fields: {sorted(unknown - {'extra'})}")
    record = dict.fromkeys(RECORD_FIELDS)
    record.update(source=source, status="ok", versions=dict(versions()), git_rev=git_revision())
    record.update(fields)
    if extras:
        record.update(extras)
    if record["status"] not in STATUSES:
        raise ValueError(f"status={record['status']!r}: must be one of {STATUSES}")
    return record


def model_fields(model) -> dict:
    """The record's model columns from a ModelConfig."""
    return {
        "model": model.name,
        "num_params": model.num_params,
        "layers": model.layers,
        "hidden": model.hidden,
        "heads": model.heads,
        "seq": model.seq,
        "vocab": model.vocab,
    }


def write_record(record: dict, path: str | os.PathLike) -> None:
    """Write atomically: a reader (or a resumed sweep) never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1, sort_keys=False, default=str)
        f.write("\n")
    os.replace(tmp, path)


def read_record(path: str | os.PathLike) -> dict:
    with open(path) as f:
        return json.load(f)


@functools.cache  # fixed for the process; a sweep writes thousands of records
def versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("torch", "deepspeed"):
        try:
            from importlib.metadata import version

            out[pkg] = version(pkg)
        except Exception:  # not installed: leave it out
            pass
    return out


@functools.cache
def git_revision() -> str | None:
    try:
        root = Path(__file__).resolve().parent.parent
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def paper_reference_path() -> Path:
    return Path(str(resources.files("zerobench") / "data" / "paper_reference.csv"))


def load_paper_reference():
    """The paper's numbers (paper.md §11) as a DataFrame: for overlays and error columns only."""
    import pandas as pd

    return pd.read_csv(paper_reference_path())
