"""The `capacity` artifact: the largest model per ZeRO-DP stage under a per-rank memory budget, the
CPU analog of Table 2 and Fig 8 (paper §9.2), measured beside the calibrated performance model's
prediction and the bare model-state formula (Table 2's theory columns). No torch import.

A sheet sweeps depth at a fixed width per stage (workflows/config/sheets/capacity.yaml). The
measured largest is where the budget is crossed between the deepest trial that trained and the
shallowest deeper one that ran over, read off the line through their measured peak RSS growth:
memory and parameters both grow linearly with depth, so the crossing is a size in parameters, not
a whole number of layers. The model's largest is read the same way from its own predictions
(artifacts/tables/vs_measured.py), so the two compare at the same resolution.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from zerobench.artifacts.judging.common import error_pct, memory_band, state_bytes
from zerobench.artifacts.tables import vs_measured as vs
from zerobench.memory import BYTES_PER_PARAM, total_model_state_bytes
from zerobench.perfmodel.hardware import HardwareProfile
from zerobench.stages import STAGE_LABELS
from zerobench.trial.fields import MiB


def measured_largest(trials: pd.DataFrame, cap: float) -> tuple[float | None, str]:
    """(parameters where the measured peak RSS growth crosses `cap`, status) of one stage's trials:
    status `oom` when not even the shallowest trained, `unbracketed` when no deeper trial ran over
    with its memory measured (one stopped before training on its model states alone has none)."""
    ok = trials[trials.status == "ok"]
    if ok.empty:
        return None, "oom"
    deepest = ok.loc[ok.layers.idxmax()]
    over = trials[(trials.status == "oom") & (trials.layers > deepest.layers) & trials.rss_growth_bytes.notna()]
    if over.empty:
        return None, "unbracketed"
    first = over.loc[over.layers.idxmin()]
    peaks, params = [deepest.rss_growth_bytes, first.rss_growth_bytes], [deepest.num_params, first.num_params]
    return float(np.interp(cap, peaks, params)), "ok"


def capacity(records: list[dict], hw: HardwareProfile | None = None, calibrated: tuple | None = None) -> pd.DataFrame:
    """Per stage the largest model (kind `largest`, millions of parameters): the calibrated model's
    (`ours`) against the measured crossing (`expected`), the formula's beside; then one row per
    trial (kind `trial`): the model's peak memory against the measured peak RSS growth (MiB).
    `calibrated`: (peak bytes of a record, largest parameters under its budget), by default the
    performance model on `hw`, this machine's calibrated profile; neither: measured only. Each
    prediction is also given without the profile's fitted terms (vs_measured.FITTED_TERMS: the
    runtime's bytes), `ours_without_fitted`, where the model is `hw`'s; a row they change has role
    `fitted`."""

    def on(profile):
        return (lambda r: vs.predicted_peak_bytes(r, profile), lambda r: vs.largest_under_budget(r, profile))

    model = calibrated or hw and on(hw)
    bare = hw and not calibrated and on(vs.without_fitted(hw))
    rows = []
    for r in records:
        measured = r.get("rss_growth_bytes")
        # no prediction without a profile, nor for a record without the model's shape (a failed one may lack it)
        predicted = model[0](r) / MiB if model and "hidden" in r else None
        unfitted = bare[0](r) / MiB if bare and "hidden" in r else None
        rows.append(dict(
            key=f"{STAGE_LABELS[r['stage']]} L={r['layers']}: peak memory (MiB)", kind="trial",
            source="modelled vs measured" if predicted is not None else r["source"], status=r["status"],
            error=r.get("error"), stage=r["stage"], dp=r["dp"], layers=r["layers"], num_params=r["num_params"],
            mem_cap_bytes=r.get("mem_cap_bytes"), model_state_bytes=state_bytes(r), rss_growth_bytes=measured,
            allocator=r.get("allocator"), ours=predicted, expected=measured / MiB if measured else None,
            error_pct=error_pct(predicted, measured / MiB if measured else None), ours_without_fitted=unfitted,
            error_without_fitted_pct=error_pct(unfitted, measured / MiB if measured else None),
        ))  # fmt: skip
    trials = pd.DataFrame(rows)
    summary = []
    for stage, sub in trials.groupby("stage"):
        record = next(r for r in records if r["stage"] == stage)
        cap = float(record["mem_cap_bytes"])
        bytes_per_param = total_model_state_bytes(
            1.0, int(stage), int(record["dp"]), 1, BYTES_PER_PARAM[record["precision"]]
        )
        largest, status = measured_largest(sub, cap)
        predicted = model[1](record) / 1e6 if model and "hidden" in record else None
        unfitted = bare[1](record) / 1e6 if bare and "hidden" in record else None
        summary.append(dict(
            key=f"{STAGE_LABELS[stage]}: largest model (M parameters)", kind="largest",
            source="modelled vs measured", status=status, stage=stage, dp=record["dp"], mem_cap_bytes=cap,
            num_params=sub[sub.status == "ok"].num_params.max(), measured_params=largest, ours=predicted,
            expected=largest / 1e6 if largest else None, formula=cap / bytes_per_param / 1e6,
            error_pct=error_pct(predicted, largest / 1e6 if largest else None), ours_without_fitted=unfitted,
            error_without_fitted_pct=error_pct(unfitted, largest / 1e6 if largest else None),
            reference="measured: the budget crossed between the deepest trial that trained and the next",
        ))  # fmt: skip
    df = pd.concat([pd.DataFrame(summary), trials], ignore_index=True)
    df["paper"] = None  # the paper's sizes are at N_d = 64 and 32 GB: the sheet's text, not a point here
    # the calibrated model against measured memory: judged, unless a fitted term moved the prediction
    fitted = df.ours_without_fitted.notna() & (df.ours_without_fitted != df.ours)
    df["role"] = fitted.map({True: "fitted", False: "judged"})
    df["fitted_terms"] = fitted.map({True: " ".join(vs.MEMORY_TERMS), False: ""})
    df = df.assign(**memory_band())  # a memory projection's band
    return df
