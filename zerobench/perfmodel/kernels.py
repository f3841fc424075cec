"""The kernels one transformer layer runs, by name and shape, and their time on a measured
(calibrated) profile: each linear at the rates measured for its own shape (forward and
backward), each named kernel at the time measured for its size (zerobench/microbench/kernel_bench.py).

Per layer and micro-batch on one MP rank (t = b·s tokens, h hidden, a/mp local heads, d = h/a;
Megatron's column/row split, paper §4.2; the engine's zerobench/engine/model.py has the same layout):
GEMMs `qkv` (t×h)·(h×3h/mp), `proj` (t×h/mp)·(h/mp×h), `fc1` (t×h)·(h×4h/mp),
`fc2` (t×4h/mp)·(4h/mp×h); attention `scores` QKᵀ and `context` P·V, b·a/mp batched (s×d)·(d×s)
and (s×s)·(s×d). Backward runs each GEMM twice (input and weight gradient: the same FLOPs with
the dimensions permuted). The logits GEMM (t×h)·(h×V/mp) runs once per micro-batch. GEMM rates
are measured cold (microbench/kernel_bench.py): a step reads each weight with every other layer between.

Element-wise kernels (forward; backward reads and writes twice the bytes): `layernorm` ×2 (read
t·h, write t·h), `gelu` (t·4h/mp each way), `residual_add` ×2 (read 2, write 1 × t·h), and with
`materialized` attention `softmax` over the scores (read and write a/mp·b·s², Megatron's fused
scale-mask-softmax). `fused` attention (flash-style: torch's scaled_dot_product_attention, which
the engine calls) keeps no score matrix and runs no separate softmax pass. Once per micro-batch:
the loss over the logits, the final layernorm, and the tied embedding's dense V·h/mp gradient
with autograd's add of it to the logits' weight gradient.
"""

from __future__ import annotations

import math

from zerobench.engine.config import ModelConfig
from zerobench.perfmodel.hardware import HardwareProfile
from zerobench.perfmodel.host_cost import host_excess
from zerobench.trial.errors import InputError

ATTENTION = ("materialized", "fused")
ENGINE_ATTENTION = "fused"  # what the engine runs: zerobench/engine/model.py calls scaled_dot_product_attention


def check_attention(attention: str) -> str:

    if attention not in ATTENTION:
        raise InputError(f"attention={attention!r}: must be one of {ATTENTION}")
    return attention


def layer_gemms(model: ModelConfig, micro_batch: int, mp: int) -> list[tuple[str, int, int, int, int]]:
    """(name, m, n, k, count) of one layer's forward GEMMs on one MP rank."""
    s, h, b = model.seq, model.hidden, micro_batch
    t, d, heads = b * s, h // model.heads, b * model.heads // mp
    return [
        ("qkv", t, 3 * h // mp, h, 1), ("proj", t, h, h // mp, 1), ("fc1", t, 4 * h // mp, h, 1),
        ("fc2", t, h, 4 * h // mp, 1), ("scores", s, s, d, heads), ("context", s, d, s, heads),
    ]  # fmt: skip


def layer_elementwise(model: ModelConfig, micro_batch: int, mp: int, attention: str) -> list[tuple[str, float, int]]:
    """(name, elements read + written, tensor elements) of one layer's forward element-wise kernels."""
    t, h = micro_batch * model.seq, model.hidden
    kernels = [
        ("layernorm", 2 * 2 * t * h, t * h),
        ("gelu", 2 * 4 * t * h / mp, 4 * t * h // mp),
        ("residual_add", 2 * 3 * t * h, t * h),
    ]
    if attention == "materialized":
        scores = model.heads // mp * micro_batch * model.seq**2
        kernels.append(("softmax", 2 * scores, scores))
    return kernels


def _log_distance(a: tuple, b: tuple) -> float:
    return math.sqrt(sum(math.log2(x / y) ** 2 for x, y in zip(a, b, strict=True)))


def gemm_rate(hw: HardwareProfile, m: int, n: int, k: int, backward: bool = False) -> float:
    """FLOP/s of F.linear with m tokens, fan-in k, fan-out n (forward, or backward's two GEMMs):
    inverse-distance weighting (power 4) of the measured shapes in log2 space; an exactly
    measured shape returns its own rate. A shape of more FLOPs than any measured one (calibrate
    skips those: their rate has saturated) is read as itself with its largest dimension halved
    until it is within them: a wide GEMM rated as the widest measured, not as its thin neighbours
    (cpu-100m's tied logits, 512 x 32000 x 768: the reading that showed it is in docs/perfmodel.md)."""
    top = max(row[0] * row[1] * row[2] for row in hw.gemm_table)
    dims = [m, n, k]
    while dims[0] * dims[1] * dims[2] > top:
        dims[dims.index(max(dims))] /= 2
    m, n, k = dims
    col = 4 if backward else 3
    num = den = 0.0
    for row in hw.gemm_table:
        dist = _log_distance((m, n, k), row[:3])
        if dist < 1e-9:
            return row[col]
        w = dist**-4
        num, den = num + w * row[col], den + w
    return num / den


def kernel_time(hw: HardwareProfile, name: str, size: float) -> tuple[float, float]:
    """(forward s, backward s) of kernel `name` at `size`: the time per unit of size linear in
    log size between the measured sizes, the end values outside them (caches make small
    tensors faster per element; below the smallest size the per-op cost dominates)."""
    table = sorted((r[1], r[2] / r[1], r[3] / r[1]) for r in hw.kernel_table if r[0] == name)
    if size <= table[0][0]:
        return table[0][1] * size, table[0][2] * size
    for (x0, f0, b0), (x1, f1, b1) in zip(table, table[1:], strict=False):
        if size <= x1:
            w = math.log(size / x0) / math.log(x1 / x0)
            return (f0 + w * (f1 - f0)) * size, (b0 + w * (b1 - b0)) * size
    return table[-1][1] * size, table[-1][2] * size


def _layer_kernels(model: ModelConfig, micro_batch: int, mp: int, attention: str) -> list[tuple[str, float, int]]:
    """(kernel, size, calls) of one layer's named kernels on one MP rank."""
    t, h, s, heads = micro_batch * model.seq, model.hidden, model.seq, model.heads // mp
    kernels = [("layernorm", t * h, 2), ("gelu", t * 4 * h / mp, 1), ("residual_add", t * h, 2)]
    if attention == "fused":
        return [*kernels, ("attention", micro_batch * heads * s * s * (h // model.heads), 1)]
    return [*kernels, ("softmax", micro_batch * heads * s * s, 1)]


def measured_compute_time(
    model: ModelConfig,
    mp: int,
    micro_batch: int,
    grad_accum: int,
    recompute: bool,
    attention: str,
    hw: HardwareProfile,
    share: float = 1,
    mixed: bool = False,
) -> tuple[float, dict]:
    """(seconds of compute per step, seconds per term) on a measured profile; `share` ranks split
    the host's compute (CPU ranks on one host). Each linear at its shape's measured rate, each
    named kernel at its size's, and every op's cost beside its arithmetic. Per micro-batch the
    engine copies each gradient into its flat slot (zero/core.py), and `mixed` (16-bit storage,
    fp32 compute: model.py's `_Cast`) casts every weight up in forward and its gradient down in
    backward: copies of the rank's Ψ/mp elements."""
    fwd = bwd = 0.0
    for _, m, n, k, count in layer_gemms(model, micro_batch, mp):
        if count > 1 and attention == "fused":
            continue  # the scores and context products run inside the fused attention kernel
        # the per-head products run as one batched kernel: rated as one GEMM with the rows stacked
        flops, rows = 2 * m * n * k * count, m * count
        fwd += flops / gemm_rate(hw, rows, n, k)
        bwd += 2 * flops / gemm_rate(hw, rows, n, k, backward=True)
    gemm = model.layers * (fwd * (2 if recompute else 1) + bwd)
    fwd = bwd = 0.0
    for name, size, calls in _layer_kernels(model, micro_batch, mp, attention):
        f, b = kernel_time(hw, name, size)
        fwd, bwd = fwd + calls * f, bwd + calls * b
    kernels = model.layers * (fwd * (2 if recompute else 1) + bwd)
    t, v = micro_batch * model.seq, -(-model.vocab // mp)
    logits = 2 * t * model.hidden * v
    gemm += logits / gemm_rate(hw, t, v, model.hidden) + 2 * logits / gemm_rate(hw, t, v, model.hidden, True)
    loss = "cross_entropy" if mp == 1 else "vocab_cross_entropy"  # Megatron's own passes over sharded logits
    kernels += sum(kernel_time(hw, loss, t * v)) + sum(kernel_time(hw, "layernorm", t * model.hidden))
    # the tied embedding (model.py's TiedVocab): the lookup's dense V·h/mp gradient, and autograd's
    # add of it to the logits' weight gradient (two uses of one leaf: one out-of-place add)
    table = v * model.hidden
    kernels += sum(kernel_time(hw, "embedding", table)) + kernel_time(hw, "residual_add", table)[0]
    kernels += (3 if mixed else 1) * kernel_time(hw, "copy", model.num_params / mp)[0]
    # a recomputed forward dispatches its ops again: about a third of a layer's (forward + backward)
    ops = hw.ops_per_layer * model.layers * (4 / 3 if recompute else 1) + hw.ops_fixed
    # on a GPU the host queues ops ahead of the device: only their excess over its time (host_cost.py)
    host = ops * hw.op_overhead_s
    ops_s = host if hw.ranks_share_compute else host_excess(host, gemm + kernels)
    terms = {"gemm_s": gemm, "kernels_s": kernels, "ops_s": ops_s}
    terms = {k: v * grad_accum * share for k, v in terms.items()}
    return sum(terms.values()), terms
