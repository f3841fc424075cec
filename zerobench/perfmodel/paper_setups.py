"""The paper's ZeRO-100B setting for code that builds configurations directly (the perf model's
unit tests, calibration work): mixed precision, the C_B bucket and the C1-C5 layouts. The paper's
experiments themselves (models, GPUs, MP, batches) are the sheets' trials, workflows/config/sheets/."""

from __future__ import annotations

from zerobench.engine.config import ZERO_CONFIGS, ParallelConfig, PrecisionConfig

PAPER_PRECISION = PrecisionConfig(mode="fp16", device="cuda")  # paper §6: fp16/fp32 mixed precision
# C_B: DeepSpeed's hyperscale configs use a 5e8-element reduce and a 2e8-element all-gather bucket
# (fp16): 1.4 GB together. The model holds two buckets of `bucket_bytes`, so each is their mean;
# the sheets write it as bucket_mb: 667.572021484375 (MiB).
PAPER_BUCKET = (500_000_000 + 200_000_000) * 2 // 2


def zero_parallel(gpus: int, mp: int, config: str = "C4") -> ParallelConfig:
    """ZeRO-100B: P_os+g + ZeRO-R (C_B, M_D, P_a; P_a+cpu in C5), checkpointing every layer (§6)."""
    return ParallelConfig(dp=gpus // mp, mp=mp, checkpoint_activations=True, bucket_bytes=PAPER_BUCKET,
                          **ZERO_CONFIGS[config])  # fmt: skip
