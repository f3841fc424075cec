"""Shared pieces of the artifact builders: paper look-ups, error rows, throughput runs."""

from __future__ import annotations

import pandas as pd

from zerobench.config import TrainConfig
from zerobench.perfmodel import paper_setups as ps
from zerobench.perfmodel.calibration import DEFAULT, FIT_SET
from zerobench.perfmodel.predict import predict
from zerobench.results import load_paper_reference

PREC = ps.PAPER_PRECISION
_REF = None


def paper(artifact: str, metric: str, **where) -> float | None:
    """One number from paper_reference.csv (None when absent or not numeric)."""
    global _REF
    if _REF is None:
        _REF = load_paper_reference()
    df = _REF[(_REF.artifact == artifact) & (_REF.metric == metric)]
    for col, val in where.items():
        text = df[col].astype(str)
        df = df[text.str.startswith(val)] if isinstance(val, str) else df[text == f"{val:g}"]
    vals = pd.to_numeric(df["value"], errors="coerce").dropna()
    return float(vals.iloc[0]) if len(vals) else None


def row(artifact, key, ours, paper_value, source="modelled", **cols) -> dict:
    err = None if paper_value in (None, 0) or ours is None else 100.0 * (ours - paper_value) / paper_value
    return dict(artifact=artifact, key=key, ours=ours, paper=paper_value, error_pct=err, source=source,
                fit=(artifact, key) in FIT_SET, **cols)  # fmt: skip


def throughput(model, parallel, batch, hw="v100-32gb-dgx2", cal=DEFAULT, gpn=None, attention="materialized") -> dict:
    pred = predict(model, parallel, PREC, TrainConfig(micro_batch=max(batch, 1)), hw, gpn, cal, attention)
    out = dict(micro_batch=batch, max_micro_batch=pred.max_micro_batch, status="ok" if pred.fits else "oom")
    if pred.fits and batch >= 1:
        out.update(tflops=pred.tflops_per_gpu, step_s=pred.step_time_s, compute_s=pred.compute_s,
                   mp_comm_s=pred.mp_comm_s + pred.host_copy_s, dp_comm_s=pred.dp_comm_s,
                   optimizer_s=pred.optimizer_s, gemm_eff=pred.efficiency, mfu=pred.mfu)  # fmt: skip
    return out


def max_batch(model, parallel, hw="v100-32gb-dgx2", cal=DEFAULT, gpn=None, attention="materialized") -> int:
    """The largest micro-batch that fits (0: not even one sequence)."""
    return predict(model, parallel, PREC, TrainConfig(micro_batch=1), hw, gpn, cal, attention).max_micro_batch


def capped(model, parallel, batch, hw="v100-32gb-dgx2", cal=DEFAULT, gpn=None, attention="materialized") -> dict:
    """`throughput` at the listed `batch`, capped at the largest that fits; where not even one
    sequence fits, the run at batch 1 (status oom)."""
    b = max(1, min(batch, max_batch(model, parallel, hw, cal, gpn, attention)))
    return throughput(model, parallel, b, hw, cal, gpn, attention)


def zero_best(model, gpus, mp, batch, cal, hw="v100-32gb-dgx2", gpn=None, attention="materialized") -> dict:
    """ZeRO-100B (C4) at `batch`, capped at the largest that fits, or C5 (P_a+cpu) where that is
    faster (it fits a larger batch): the paper switches P_a+cpu on only when beneficial (§10.4)."""
    best = None
    for config in ("C4", "C5"):
        par = ps.zero_parallel(gpus, mp, config)
        b = min(batch, max_batch(model, par, hw, cal, gpn, attention))
        if b >= 1:
            run = dict(config=config, **throughput(model, par, b, hw, cal, gpn, attention))
            if best is None or run["tflops"] > best["tflops"]:
                best = run
    return best or dict(config="C5", micro_batch=batch, max_micro_batch=0, status="oom")


def mape(df: pd.DataFrame, judged_only: bool = False) -> tuple[float, float, int]:
    """(mean |error| %, max |error| %, points) over the rows that have an error."""
    rows = df[df["error_pct"].notna()]
    if judged_only and "fit" in rows:
        rows = rows[~rows["fit"].astype(bool)]
    if rows.empty:
        return float("nan"), float("nan"), 0
    err = rows["error_pct"].astype(float).abs()
    return float(err.mean()), float(err.max()), int(len(err))
