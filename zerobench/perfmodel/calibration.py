"""The performance model's calibration: a handful of physical constants and the points fitted.

Everything the model knows beyond datasheets (hardware.py) and the paper's formulas
(zerobench/memory.py, zerobench/flops.py) is here. `FIT_SET` names the paper points the fitted
constants were fitted on; every other paper number is judged (see docs/perfmodel.md).
`fit()` re-derives the fitted values from `FIT_SET` with a small Nelder–Mead, so the numbers in
`DEFAULT` can be checked; nothing else in the package calls it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from zerobench.perfmodel.hardware import GiB


@dataclass(frozen=True)
class Calibration:
    # --- compute (fitted) -------------------------------------------------------------------
    gemm_eff_max: float = 0.703  # fraction of tensor peak reached by saturated, large GEMMs
    tokens_half: float = 3100.0  # tokens per micro-batch (b·s) at which efficiency is half-saturated
    width_half: float = 0.0  # per-GPU width h/mp at which efficiency is half-saturated (0: not used)
    elementwise_traffic: float = 6.31  # HBM bytes moved per stored activation byte, per pass
    # --- network (fitted / judged) ----------------------------------------------------------
    ib_efficiency: float = 0.607  # achieved fraction of InfiniBand bandwidth (fitted)
    overlap_grad_reduce: bool = False  # ZeRO's gradient reduction hides behind the last backward (judged: no)
    ddp_overlap: bool = True  # PyTorch DDP (stage 0, mp 1) all-reduces its buckets during backward (judged: yes)
    # P_os as DeepSpeed's code had it (judged, docs/perfmodel.md "Gradient copies"). False: May 2020
    # (the code with stage 2 and ZeRO-R, Fig 5-7): reduce-scatter of a flat copy of every gradient.
    # True: ZeRO-OS of Feb 2020 (Table 2's "measured"): the engine all-reduces, no copy.
    zero_os_stage1: bool = False
    nvlink_efficiency: float = 0.699  # achieved fraction of NVLink/NVSwitch bandwidth (fitted)
    # --- memory (fitted / judged) -----------------------------------------------------------
    reserve_bytes: float = 1.70 * GiB  # CUDA context, NCCL buffers, allocator slack: never usable (fitted)
    fragmentation: float = 0.105  # fraction of memory lost to fragmentation without M_D (fitted)
    cache_headroom: float = 0.42  # fraction of free headroom PyTorch's cache also holds (fitted)
    fp32_grad_shard: float = 1.0  # 1: count DeepSpeed's fp32 gradient shard (4Ψ/(N_m·N_d)); 0: paper formula only
    working_set_factor: float = 2.0  # one layer's activations + their gradients in backward (judged)
    # --- fixed costs (judged) ---------------------------------------------------------------
    hbm_efficiency: float = 0.80  # achieved fraction of HBM bandwidth in the Adam step
    adam_bytes_per_param: float = 28.0  # fp32 p, m, v read+write (24) + fp16 grad in, fp16 param out
    step_overhead_s: float = 0.10  # per-step launch, norm and loss-scale bookkeeping, s

    def replace(self, **changes) -> Calibration:
        return dataclasses.replace(self, **changes)


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
FIT_SET = sorted({point for points in FITTED.values() for point in points})
THROUGHPUT_KNOBS = ("gemm_eff_max", "tokens_half", "elementwise_traffic", "ib_efficiency", "nvlink_efficiency")
_BOUNDS = {"gemm_eff_max": (0.2, 0.9), "tokens_half": (100.0, 20000.0), "elementwise_traffic": (0.0, 10.0),
           "ib_efficiency": (0.3, 1.0), "nvlink_efficiency": (0.3, 1.0)}  # fmt: skip


def _error(cal: Calibration, artifact: str, key: str) -> float:
    from zerobench.perfmodel.artifacts import ARTIFACTS  # lazy: artifacts import this module

    df = ARTIFACTS[artifact](cal)
    err = df.loc[df["key"] == key, "error_pct"].astype(float)
    return abs(float(err.iloc[0])) if len(err) and err.notna().all() else 1e3


def _scan(cal: Calibration, name: str, grid, points) -> Calibration:
    """The middle of the grid values with the least worst error on `points` (step-function fits)."""
    errs = [max(_error(cal.replace(**{name: v}), *p) for p in points) for v in grid]
    best = [v for v, e in zip(grid, errs, strict=False) if e <= min(errs) + 1e-9]
    return cal.replace(**{name: best[len(best) // 2]})


def _nelder_mead(f, x0, steps, iters):
    pts = [list(x0)] + [[x + (s if i == j else 0.0) for j, x in enumerate(x0)] for i, s in enumerate(steps)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(len(pts)), key=vals.__getitem__)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        c = [sum(p[j] for p in pts[:-1]) / (len(pts) - 1) for j in range(len(x0))]
        xr = [2 * c[j] - pts[-1][j] for j in range(len(x0))]
        fr = f(xr)
        if fr < vals[0]:
            xe = [3 * c[j] - 2 * pts[-1][j] for j in range(len(x0))]
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = [(c[j] + pts[-1][j]) / 2 for j in range(len(x0))]
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0]] + [[(a + b) / 2 for a, b in zip(pts[0], p, strict=False)] for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    i = min(range(len(pts)), key=vals.__getitem__)
    return pts[i], vals[i]


def fit(start: Calibration = DEFAULT, iters: int = 200) -> Calibration:
    """Re-fit the fitted constants on FIT_SET: memory first (scans), then the throughput knobs
    (Nelder–Mead on the mean |error| of their points, inside physical bounds). Minutes."""
    cal = _scan(start, "reserve_bytes", [i * GiB / 20 for i in range(0, 61)], FITTED["reserve_bytes"])
    cal = _scan(cal, "fragmentation", [i / 200 for i in range(0, 61)], FITTED["fragmentation"])
    cal = _scan(cal, "cache_headroom", [i / 100 for i in range(0, 81)], FITTED["cache_headroom"])
    points = FITTED[", ".join(THROUGHPUT_KNOBS)]

    def objective(x):
        if any(not lo <= v <= hi for v, (lo, hi) in zip(x, (_BOUNDS[k] for k in THROUGHPUT_KNOBS), strict=False)):
            return 1e6
        trial = cal.replace(**dict(zip(THROUGHPUT_KNOBS, x, strict=False)))
        return sum(_error(trial, *p) for p in points) / len(points)

    x0 = [getattr(cal, k) for k in THROUGHPUT_KNOBS]
    x, _ = _nelder_mead(objective, x0, [0.1 * v or 0.5 for v in x0], iters)
    return cal.replace(**dict(zip(THROUGHPUT_KNOBS, x, strict=False)))


if __name__ == "__main__":
    fitted = fit()
    for field in dataclasses.fields(fitted):
        print(f"{field.name} = {getattr(fitted, field.name)!r}")
