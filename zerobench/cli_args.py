"""The trial flags shared by `zerobench run`, `trace`, `model`, `estimate` and `peers`, and their
translation into the validated configs (zerobench/config.py): errors name the field."""

from __future__ import annotations

import argparse
import math

from zerobench.config import (
    ZERO_CONFIGS,
    ConfigError,
    ModelConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainConfig,
    preset,
)
from zerobench.trial import default_precision

MiB = 2**20
COMPUTING_COMMANDS = ("run", "peers")  # the commands that compute real steps (trial.default_precision)


def model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default="tiny", help="preset name (see `zerobench presets`)")
    for name in ("layers", "hidden", "heads", "seq", "vocab"):
        g.add_argument(f"--{name}", type=int, help=f"override the preset's {name}")


def parallel_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallel layout and ZeRO")
    g.add_argument("--dp", type=int, default=None, help="data-parallel degree N_d (default 1, or gpus/mp)")
    g.add_argument("--mp", type=int, default=1, help="tensor model-parallel degree N_m")
    g.add_argument("--stage", type=int, default=None, help="ZeRO-DP stage 0-3 (0 = plain DP)")
    g.add_argument("--zero-config", choices=sorted(ZERO_CONFIGS), help="the paper's C1-C5 (sets stage and ZeRO-R)")
    g.add_argument("--bucket-mb", type=float, default=25.0, help="C_B: fused buffer size in MiB")
    g.add_argument("--checkpoint-activations", action="store_true", help="one checkpoint per block")
    g.add_argument("--partition-activations", action="store_true", help="P_a: split checkpoints over MP")
    g.add_argument("--offload-activations", action="store_true", help="P_a+cpu: checkpoints to host")
    g.add_argument("--contiguous-buffers", action="store_true", help="M_D: preallocated contiguous buffers")
    g.add_argument("--prefetch-mb", type=float, default=50.0, help="stage 3: gathered bytes in flight")
    g.add_argument("--max-live-mb", type=float, default=8192.0, help="stage 3: gathered bytes alive at once")
    g.add_argument("--persistence-threshold", type=int, default=0, help="stage 3: keep tensors this small whole")


def train_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training")
    g.add_argument(
        "--precision",
        help="fp32, bf16 or fp16 (16-bit = 2+2+12 bytes/param); default fp16, or fp32 for steps computed on a cpu",
    )
    g.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL)")
    g.add_argument("--micro-batch", type=int, default=1, help="sequences per DP rank per micro-step")
    g.add_argument("--grad-accum", type=int, default=1)
    g.add_argument("--steps", type=int, default=5, help="timed steps")
    g.add_argument("--warmup", type=int, default=1, help="untimed steps before timing")
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument(
        "--clip-norm", type=float, default=TrainConfig.clip_norm, help="global gradient-norm clip; 0 disables it"
    )
    g.add_argument("--seed", type=int, default=1234)


def hardware_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("hardware")
    g.add_argument(
        "--hardware", default="v100-32gb-dgx2",
        help="profile: v100-32gb-dgx2, a100-80gb, h100-80gb, h200-141gb, or a `zerobench calibrate` JSON path/name",
    )  # fmt: skip
    g.add_argument("--attention", choices=("materialized", "fused"),
                   help="attention kernel: s² scores + softmax pass (the paper's code; default of `model`) or "
                   "flash-style (today's codes; default of `estimate`)")  # fmt: skip
    g.add_argument("--gpus", type=int, help="total GPUs (sets dp = gpus / mp)")
    g.add_argument("--gpus-per-node", type=int, help="override the profile's node size")


def configs(args) -> tuple[ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig]:
    """Validated configs from parsed arguments; raises ConfigError naming the field."""
    model = preset(args.model).with_overrides(
        layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq, vocab=args.vocab
    )
    dp = args.dp
    gpus = getattr(args, "gpus", None)
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
        **zero,
    )
    parallel.check_model(model)
    computes = getattr(args, "command", None) in COMPUTING_COMMANDS
    mode = args.precision or default_precision(args.device, computes)
    precision = PrecisionConfig(mode=mode, device=args.device)
    train = TrainConfig(
        micro_batch=args.micro_batch,
        grad_accum=args.grad_accum,
        steps=args.steps,
        warmup=args.warmup,
        lr=args.lr,
        clip_norm=args.clip_norm,
        seed=args.seed,
    )
    return model, parallel, precision, train


def mib(value: float, field: str) -> int:
    if not 0 < value * MiB < math.inf:  # in bytes, so a huge finite MiB count is refused too
        raise ConfigError(f"{field}={value!r}: must be a finite number > 0")
    return max(1, int(value * MiB))
