"""One trial: its spec (`TrialSpec`) and the one record every source writes (`TrialRecord`).

A record's `source` says where its numbers come from — `measured` (real steps of the engine,
engine/runtime/train.py), `traced` (the engine under FakeTensorMode, engine/runtime/trace.py),
`emulated` (one rank of any world on one device, engine/runtime/emulate.py: its memory and compute
measured, its collectives priced by the model), `modelled` (the performance model) — and `status`
whether the trial produced them (`ok`) or why not (`oom`, `infeasible`, `timeout`, `error`, with
`error` holding the message). The columns are the fields of
`TrialRecord`, written here once; `trial_columns` is the one translation of a configuration into
them, and `configs` the one translation of a trial's field values into the validated configs.
This module imports no torch, so the workflow's aggregate and report steps stay light.

Default precision, one rule (`default_precision`): the paper's mixed precision, fp16 (2 + 2 + 12
bytes per parameter, paper §3.1), unless the trial computes real steps on a CPU, where 16-bit
matmul is far slower than fp32 (docs/engine-measurements.md), so fp32 (4 + 4 + 8). So `trace`,
`model` and `estimate` default to fp16, and `run`, `emulate` and `peers` on `--device cpu` to fp32.
Default device, one rule (`default_device`): cpu, but a trace takes a GPU's semantics (it computes
nothing; `--device cpu` traces a CPU host, which computes 16-bit storage in fp32).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import platform
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

from zerobench import flops
from zerobench.engine.config import (
    ZERO_CONFIGS,
    ConfigError,
    ModelConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainConfig,
    preset,
)
from zerobench.engine.fields import FIELDS, SOURCES, MiB

STATUSES = ("ok", "oom", "infeasible", "timeout", "error")
COMPUTING_COMMANDS = ("run", "peers", "emulate")  # the commands that compute real steps (default_precision)


def default_device(command: str | None) -> str:
    """cpu, except for a trace: it computes nothing, so it traces the device the paper's numbers are
    of, a GPU computing in the storage dtype (on a CPU 16-bit storage computes in fp32)."""
    return "cuda" if command == "trace" else "cpu"


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
def git_revision() -> str:
    """The short revision of the project's own checkout, or "unknown": when the package does not sit
    in a git checkout whose top level is the directory holding its pyproject.toml (a copy of the tree
    inside another repository would otherwise answer with that repository's revision), or git fails."""
    root = Path(__file__).resolve().parents[2]  # zerobench/engine/trial.py -> the project's directory
    if not (root / "pyproject.toml").is_file():
        return "unknown"
    try:
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=5)  # fmt: skip
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


# The columns beyond the trial's own fields (zerobench/engine/fields.py: every field with a record
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
        *[(f.column[0], object, field(default=None)) for f in FIELDS.values() if f.column],
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


def _columns(prefix: str, **configs) -> dict:
    """The record columns of the trial fields (zerobench/engine/fields.py) read from `configs` by name,
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
    data: str = (
        "synthetic"  # token source: "synthetic" or a text corpus (zerobench.engine.runtime.batches.token_source)
    )
    mem_cap_bytes: int | None = None  # per-rank memory budget; a trial that would exceed it is status oom
    resume: str | None = None  # a training-state snapshot to load first; steps continue from its data position
    save: str | None = None  # where to write a snapshot after the timed steps (zerobench.engine.runtime.snapshot)

    def __post_init__(self):
        self.parallel.check_model(self.model)

    @property
    def global_batch(self) -> int:
        return global_batch(self.parallel, self.train)

    def tflops_per_gpu(self, step_time_s: float) -> float:
        """Achieved TFLOPS per GPU at `step_time_s` a step (zerobench/flops.py's convention)."""
        done = flops.step_flops(self.model, self.global_batch, self.parallel.checkpoint_activations)
        return done / step_time_s / self.parallel.world_size / 1e12

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


def configs(values: Mapping) -> tuple[ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig]:
    """Validated configs from a trial's field values (parsed flags, or a sheet's trial; a field
    not given takes its default, and `command` says which command runs it); raises ConfigError
    naming the field."""
    args = SimpleNamespace(**{**{name: f.default for name, f in FIELDS.items()}, "command": None, **values})
    model = preset(args.model).with_overrides(
        layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq, vocab=args.vocab
    )
    dp = args.dp
    gpus = args.gpus
    if gpus is not None:
        if args.mp < 1:  # before `gpus % mp` below
            raise ConfigError(f"mp={args.mp}: must be an integer >= 1")
        if gpus < 1 or gpus % args.mp:
            raise ConfigError(f"gpus={gpus}: must be a positive multiple of mp ({args.mp})")
        if dp is not None and dp * args.mp != gpus:
            raise ConfigError(f"dp={dp}: dp × mp must equal gpus ({gpus})")
        dp = gpus // args.mp
    zero = dict(ZERO_CONFIGS[args.zero_config]) if args.zero_config else {}
    if args.stage is not None:
        if zero and zero["stage"] != args.stage:
            raise ConfigError(f"stage={args.stage}: conflicts with zero-config {args.zero_config}")
        zero["stage"] = args.stage
    switches = ("checkpoint_activations", "partition_activations", "offload_activations", "contiguous_buffers")
    for name in switches:
        zero[name] = zero.get(name, False) or getattr(args, name)
    if zero["partition_activations"]:
        zero["checkpoint_activations"] = True  # P_a partitions the checkpoints, so it implies them
    sets = {f.sets: _value(f, getattr(args, name)) for name, f in FIELDS.items() if f.sets}
    parallel = ParallelConfig(dp=1 if dp is None else dp, **zero, **_attributes(sets, "parallel"))
    parallel.check_model(model)
    computes = args.command in COMPUTING_COMMANDS
    device = args.device or default_device(args.command)
    mode = args.precision or default_precision(device, computes)
    precision = PrecisionConfig(mode=mode, device=device)
    train = TrainConfig(**_attributes(sets, "train"))
    return model, parallel, precision, train


def _value(f, value):
    """A field's value as its configuration attribute takes it: a MiB flag in bytes (0 stays 0
    where the field allows it: `reuse_mb`)."""
    if not f.unit:
        return value
    return 0 if value == 0 and (f.schema or {}).get("minimum") == 0 else mib(value, f.name)


def _attributes(sets: dict, config: str) -> dict:
    """The values of the fields that set `config`'s attributes ("parallel.mp" -> mp)."""
    return {path.partition(".")[2]: value for path, value in sets.items() if path.startswith(config + ".")}


def mib(value: float, field: str) -> int:
    if not 0 < value * MiB < math.inf:  # in bytes, so a huge finite MiB count is refused too
        raise ConfigError(f"{field}={value!r}: must be a finite number > 0")
    return max(1, int(value * MiB))


def short_error(exc: BaseException) -> str:
    """An exception as a record's `error`: its type and first line, at most 500 characters."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:500]
