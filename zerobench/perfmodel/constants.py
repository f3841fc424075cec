"""The performance model's calibration: a handful of physical constants and the points fitted.

Everything the model knows beyond datasheets (hardware.py) and the paper's formulas
(zerobench/memory.py, zerobench/flops.py) is here. `FIT_SET` names the paper points the fitted
constants were fitted on; every other paper number is judged (see docs/perfmodel.md).
`zerobench/fitting/fit.py` re-derives the fitted values in `DEFAULT` from `FIT_SET`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from zerobench.perfmodel.hardware import GiB

# Fraction of the datasheet bf16 tensor peak (hardware.py) that large, well-shaped GEMMs reach, measured:
# "Maximum Achievable Matmul FLOPS" (MAMF) table, BF16, v2 (mean of 100 iterations after 50 warm-up, cache
# reset), Stas Bekman, ml-engineering, compute/accelerator/README.md (commit b9e2972), by mamf-finder.py.
GEMM_EFF_MEASURED = {
    "a100-80gb": 271.2 / 312,  # A100 SXM: 271.2 of 312 TFLOPS (86.9 %), torch 2.6.0+cu126
    "h100-80gb": 794.5 / 989,  # H100 SXM: 794.5 of 989 TFLOPS (80.3 %), torch 2.7.0+cu126
    # No H200 row in the table. The H200 is the H100's die at the same 700 W, so the H100's value (judged);
    # the GH200 row (same die with 141 GB HBM3e, but at 900 W) reads 828.6 of 989 TFLOPS (83.6 %).
    "h200-141gb": 794.5 / 989,
}


@dataclass(frozen=True)
class Calibration:
    # --- compute (fitted) -------------------------------------------------------------------
    gemm_eff_max: float = 0.5831  # fraction of tensor peak reached by saturated, large GEMMs
    tokens_half: float = 2571.2  # tokens per micro-batch (b·s) at which efficiency is half-saturated
    width_half: float = 0.0  # per-GPU width h/mp at which efficiency is half-saturated (0: not used)
    elementwise_traffic: float = 4.557  # HBM bytes moved per byte the named kernels move (kernels.py), >= 1
    # --- network (fitted / judged) ----------------------------------------------------------
    ib_efficiency: float = 0.7659  # achieved fraction of InfiniBand bandwidth (fitted)
    overlap_grad_reduce: bool = False  # ZeRO's gradient reduction hides behind the last backward (judged: no)
    ddp_overlap: bool = True  # PyTorch DDP (stage 0, mp 1) all-reduces its buckets during backward (judged: yes)
    # P_os as DeepSpeed's code had it (judged, docs/perfmodel.md "Gradient copies"). False: May 2020
    # (the code with stage 2 and ZeRO-R, Fig 5-7): reduce-scatter of a flat copy of every gradient.
    # True: ZeRO-OS of Feb 2020 (Table 2's "measured"): the engine all-reduces, no copy.
    zero_os_stage1: bool = False
    nvlink_efficiency: float = 0.9996  # achieved fraction of NVLink/NVSwitch bandwidth (fitted)
    # --- memory (fitted / judged) -----------------------------------------------------------
    reserve_bytes: float = 1.70 * GiB  # CUDA context, NCCL buffers, allocator slack: never usable (fitted)
    fragmentation: float = 0.105  # fraction of memory lost to fragmentation without M_D (fitted)
    cache_headroom: float = 0.42  # fraction of free headroom PyTorch's cache also holds (fitted)
    fp32_grad_shard: float = 1.0  # 1: count DeepSpeed's fp32 gradient shard (4Ψ/(N_m·N_d)); 0: paper formula only
    working_set_factor: float = 2.0  # one layer's activations + their gradients in backward (judged)
    # --- memory behaviour of the training code (read from the code; defaults: the paper's) -------
    # True: the loss is a fused cross-entropy that keeps the 16-bit logits and writes a 16-bit gradient
    # (flash-attn's xentropy, as llm-foundry runs it); False: Megatron's fp32 softmax copy (feasibility.py).
    fused_cross_entropy: bool = False
    # True: stage 3 is PyTorch FSDP: fp32 flat parameters, gradients and Adam state (16 B per parameter in
    # all, no separate fp32 gradient copy) and whole FSDP units gathered in place of DeepSpeed's buckets.
    fsdp: bool = False
    # True: stage 0 accumulates gradients straight into an fp32 contiguous buffer and all-reduces it in
    # place (Megatron/NeMo O2 in bf16): no resident 16-bit gradients, no flattened copy to reduce.
    fp32_main_grads: bool = False
    # --- fixed costs (judged) ---------------------------------------------------------------
    hbm_efficiency: float = 0.80  # achieved fraction of HBM bandwidth in the Adam step
    adam_bytes_per_param: float = 28.0  # fp32 p, m, v read+write (24) + fp16 grad in, fp16 param out
    step_overhead_s: float = 0.10  # per-step launch, norm and loss-scale bookkeeping, s

    # Compute constants of other GPUs (profile name -> {field: value}); a profile not listed uses the
    # V100 values above. gemm_eff_max is measured (GEMM_EFF_MEASURED below); tokens_half and
    # elementwise_traffic, which no microbenchmark found gives, are fitted on the GPU's own published
    # runs only (FITTED below, fit.py `fit_hardware`).
    per_hardware: dict = dataclasses.field(
        default_factory=lambda: {
            name: dict(gemm_eff_max=GEMM_EFF_MEASURED[name], **fitted)
            for name, fitted in {
                "a100-80gb": dict(tokens_half=622.5, elementwise_traffic=4.044),
                "h100-80gb": dict(tokens_half=100.0, elementwise_traffic=4.303),
                # No published H200 run in the set: the H100's fitted values, as the H200 has the same
                # GH100 compute die, clocks, power limit (700 W) and tensor peak (datasheets); only its
                # memory differs. Judged, the one exception to "fitted on the hardware it models".
                "h200-141gb": dict(tokens_half=100.0, elementwise_traffic=4.303),
            }.items()
        }
    )

    def replace(self, **changes) -> Calibration:
        return dataclasses.replace(self, **changes)

    def for_hardware(self, name: str) -> Calibration:
        """These constants with `name`'s own fitted values in place of the V100 ones."""
        return self.replace(**self.per_hardware.get(name, {})) if name in self.per_hardware else self


DEFAULT = Calibration()

# Constants fitted, and the paper points (artifact, key) each group of constants was fitted on.
FITTED = {
    "reserve_bytes": [("fig5", "C4"), ("fig8", "max model ZeRO-DP")],
    "fragmentation": [("table2", "MP 1 P_os measured")],
    "cache_headroom": [("fig6", "40B C4")],
    "gemm_eff_max, tokens_half, elementwise_traffic, ib_efficiency, nvlink_efficiency": [
        ("fig2", "ZeRO 8B"),
        ("fig2", "ZeRO 100B"),
        ("fig2", "baseline 8B"),
        ("fig2", "baseline 80B"),
        ("fig7", "60B C4"),
        ("fig8", "ZeRO 2.5B"),
        ("fig8", "ZeRO 11B"),
        ("fig8", "DDP 1.16B"),
    ],
}
# The GPUs' own fitted constants (Calibration.per_hardware less the measured gemm_eff_max): `python -m
# zerobench.fitting.fit a100-80gb h100-80gb`, each on the `fit` rows of its own hardware in
# zerobench/data/external_runs.csv only (split committed before any fitting); the `validation` rows
# judge them (docs/perfmodel.md).
FITTED["per_hardware"] = [  # its tokens_half and elementwise_traffic
    ("external_runs", "a100-80gb fit rows"),
    ("external_runs", "h100-80gb fit rows"),
]
FIT_SET = sorted({point for points in FITTED.values() for point in points})
