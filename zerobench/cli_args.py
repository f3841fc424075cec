"""The trial flags of `zerobench run`, `trace`, `model`, `estimate` and `peers`, made from the
trial fields (zerobench/fields.py), and a trial's values translated into the validated configs
(zerobench/config.py): errors name the field."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from types import SimpleNamespace

from zerobench.config import (
    ZERO_CONFIGS,
    ConfigError,
    ModelConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainConfig,
    preset,
)
from zerobench.fields import FIELDS, MiB, takes
from zerobench.trial import default_precision

COMPUTING_COMMANDS = ("run", "peers")  # the commands that compute real steps (trial.default_precision)
GROUPS = {
    "model": "model",
    "parallel": "parallel layout and ZeRO",
    "train": "training",
    "hardware": "the performance model",
    "search": "what runs where the listed size does not fit",
    "run": "this run",
    "trace": "the trace",
}


def trial_args(p: argparse.ArgumentParser, command: str) -> None:
    """The flags of every trial field `command` takes (zerobench/fields.py), in sections."""
    groups = {}
    for f in FIELDS.values():
        if not takes(command, f.name):
            continue
        g = groups.get(f.group) or groups.setdefault(f.group, p.add_argument_group(GROUPS[f.group]))
        if f.kind is bool:
            g.add_argument(f.option, action="store_true", help=f.help)
        else:
            g.add_argument(f.option, type=f.kind, default=f.default, choices=f.choices, help=f.help)


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
    parallel = ParallelConfig(
        dp=1 if dp is None else dp,
        mp=args.mp,
        bucket_bytes=mib(args.bucket_mb, "bucket_mb"),
        prefetch_bytes=mib(args.prefetch_mb, "prefetch_mb"),
        max_live_bytes=mib(args.max_live_mb, "max_live_mb"),
        persistence_threshold=args.persistence_threshold,
        reuse_bytes=mib(args.reuse_mb, "reuse_mb") if args.reuse_mb else 0,
        **zero,
    )
    parallel.check_model(model)
    computes = args.command in COMPUTING_COMMANDS
    mode = args.precision or default_precision(args.device, computes)
    precision = PrecisionConfig(mode=mode, device=args.device)
    train = TrainConfig(**{f.sets: getattr(args, name) for name, f in FIELDS.items() if f.sets})
    return model, parallel, precision, train


def mib(value: float, field: str) -> int:
    if not 0 < value * MiB < math.inf:  # in bytes, so a huge finite MiB count is refused too
        raise ConfigError(f"{field}={value!r}: must be a finite number > 0")
    return max(1, int(value * MiB))
