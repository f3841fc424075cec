"""Table 2 (largest model per MP degree and stage) and the paper's experiments on today's GPUs."""

from __future__ import annotations

import pandas as pd

from zerobench.config import PRESETS, ModelConfig, ParallelConfig
from zerobench.memory import total_model_state_bytes
from zerobench.perfmodel import paper_setups as ps
from zerobench.perfmodel.calibration import DEFAULT, Calibration
from zerobench.perfmodel.common import PREC, capped, paper, row, zero_best
from zerobench.perfmodel.hardware import get_profile
from zerobench.perfmodel.memory_fit import max_layers

STAGES = {0: "baseline", 1: "P_os", 2: "P_os+g", 3: "P_os+g+p"}
PAPER_GB = 32e9  # Table 2's theoretical columns: 32 GB of model states (paper.md §3)
# Table 2 gives no shapes: one width per MP degree (heads divisible by MP), layers searched.
TABLE2_WIDTH = {1: (3072, 24), 2: (4096, 32), 4: (6144, 48), 8: (8192, 64), 16: (12288, 96)}


def table2(cal: Calibration = DEFAULT) -> pd.DataFrame:
    """Largest model per MP degree (DP 64) and stage: the formula with model states only, and the
    model with residual memory (batch 1, checkpointing, no ZeRO-R: as the paper's measured runs,
    baseline Megatron and the older ZeRO-OS, i.e. P_os, without C_B/M_D/P_a)."""
    hw = get_profile("v100-32gb-dgx2")
    zero_os = cal.replace(zero_os_stage1=True)  # the measured P_os column is ZeRO-OS (its label)
    rows = []
    for mp, (hidden, heads) in TABLE2_WIDTH.items():
        for stage, label in STAGES.items():
            theory = PAPER_GB / total_model_state_bytes(1.0, stage, 64, mp) / 1e9
            p = paper("table2", "max_model_size_theoretical", mp=mp, stage_or_config=label)
            rows.append(row("table2", f"MP {mp} {label} theory", theory, p, source="formula", mp=mp, stage=stage))
            par = ParallelConfig(dp=64, mp=mp, stage=stage, checkpoint_activations=True, bucket_bytes=ps.PAPER_BUCKET)
            shape = ModelConfig(layers=1, hidden=hidden, heads=heads)
            layers = max_layers(shape, par, PREC, 1, hw, zero_os)
            size = ModelConfig(layers=max(layers, 1), hidden=hidden, heads=heads).num_params / 1e9 if layers else 0.0
            measured = None
            if stage in (0, 1):
                label_measured = label + (" (" if stage else "")  # "P_os (ZeRO-OS)" in the CSV
                measured = paper("table2", "max_model_size_measured", mp=mp, stage_or_config=label_measured)
            key = f"MP {mp} {label} measured" if stage <= 1 else f"MP {mp} {label} modelled"
            rows.append(row("table2", key, size, measured, mp=mp, stage=stage, max_layers=layers, hidden=hidden))
    return pd.DataFrame(rows)


# The paper's experiments re-run on today's nodes: (label, preset, GPUs, paper MP, ZeRO or baseline)
TODAY = [
    ("Fig 2 ZeRO 8B", "gpt-8b", 400, 4, "zero"),
    ("Fig 2 ZeRO 100B", "gpt-100b", 400, 16, "zero"),
    ("Fig 2 ZeRO 170B", "gpt-170b", 400, 16, "zero"),
    ("Fig 2 Megatron 100B (MP 128)", "gpt-100b", 384, 128, "baseline"),
    ("Fig 3 60B on 64 GPUs", "gpt-60b-scaling", 64, 16, "zero"),
    ("Fig 3 60B on 128 GPUs", "gpt-60b-scaling", 128, 16, "zero"),
    ("Fig 3 60B on 400 GPUs", "gpt-60b-scaling", 400, 16, "zero"),
    ("Fig 8 ZeRO-DP 8B", "dp-8b", 128, 1, "zero"),
    ("Fig 8 ZeRO-DP 13B", "dp-13b", 128, 1, "zero"),
    ("Fig 8 DDP 1.16B", "ddp-1.16b", 128, 1, "baseline"),
]
GLOBAL_BATCH_CAP = 2048  # sequences: LM practice of 512–2K (paper §10.3), so b ≤ 2048/DP


def today(cal: Calibration = DEFAULT) -> pd.DataFrame:
    """What the paper's experiments predict on A100/H100/H200 nodes (and the V100 DGX-2 beside
    them), with today's fused (flash-style) attention. ZeRO keeps MP inside a node (MP = min(paper
    MP, GPUs per node)); each run at the largest micro-batch that fits, capped at a global batch
    of 2K sequences."""
    rows = []
    for hw_name in ("v100-32gb-dgx2", "a100-80gb", "h100-80gb", "h200-141gb"):
        hw = get_profile(hw_name)
        for label, name, gpus, mp, kind in TODAY:
            model = PRESETS[name]
            if kind == "zero":
                mp = min(mp, hw.gpus_per_node)
                cap = max(1, GLOBAL_BATCH_CAP // (gpus // mp))
                r = zero_best(model, gpus, mp, cap, cal, hw_name, attention="fused")
            else:
                model = ps.with_heads(name, max(model.heads, mp))
                par = ps.baseline_parallel(gpus, mp)
                r = dict(config="baseline", **capped(model, par, 4, hw_name, cal, attention="fused"))
            rows.append(row("today", f"{label} | {hw_name}", r.get("tflops"), None, experiment=label,
                            hardware=hw_name, gpu=hw.gpu, gpus=gpus, mp=mp, peak_tflops=hw.peak_flops / 1e12,
                            **r))  # fmt: skip
    return pd.DataFrame(rows)
