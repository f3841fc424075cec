"""A trial's record: the one record every source writes (`TrialRecord`), its columns, and the
columns a configuration fills.

A record's `source` says where its numbers come from — `measured` (real steps of the engine,
zerobench/runtime/train.py), `traced` (the engine under FakeTensorMode, zerobench/runtime/trace.py),
`emulated` (one rank of any world on one device, zerobench/runtime/emulate.py: its memory and compute
measured, its collectives priced by the model), `modelled` (the performance model) — and `status`
whether the trial produced them (`ok`) or why not (`oom`, `infeasible`, `timeout`, `error`, with
`error` holding the message). The columns are the fields of `TrialRecord`, written here once;
`trial_columns` is the one translation of a configuration into them. No torch import, so the
workflow's aggregate and report steps stay light.
"""

from __future__ import annotations

import dataclasses
import functools
import platform
import subprocess
from dataclasses import field
from pathlib import Path

from zerobench.engine.config import ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.trial.fields import FIELDS, SOURCES

STATUSES = ("ok", "oom", "infeasible", "timeout", "error")


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
def git_revision() -> str:
    """The short revision of the project's own checkout, or "unknown": when the package does not sit
    in a git checkout whose top level is the directory holding its pyproject.toml (a copy of the tree
    inside another repository would otherwise answer with that repository's revision), or git fails."""
    root = Path(__file__).resolve().parents[2]  # zerobench/trial/record.py -> the project's directory
    if not (root / "pyproject.toml").is_file():
        return "unknown"
    try:
        top = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=5
        )
        if top.returncode or Path(top.stdout.strip()).resolve() != root:
            return "unknown"
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class _Record:
    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"source={self.source!r}: must be one of {SOURCES}")
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r}: must be one of {STATUSES}")

    def as_dict(self) -> dict:
        """The record as written: the columns in order, then the extras."""
        out = {name: getattr(self, name) for name in COLUMNS}
        out.update(self.extra)
        return out


# The columns beyond the trial's own fields (zerobench/trial/fields.py: every field with a record
# `column` is one, in the fields' order, between `error` and these), None where a source has none.
_MEASURED = (
    # what follows from the configuration
    ("num_params", int), ("world_size", int), ("hardware", str | dict), ("global_batch", int),
    # speed: seconds per step (median, min, max), throughput, TFLOPS per GPU, MFU (gpus.py)
    ("step_time_s", float), ("step_time_min_s", float), ("step_time_max_s", float),
    ("samples_per_s", float), ("tokens_per_s", float), ("tflops_per_gpu", float), ("mfu", float),
    # modelled only: the held-out error % of the layout's regime, or "unvalidated" (perfmodel/error_bands.py)
    ("error_band_pct", float | str),
    # memory per rank, bytes
    ("param_bytes", int), ("grad_bytes", int), ("optimizer_bytes", int), ("activation_bytes", int),
    ("peak_allocated_bytes", int), ("peak_reserved_bytes", int), ("peak_rss_bytes", int),
    # the peak while the engine is built (construction), beside the training peak above: measured
    # (RSS growth on CPU, max allocated on GPU), traced (the counter's) or modelled
    ("build_peak_bytes", int),
    # communication (per collective and group: calls, bytes, volume) and training
    ("comm", dict), ("losses", list), ("first_loss", float), ("last_loss", float),
)  # fmt: skip

# Every column of a record (None where it does not apply to the source); `extra` holds a source's
# own further fields, written beside the columns.
TrialRecord = dataclasses.make_dataclass(
    "TrialRecord",
    [
        ("source", str),
        ("status", str, field(default="ok")),
        ("error", str | None, field(default=None)),
        *[(f.column, object, field(default=None)) for f in FIELDS.values() if f.column],
        *[(name, kind | None, field(default=None)) for name, kind in _MEASURED],
        ("versions", dict, field(default_factory=versions)),  # provenance
        ("git_rev", str | None, field(default_factory=git_revision)),
        ("extra", dict, field(default_factory=dict)),
    ],
    bases=(_Record,),
    frozen=True,
    kw_only=True,
)

COLUMNS = tuple(f.name for f in dataclasses.fields(TrialRecord) if f.name != "extra")


def new_record(source: str, **fields) -> dict:
    """A record (as written) with every column present; unknown column names are refused."""
    unknown = set(fields) - set(COLUMNS) - {"extra"}
    if unknown:
        raise ValueError(f"unknown record fields: {sorted(unknown)}")
    return TrialRecord(source=source, **{**fields, "extra": fields.get("extra") or {}}).as_dict()


def _columns(*configs) -> dict:
    """The record columns of the trial fields (zerobench/trial/fields.py) whose attribute belongs to
    one of `configs`, each read from it."""
    kinds = {type(c) for c in configs}
    return {f.column: f.attribute.of(*configs) for f in FIELDS.values() if f.column and f.attribute.config in kinds}


def model_columns(model: ModelConfig) -> dict:
    return {**_columns(model), "num_params": model.num_params}


def trial_columns(model: ModelConfig, parallel: ParallelConfig, precision: PrecisionConfig, train: TrainConfig) -> dict:
    """The columns a configuration fills, for every source (a modelled record passes `device`
    and `hardware` itself): the trial fields' own, and what follows from them."""
    return {
        **_columns(model, parallel, precision, train),
        "num_params": model.num_params,
        "world_size": parallel.world_size,
        "global_batch": global_batch(parallel, train),
    }


def global_batch(parallel: ParallelConfig, train: TrainConfig) -> int:
    """Sequences per optimizer step, over all DP ranks."""
    return train.micro_batch * train.grad_accum * parallel.dp


def short_error(exc: BaseException) -> str:
    """An exception as a record's `error`: its type and first line, at most 500 characters."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:500]
