"""The paper's memory formulas (analytic) and the measurement helpers the engine reports with.

Analytic: model states per device for each ZeRO-DP stage (paper §5, Table 1), activation
checkpoints with and without P_a (§6.1), and the fused-buffer sizes of §3.2. Units are bytes; the
paper's "GB" is 10⁹ bytes.
"""

from __future__ import annotations

import resource
import sys

from zerobench.stages import STATES, rule

# Bytes per parameter held as weights (p), gradients (g) and optimizer state (k) — paper §3.1:
# mixed precision keeps 16-bit weights and gradients and an fp32 master copy plus Adam's two
# fp32 moments (k = 12); fp32 training keeps only the two moments (k = 8).
BYTES_PER_PARAM = {"fp32": (4, 4, 8), "bf16": (2, 2, 12), "fp16": (2, 2, 12)}


def model_state_bytes(
    num_params: float, stage: int, dp: int, mp: int = 1, pgk: tuple[int, int, int] = BYTES_PER_PARAM["fp16"]
) -> dict[str, float]:
    """Per-device parameter, gradient and optimizer-state bytes (paper §5.1–5.3, Table 1).

    Each MP rank holds Ψ/N_m parameters and ZeRO-DP partitions those across N_d (Table 2).
    """
    psi = num_params / mp
    partitioned = rule(stage)  # what the stage splits over N_d (stages.py)
    return {state: b * psi / partitioned.divisor(state, dp) for state, b in zip(STATES, pgk)}


def total_model_state_bytes(num_params: float, stage: int, dp: int, mp: int = 1, pgk=BYTES_PER_PARAM["fp16"]) -> float:
    return sum(model_state_bytes(num_params, stage, dp, mp, pgk).values())


def build_peak_bytes(states: dict[str, float], drawn_bytes: float) -> float:
    """Peak bytes per device while an engine is built in the memory it trains in (paper §5.3: no
    rank ever holds the whole model): its parameters' storage is allocated first and filled one
    parameter at a time from that parameter's initial value (`drawn_bytes`: what one draw holds
    at once, at most), then the gradients and optimizer states are allocated:
    max(params + drawn, model states). `states` as `model_state_bytes` returns them."""
    return max(states["param_bytes"] + drawn_bytes, sum(states.values()))


def checkpoint_bytes(
    micro_batch: int, seq: int, hidden: int, layers: int, mp: int = 1, partitioned: bool = False, elem_bytes: int = 2
) -> float:
    """Activation checkpoints per device with one checkpoint (the block input, b·s·h elements) per
    layer: replicated on every MP rank, or 1/N_m of it with P_a (paper §6.1)."""
    total = elem_bytes * micro_batch * seq * hidden * layers
    return total / mp if partitioned else total


def peak_rss_bytes() -> int:
    """Peak resident set size of this process since it started or since `reset_peak_rss` (CPU
    runs): Linux's VmHWM, which clear_refs resets. Not getrusage's ru_maxrss: that one keeps the
    parent's RSS at fork across exec, so a rank started by a 600 MiB process "peaks" at 600 MiB."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def reset_peak_rss() -> int:
    """Reset this process's peak-RSS mark to its current RSS (Linux clear_refs) and return that RSS,
    so peak - baseline is what a trial itself added (the ~250 MB of torch runtime left out)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not Linux or not permitted: the peak then also counts import-time transients
        pass
    return current_rss_bytes()


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize()
