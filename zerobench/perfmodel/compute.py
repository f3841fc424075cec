"""Compute time of one training step on one GPU.

FLOPs follow the project's one convention (zerobench/flops.py: 96·B·s·L·h²(1 + s/6h + V/16Lh) with
recomputation, 72·… without; paper.md §6). The achieved rate is peak × an efficiency that
saturates with the size of the GEMMs each GPU runs: the rows are the tokens of a micro-batch
(b·s), the narrow dimension is the per-GPU width h/mp (Megatron splits every weight across the MP
group, paper §4.2). Both enter as x/(x + x_half), the usual shape of GEMM efficiency curves
(Calculon keys a step table on the same sizes; simulators.md §7.1).

Beside the GEMMs, every pass streams the layer's activations through memory-bound kernels
(layernorm, GeLU, dropout, softmax, residual adds). Their time is modelled as
`elementwise_traffic` × the layer's stored activation bytes (Korthikanti et al. 2022, the same
count feasibility.py uses; Megatron replicates the layernorm/dropout part on every MP rank) per
pass, over HBM bandwidth. This is what makes narrow models and many heads slow.

The attention-score GEMMs (QKᵀ and softmax·V, the s/6h term of the FLOP count) have the head
size h/a as a dimension. Where it is not a multiple of the hardware's tensor-core alignment (8 on
V100 with CUDA 10: GPT-2 1.5B's 1600/16 = 100), they run on the CUDA cores at the datasheet
non-tensor fp16 rate, with the same efficiency.

`attention` is the kernel the code runs (kernels.py): `materialized` (the paper's 2020 code: the
s² scores stored and a separate softmax pass, in the element-wise bytes above) or `fused`
(flash-style: neither). On a measured profile (`zerobench calibrate`) every GEMM and element-wise
kernel is timed from its own shape instead (kernels.measured_compute_time).
"""

from __future__ import annotations

from zerobench.engine.config import ModelConfig
from zerobench.flops import step_flops
from zerobench.perfmodel.constants import Calibration
from zerobench.perfmodel.hardware import HardwareProfile
from zerobench.perfmodel.kernels import kernel_time, layer_elementwise, measured_compute_time


def gemm_efficiency(tokens: float, width: float, cal: Calibration) -> float:
    """Fraction of peak reached with `tokens` rows per GEMM and a per-GPU width of `width`."""
    width_factor = width / (width + cal.width_half) if cal.width_half > 0 else 1.0
    return cal.gemm_eff_max * tokens / (tokens + cal.tokens_half) * width_factor


def flops_per_gpu(model: ModelConfig, mp: int, micro_batch: int, grad_accum: int, recompute: bool) -> float:
    """FLOPs one GPU executes per step: its replica's share (1/mp) of the replica's work."""
    return step_flops(model, micro_batch * grad_accum, recompute) / mp


def compute_time(
    model: ModelConfig,
    mp: int,
    micro_batch: int,
    grad_accum: int,
    recompute: bool,
    hw: HardwareProfile,
    cal: Calibration,
    attention: str = "materialized",
    act_bytes: int = 2,
    share: float = 1,
    mixed: bool = False,
) -> tuple[float, float]:
    """(seconds of compute per step, efficiency used) for one GPU: GEMMs plus memory-bound ops.
    On a measured profile the efficiency is 1 (its rates are achieved), `share` ranks split
    the host and `mixed` is 16-bit storage computed in fp32 (casts)."""
    if hw.measured:
        return measured_compute_time(model, mp, micro_batch, grad_accum, recompute, attention, hw, share, mixed)[0], 1.0
    eff = gemm_efficiency(micro_batch * model.seq, model.hidden / mp, cal)
    flops = flops_per_gpu(model, mp, micro_batch, grad_accum, recompute)
    gemm = flops / (hw.peak_flops * eff)
    if hw.unaligned_flops and (model.hidden // model.heads) % hw.tensor_core_align:
        s, h, layers, v = model.seq, model.hidden, model.layers, model.vocab
        share = (s / (6 * h)) / (1 + s / (6 * h) + v / (16 * layers * h))  # attention scores' FLOP share
        gemm += flops * share / eff * (1 / hw.unaligned_flops - 1 / hw.peak_flops)
    passes = 4 if recompute else 3  # forward, [recomputed forward,] backward (2x forward)
    moved = sum(io for _, io, _ in layer_elementwise(model, micro_batch, mp, attention)) * act_bytes
    elementwise = cal.elementwise_traffic * passes * model.layers * moved * grad_accum / hw.hbm_bw
    return gemm + elementwise, eff


def backward_fraction(recompute: bool) -> float:
    """Share of a micro-batch's compute spent in backward (2 of 3 passes, or 2 of 4 with recompute
    ; the recomputed forward runs inside backward, so with recompute 3 of 4 passes are backward)."""
    return 3.0 / 4.0 if recompute else 2.0 / 3.0


def optimizer_time(
    params_on_gpu: float, hw: HardwareProfile, cal: Calibration, share: float = 1, clip: bool = True
) -> float:
    """Adam over the parameters this GPU updates: memory bound (fp32 states streamed once), or on
    a calibrated profile Adam and (`clip`) the global-norm clip as measured at that many
    parameters (`share` ranks split the host)."""
    if hw.measured:
        steps = ("adam", "clip") if clip else ("adam",)
        return sum(kernel_time(hw, name, params_on_gpu)[0] for name in steps) * share
    return params_on_gpu * cal.adam_bytes_per_param / (hw.hbm_bw * cal.hbm_efficiency)
