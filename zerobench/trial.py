"""One trial: its spec (`TrialSpec`) and the one record every source writes (`TrialRecord`).

A record's `source` says where its numbers come from — `measured` (real steps of the engine,
zerobench/runtime/train.py), `traced` (the engine under FakeTensorMode, zerobench/runtime/trace.py), `modelled`
(the performance model) — and `status` whether the trial produced them (`ok`) or why not (`oom`,
`infeasible`, `timeout`, `error`, with `error` holding the message). The columns are the fields of
`TrialRecord`, written here once; `trial_columns` is the one translation of a configuration into
them. This module imports no torch, so the workflow's aggregate and report steps stay light.

Default precision, one rule (`default_precision`): the paper's mixed precision, fp16 (2 + 2 + 12
bytes per parameter, paper §3.1), unless the trial computes real steps on a CPU, where 16-bit
matmul is ~300× slower, so fp32 (4 + 4 + 8). So `trace`, `model` and `estimate` default to fp16,
and `run` and `peers` on `--device cpu` to fp32.
"""

from __future__ import annotations

import dataclasses
import functools
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from zerobench.config import ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.fields import FIELDS, SOURCES

STATUSES = ("ok", "oom", "infeasible", "timeout", "error")


def default_precision(device: str, computes: bool) -> str:
    """fp32 for a trial that computes real steps (`computes`) on a CPU, else fp16 (see above)."""
    return "fp32" if computes and device == "cpu" else "fp16"


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


@dataclass(frozen=True, kw_only=True)
class TrialRecord:
    """Every column of a record (None where it does not apply to the source); `extra` holds a
    source's own further fields, written beside the columns."""

    source: str
    status: str = "ok"
    error: str | None = None
    # the model
    model: str | None = None
    num_params: int | None = None
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    seq: int | None = None
    vocab: int | None = None
    # the layout, ZeRO and precision
    dp: int | None = None
    mp: int | None = None
    world_size: int | None = None
    stage: int | None = None
    checkpoint_activations: bool | None = None
    partition_activations: bool | None = None
    offload_activations: bool | None = None
    contiguous_buffers: bool | None = None
    bucket_bytes: int | None = None
    precision: str | None = None
    device: str | None = None
    hardware: str | dict | None = None
    # the batch
    micro_batch: int | None = None
    grad_accum: int | None = None
    global_batch: int | None = None
    steps: int | None = None
    # speed
    step_time_s: float | None = None
    step_time_min_s: float | None = None
    step_time_max_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    # modelled only: the held-out error % of the layout's regime, or "unvalidated" (perfmodel/error_bands.py)
    error_band_pct: float | str | None = None
    # memory per rank, bytes
    param_bytes: int | None = None
    grad_bytes: int | None = None
    optimizer_bytes: int | None = None
    activation_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    peak_rss_bytes: int | None = None
    # the peak while the engine is built (construction), beside the training peak above: measured
    # (RSS growth on CPU, max allocated on GPU), traced (the counter's) or modelled
    build_peak_bytes: int | None = None
    # communication and training
    comm: dict | None = None
    losses: list | None = None
    first_loss: float | None = None
    last_loss: float | None = None
    # provenance
    versions: dict = field(default_factory=versions)
    git_rev: str | None = field(default_factory=git_revision)
    extra: dict = field(default_factory=dict)

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


COLUMNS = tuple(f.name for f in dataclasses.fields(TrialRecord) if f.name != "extra")


def new_record(source: str, **fields) -> dict:
    """A record (as written) with every column present; unknown column names are refused."""
    unknown = set(fields) - set(COLUMNS) - {"extra"}
    if unknown:
        raise ValueError(f"unknown record fields: {sorted(unknown)}")
    return TrialRecord(source=source, **{**fields, "extra": fields.get("extra") or {}}).as_dict()


def _columns(prefix: str, **configs) -> dict:
    """The record columns of the trial fields (zerobench/fields.py) read from `configs` by name,
    those whose attribute starts with `prefix`."""
    out = {}
    for f in FIELDS.values():
        if f.column and f.column[1].startswith(prefix):
            config, attribute = f.column[1].split(".")
            out[f.column[0]] = getattr(configs[config], attribute)
    return out


def model_columns(model: ModelConfig) -> dict:
    return {**_columns("model.", model=model), "num_params": model.num_params}


def trial_columns(model: ModelConfig, parallel: ParallelConfig, precision: PrecisionConfig, train: TrainConfig) -> dict:
    """The columns a configuration fills, for every source (a modelled record passes `device`
    and `hardware` itself): the trial fields' own, and what follows from them."""
    return {
        **_columns("", model=model, parallel=parallel, precision=precision, train=train),
        "num_params": model.num_params,
        "world_size": parallel.world_size,
        "global_batch": global_batch(parallel, train),
    }


def global_batch(parallel: ParallelConfig, train: TrainConfig) -> int:
    """Sequences per optimizer step, over all DP ranks."""
    return train.micro_batch * train.grad_accum * parallel.dp


@dataclass(frozen=True)
class TrialSpec:
    model: ModelConfig
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    out: str | None = None
    timeout_s: float = FIELDS["timeout"].default  # a collective that waits longer than this fails the trial
    data: str = "synthetic"  # token source: "synthetic" or a text corpus (zerobench.runtime.batches.token_source)
    mem_cap_bytes: int | None = None  # per-rank memory budget; a trial that would exceed it is status oom
    resume: str | None = None  # a training-state snapshot to load first; steps continue from its data position
    save: str | None = None  # where to write a snapshot after the timed steps (zerobench.runtime.snapshot)

    def __post_init__(self):
        self.parallel.check_model(self.model)

    @property
    def global_batch(self) -> int:
        return global_batch(self.parallel, self.train)

    def record(self, source: str, **fields) -> dict:
        """This trial's record from `source` with the given measurements (as written)."""
        extra = {"data": self.data, "mem_cap_bytes": self.mem_cap_bytes, **(fields.pop("extra", None) or {})}
        columns = trial_columns(self.model, self.parallel, self.precision, self.train)
        return new_record(source, **{**columns, **fields}, extra=extra)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrialSpec:
        train = dict(d["train"], betas=tuple(d["train"]["betas"]))
        return cls(
            model=ModelConfig(**d["model"]),
            parallel=ParallelConfig(**d["parallel"]),
            precision=PrecisionConfig(**d["precision"]),
            train=TrainConfig(**train),
            **{k: d[k] for k in ("out", "timeout_s")},
            **{k: d[k] for k in ("data", "mem_cap_bytes", "resume", "save") if k in d},
        )


def short_error(exc: BaseException) -> str:
    """An exception as a record's `error`: its type and first line, at most 500 characters."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:500]
