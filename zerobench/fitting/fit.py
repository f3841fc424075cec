"""Re-derive the fitted constants of `constants.DEFAULT` from the paper points in `FIT_SET`.

Memory constants by grid scans (least worst error on their points), then the five throughput
knobs jointly by a small Nelder–Mead on the mean |error| of theirs, inside physical bounds.
`python -m zerobench.fitting.fit` prints the result; DEFAULT is its fixed
point, which tests/unit/test_perfmodel_fit.py checks locally.
"""

from __future__ import annotations

import dataclasses
import sys

import pandas as pd

from zerobench.artifacts.tables.in_process import ARTIFACTS
from zerobench.fitting.external import load, validate
from zerobench.perfmodel.constants import DEFAULT, FITTED, GEMM_EFF_MEASURED, Calibration
from zerobench.perfmodel.hardware import GiB

THROUGHPUT_KNOBS = ("gemm_eff_max", "tokens_half", "elementwise_traffic", "ib_efficiency", "nvlink_efficiency")
_BOUNDS = {
    "gemm_eff_max": (0.2, 0.9),
    "tokens_half": (100.0, 20000.0),
    "elementwise_traffic": (1.0, 20.0),
    "ib_efficiency": (0.3, 1.0),
    "nvlink_efficiency": (0.3, 1.0),
}


def _error(cal: Calibration, artifact: str, key: str) -> float:
    df = ARTIFACTS[artifact](cal)
    err = df.loc[df["key"] == key, "error_pct"].astype(float)
    return abs(float(err.iloc[0])) if len(err) and err.notna().all() else 1e3


def throughput_objective(cal: Calibration) -> float:
    """Mean |error| in % over the throughput knobs' fit points: what `fit` minimises."""
    points = FITTED[", ".join(THROUGHPUT_KNOBS)]
    return sum(_error(cal, *p) for p in points) / len(points)


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


# A GPU's fitted compute knobs; its gemm_eff_max is measured (constants.GEMM_EFF_MEASURED), not fitted.
HARDWARE_KNOBS = ("tokens_half", "elementwise_traffic")


def hardware_objective(cal: Calibration, hardware: str, sources: tuple[str, ...] = ()) -> float:
    """Mean |error| in % over the `fit` rows of `hardware` in the external runs (external.py),
    of `sources` only when given (leave-one-source-out)."""
    rows = load(("fit",))
    rows = rows[rows.hardware == hardware]
    if sources:
        rows = rows[rows.source.isin(sources)]
    return float(validate(cal, rows=rows).error_pct.abs().mean())


def fit_hardware(hardware: str, start: Calibration = DEFAULT, iters: int = 120, sources: tuple[str, ...] = ()) -> dict:
    """A GPU's own compute constants: gemm_eff_max as measured (MAMF microbenchmark), the
    HARDWARE_KNOBS fitted on its own `fit` rows only (never on another GPU's throughput), by
    Nelder–Mead on their mean |error| inside the same physical bounds, from the V100 values."""
    measured = dict(gemm_eff_max=GEMM_EFF_MEASURED[hardware])

    def objective(x):
        if any(not lo <= v <= hi for v, (lo, hi) in zip(x, (_BOUNDS[k] for k in HARDWARE_KNOBS), strict=False)):
            return 1e6
        per = {hardware: {**measured, **dict(zip(HARDWARE_KNOBS, x, strict=False))}}
        return hardware_objective(start.replace(per_hardware=per), hardware, sources)

    x0 = [getattr(start, k) for k in HARDWARE_KNOBS]
    x, _ = _nelder_mead(objective, x0, [0.1 * v for v in x0], iters)
    return {**measured, **dict(zip(HARDWARE_KNOBS, x, strict=False))}


def loso_rows(hardware: str = "a100-80gb", cal: Calibration = DEFAULT) -> pd.DataFrame:
    """Per source of `hardware`: its constants fitted on the other sources' fit rows only, then
    this source's validation rows judged, each with its error (one fit per source)."""
    df = load()  # fit and validation rows only: the holdout never enters a fit
    sources = sorted(df[df.hardware == hardware].source.unique())
    judged = []
    for held in sources:
        others = tuple(s for s in sources if s != held)
        fitted = cal.replace(per_hardware={**cal.per_hardware, hardware: fit_hardware(hardware, cal, sources=others)})
        rows = validate(fitted, rows=df[(df.hardware == hardware) & (df.source == held) & (df.split == "validation")])
        judged.append(rows.assign(held_out=held, fitted_on=", ".join(others)))
    return pd.concat(judged, ignore_index=True)


def leave_one_source_out(hardware: str = "a100-80gb", cal: Calibration = DEFAULT, rows=None) -> pd.DataFrame:
    """Per held-out source of `hardware` (loso_rows, or `rows` already judged): points, MAPE, worst."""
    rows = loso_rows(hardware, cal) if rows is None else rows
    by = rows.assign(abs_err=rows.error_pct.abs()).groupby(["held_out", "fitted_on"], sort=True)
    return pd.DataFrame({"points": by.size(), "mape_pct": by.abs_err.mean(), "max_pct": by.abs_err.max()}).reset_index()


def fit(start: Calibration = DEFAULT, iters: int = 200) -> Calibration:
    """Re-fit the fitted constants on FIT_SET: memory first (scans), then the throughput knobs
    (Nelder–Mead on the mean |error| of their points, inside physical bounds)."""
    cal = _scan(start, "reserve_bytes", [i * GiB / 20 for i in range(0, 61)], FITTED["reserve_bytes"])
    cal = _scan(cal, "fragmentation", [i / 200 for i in range(0, 61)], FITTED["fragmentation"])
    cal = _scan(cal, "cache_headroom", [i / 100 for i in range(0, 81)], FITTED["cache_headroom"])

    def objective(x):
        if any(not lo <= v <= hi for v, (lo, hi) in zip(x, (_BOUNDS[k] for k in THROUGHPUT_KNOBS), strict=False)):
            return 1e6
        return throughput_objective(cal.replace(**dict(zip(THROUGHPUT_KNOBS, x, strict=False))))

    x0 = [getattr(cal, k) for k in THROUGHPUT_KNOBS]
    x, _ = _nelder_mead(objective, x0, [0.1 * v or 0.5 for v in x0], iters)
    return cal.replace(**dict(zip(THROUGHPUT_KNOBS, x, strict=False)))


if __name__ == "__main__":
    if sys.argv[1:] == ["--loso"]:
        with pd.option_context("display.width", 200):
            print(leave_one_source_out().round(1).to_string(index=False))
        raise SystemExit(0)
    if len(sys.argv) > 1:  # python -m zerobench.fitting.fit a100-80gb h100-80gb
        for name in sys.argv[1:]:
            print(f"{name!r}: {fit_hardware(name)!r},")
        raise SystemExit(0)
    fitted = fit()
    for field in dataclasses.fields(fitted):
        print(f"{field.name} = {getattr(fitted, field.name)!r}")
