"""A trial's spec (`TrialSpec`): the validated configs of one trial and how it runs, and `configs`,
the one translation of a trial's field values (flags or a sheet's trial) into the validated configs.
No torch import.

Default precision, one rule (`default_precision`): the paper's mixed precision, fp16 (2 + 2 + 12
bytes per parameter, paper §3.1), unless the trial computes real steps on a CPU, where 16-bit
matmul is far slower than fp32 (docs/engine-measurements.md), so fp32 (4 + 4 + 8). So `trace`,
`model` and `estimate` default to fp16, and `run`, `emulate` and `peers` on `--device cpu` to fp32.
Default device, one rule (`default_device`): cpu, but a trace takes a GPU's semantics (it computes
nothing; `--device cpu` traces a CPU host, which computes 16-bit storage in fp32).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace

from zerobench import flops
from zerobench.engine.config import (
    ZERO_CONFIGS,
    ModelConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainConfig,
    preset,
)
from zerobench.trial.errors import InputError
from zerobench.trial.fields import FIELDS, MiB
from zerobench.trial.record import global_batch, new_record, trial_columns

COMPUTING_COMMANDS = ("run", "peers", "emulate")  # the commands that compute real steps (default_precision)


def default_device(command: str | None) -> str:
    """cpu, except for a trace: it computes nothing, so it traces the device the paper's numbers are
    of, a GPU computing in the storage dtype (on a CPU 16-bit storage computes in fp32)."""
    return "cuda" if command == "trace" else "cpu"


def default_precision(device: str, computes: bool) -> str:
    """fp32 for a trial that computes real steps (`computes`) on a CPU, else fp16 (see above)."""
    return "fp32" if computes and device == "cpu" else "fp16"


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
    not given takes its default, and `command` says which command runs it); raises InputError
    naming the field."""
    args = SimpleNamespace(**{**{name: f.default for name, f in FIELDS.items()}, "command": None, **values})
    model = preset(args.model).with_overrides(
        layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq, vocab=args.vocab
    )
    dp = args.dp
    gpus = args.gpus
    if gpus is not None:
        if args.mp < 1:  # before `gpus % mp` below
            raise InputError(f"mp={args.mp}: must be an integer >= 1")
        if gpus < 1 or gpus % args.mp:
            raise InputError(f"gpus={gpus}: must be a positive multiple of mp ({args.mp})")
        if dp is not None and dp * args.mp != gpus:
            raise InputError(f"dp={dp}: dp × mp must equal gpus ({gpus})")
        dp = gpus // args.mp
    zero = dict(ZERO_CONFIGS[args.zero_config]) if args.zero_config else {}
    if args.stage is not None:
        if zero and zero["stage"] != args.stage:
            raise InputError(f"stage={args.stage}: conflicts with zero-config {args.zero_config}")
        zero["stage"] = args.stage
    switches = ("checkpoint_activations", "partition_activations", "offload_activations", "contiguous_buffers")
    for name in switches:
        zero[name] = zero.get(name, False) or getattr(args, name)
    if zero["partition_activations"]:
        zero["checkpoint_activations"] = True  # P_a partitions the checkpoints, so it implies them
    parallel = ParallelConfig(dp=1 if dp is None else dp, **zero, **_attributes(args, ParallelConfig))
    parallel.check_model(model)
    computes = args.command in COMPUTING_COMMANDS
    device = args.device or default_device(args.command)
    mode = args.precision or default_precision(device, computes)
    precision = PrecisionConfig(mode=mode, device=device)
    train = TrainConfig(**_attributes(args, TrainConfig))
    return model, parallel, precision, train


def _value(f, value):
    """A field's value as its configuration attribute takes it: a MiB flag in bytes (0 stays 0
    where the field allows it: `reuse_mb`)."""
    if not f.unit:
        return value
    return 0 if value == 0 and (f.schema or {}).get("minimum") == 0 else mib(value, f.name)


def _attributes(args: SimpleNamespace, config: type) -> dict:
    """The attributes of `config` the trial fields set (zerobench/trial/fields.py), from their values."""
    return {
        f.attribute.name: _value(f, getattr(args, name))
        for name, f in FIELDS.items()
        if f.sets and f.attribute.config is config
    }


def mib(value: float, field: str) -> int:
    if not 0 < value * MiB < math.inf:  # in bytes, so a huge finite MiB count is refused too
        raise InputError(f"{field}={value!r}: must be a finite number > 0")
    return max(1, int(value * MiB))
