"""The kernels one transformer layer runs, by name and shape, and their time on a measured
(calibrated) profile: each GEMM at the rate measured for its own shape, each element-wise kernel
at the bandwidth measured for its tensor size.

Per layer and micro-batch on one MP rank (t = b·s tokens, h hidden, a/mp local heads, d = h/a;
Megatron's column/row split, paper §4.2; the engine's zerobench/model.py has the same layout):
GEMMs `qkv` (t×h)·(h×3h/mp), `proj` (t×h/mp)·(h/mp×h), `fc1` (t×h)·(h×4h/mp),
`fc2` (t×4h/mp)·(4h/mp×h); attention `scores` QKᵀ and `context` P·V, b·a/mp batched (s×d)·(d×s)
and (s×s)·(s×d). Backward runs each GEMM twice (input and weight gradient: the same FLOPs with
the dimensions permuted). The logits GEMM (t×h)·(h×V/mp) runs once per micro-batch.

Element-wise kernels (forward; backward reads and writes twice the bytes): `layernorm` ×2 (read
t·h, write t·h), `gelu` (t·4h/mp each way), `residual_add` ×2 (read 2, write 1 × t·h), and with
`materialized` attention `softmax` over the scores (read and write a/mp·b·s², Megatron's fused
scale-mask-softmax). `fused` attention (flash-style: torch's scaled_dot_product_attention, which
the engine calls) keeps no score matrix and runs no separate softmax pass.
"""

from __future__ import annotations

import math

from zerobench.config import ModelConfig
from zerobench.perfmodel.hardware import HardwareProfile

ATTENTION = ("materialized", "fused")


def check_attention(attention: str) -> str:
    from zerobench.config import ConfigError

    if attention not in ATTENTION:
        raise ConfigError(f"attention={attention!r}: must be one of {ATTENTION}")
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
    kernels = [("layernorm", 2 * 2 * t * h, t * h), ("gelu", 2 * 4 * t * h / mp, 4 * t * h // mp),
               ("residual_add", 2 * 3 * t * h, t * h)]  # fmt: skip
    if attention == "materialized":
        scores = model.heads // mp * micro_batch * model.seq**2
        kernels.append(("softmax", 2 * scores, scores))
    return kernels


def _log_distance(a: tuple, b: tuple) -> float:
    return math.sqrt(sum(math.log2(x / y) ** 2 for x, y in zip(a, b, strict=True)))


def gemm_rate(hw: HardwareProfile, m: int, n: int, k: int) -> float:
    """FLOP/s for an (m×k)·(k×n) GEMM: inverse-distance weighting (power 4) of the measured shapes
    in log2 space; an exactly measured shape returns its own rate."""
    num = den = 0.0
    for rm, rn, rk, rate in hw.gemm_table:
        dist = _log_distance((m, n, k), (rm, rn, rk))
        if dist < 1e-9:
            return rate
        w = dist**-4
        num, den = num + w * rate, den + w
    return num / den


def elementwise_bw(hw: HardwareProfile, nbytes: float) -> float:
    """Bytes/s for a kernel over an `nbytes` tensor: linear in log size between the measured
    sizes, the end values outside them (caches make small tensors faster)."""
    table = sorted(hw.elementwise_table)
    if nbytes <= table[0][0]:
        return table[0][1]
    for (x0, r0), (x1, r1) in zip(table, table[1:], strict=False):
        if nbytes <= x1:
            f = math.log(nbytes / x0) / math.log(x1 / x0)
            return r0 + f * (r1 - r0)
    return table[-1][1]


def measured_compute_time(
    model: ModelConfig, mp: int, micro_batch: int, grad_accum: int, recompute: bool, attention: str,
    act_bytes: int, hw: HardwareProfile, share: float = 1,
) -> tuple[float, dict]:  # fmt: skip
    """(seconds of compute per step, seconds per term) on a measured profile; `share` ranks split
    the host's compute (CPU ranks on one host)."""
    gemm = 0.0
    for _, m, n, k, count in layer_gemms(model, micro_batch, mp):
        # The per-head products run as one batched kernel (bmm, or inside the fused attention
        # kernel): rated as one GEMM with the heads' rows stacked, not `count` small calls.
        flops, rows = 2 * m * n * k * count, m * count
        bwd = flops * (1 / gemm_rate(hw, rows, k, n) + 1 / gemm_rate(hw, k if count == 1 else rows, n, m))
        gemm += flops / gemm_rate(hw, rows, n, k) * (2 if recompute else 1) + bwd
    t, v = micro_batch * model.seq, -(-model.vocab // mp)
    logits = 2 * t * model.hidden * v * (1 / gemm_rate(hw, t, v, model.hidden) + 1 / gemm_rate(hw, t, model.hidden, v)
                                         + 1 / gemm_rate(hw, model.hidden, v, t))  # fmt: skip
    passes = 4 if recompute else 3  # forward, [recompute,] backward = 2 forward's bytes
    ew = sum(io * act_bytes / elementwise_bw(hw, size * act_bytes)
             for _, io, size in layer_elementwise(model, micro_batch, mp, attention))  # fmt: skip
    terms = {"gemm_s": model.layers * gemm + logits, "elementwise_s": model.layers * passes * ew}
    terms = {k: v * grad_accum * share for k, v in terms.items()}
    return sum(terms.values()), terms
