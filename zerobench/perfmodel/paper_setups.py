"""The paper's ZeRO-100B setting for code that builds configurations directly (the perf model's
unit tests, calibration work): mixed precision, the C_B bucket and the C1-C5 layouts. The paper's
experiments themselves (models, GPUs, MP, batches) are the sheets' trials, workflows/config/sheets/."""

from __future__ import annotations

from zerobench.engine.config import PAPER_BUCKET, ZERO_CONFIGS, ParallelConfig, PrecisionConfig

PAPER_PRECISION = PrecisionConfig(mode="fp16", device="cuda")  # paper §6: fp16/fp32 mixed precision


def zero_parallel(gpus: int, mp: int, config: str = "C4") -> ParallelConfig:
    """ZeRO-100B: P_os+g + ZeRO-R (C_B, M_D, P_a; P_a+cpu in C5), checkpointing every layer (§6)."""
    return ParallelConfig(
        dp=gpus // mp, mp=mp, checkpoint_activations=True, bucket_bytes=PAPER_BUCKET, **ZERO_CONFIGS[config]
    )
