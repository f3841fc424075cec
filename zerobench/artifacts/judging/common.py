"""Shared pieces of the artifact tables: paper look-ups, error rows, MAPE, a record's model states,
and the one rule of every verdict: the role each row plays, and that a verdict reads judged rows only.

Every artifact table has a `role` column (ROLES). A verdict, its counts and its mean and worst
error are computed over the `judged` rows alone (`judged`); rows of the other roles are shown and
counted apart (report.py), and cannot move a verdict. A row is `fitted` where the ledger of model
choices (perfmodel/choices.py, printed in docs/perfmodel.md) names it: a constant was fitted on it,
or a switch, profile or margin was chosen while looking at it."""

from __future__ import annotations

import hashlib
import json
import math

import pandas as pd

from zerobench.paper_reference import load_paper_reference
from zerobench.perfmodel.choices import fitted_rows

_REF = None


def paper(artifact: str, metric: str, column: str = "value", **where) -> float | None:
    """One number from paper_reference.csv, its `value` or another column's (None when absent or
    not numeric)."""
    global _REF
    if _REF is None:
        _REF = load_paper_reference()
    df = _REF[(_REF.artifact == artifact) & (_REF.metric == metric)]
    for col, val in where.items():
        text = df[col].astype(str)
        df = df[text.str.startswith(val)] if isinstance(val, str) else df[text == f"{val:g}"]
    vals = pd.to_numeric(df[column], errors="coerce").dropna()
    return float(vals.iloc[0]) if len(vals) else None


def error_pct(ours, ref) -> float | None:
    """100 (ours - ref) / ref, or None where either is missing (None or NaN) or ref is 0."""
    if ours is None or ref is None or not ref or any(isinstance(v, float) and math.isnan(v) for v in (ours, ref)):
        return None
    return 100.0 * (ours - ref) / ref


def state_bytes(record: dict) -> float | None:
    """A record's model states per rank (parameters + gradients + optimizer states, bytes), None
    where one of them is missing."""
    parts = [record.get(k) for k in ("param_bytes", "grad_bytes", "optimizer_bytes")]
    return None if any(p is None for p in parts) else float(sum(parts))


# What a row's error says, and so whether a verdict counts it. Only `judged` rows are counted.
ROLES = {
    "judged": "ours against an independent reference that nothing of ours was fitted on",
    "fitted": "a point a choice of the model was fitted or chosen on (the ledger of choices, perfmodel/choices.py: "
    "a fitted constant, a switch chosen on its score, a profile or margin set while it was in view), or a "
    "prediction that carries a term fitted on runs like it: its error shows the fit, not the model",
    "formula": "theory against theory: the paper's formula at our scale beside the paper's own number",
    "reference": "a run compared with itself (the reference every other row is compared with)",
    "derived": "a ratio or multiple of other rows of the table (named in `derived_from`)",
    "projection": "a modelled number with no reference to compare with: its band (`band_pct`) says how far to trust it",
}
# The band of a memory projection (largest model, cached memory): no held-out run measured memory in
# the paper's regimes, so none is validated (error_bands.py bands throughput only).
MEMORY_BAND = "unvalidated"
MEMORY_BAND_NOTE = "memory: no held-out published run measured memory in this regime"


def memory_band() -> dict:
    """The band columns of a memory projection, as a record carries them (judged_bands.add reads them
    into `band_pct`)."""
    return dict(error_band_pct=MEMORY_BAND, band_note=MEMORY_BAND_NOTE)


# What makes a record's number what it is: its model, layout, batch, hardware and switches. Two rows
# reading the same quantity of records that agree on all of them are one prediction (judged_bands.once).
INPUTS = ("source", "model", "layers", "hidden", "heads", "seq", "vocab", "hardware", "world_size", "dp", "mp",
          "stage", "precision", "micro_batch", "grad_accum", "checkpoint_activations", "partition_activations",
          "offload_activations", "contiguous_buffers", "bucket_bytes", "attention", "implementation")  # fmt: skip


def prediction(record: dict, quantity: str) -> str:
    """Which prediction a row reads: `quantity` of the record's INPUTS, named by model, GPUs, MP,
    stage, micro-batch and hardware, with a digest of every input."""
    digest = hashlib.sha1(json.dumps([record.get(k) for k in INPUTS], default=str).encode()).hexdigest()[:8]
    return (f"{quantity}: {record.get('model')} g{record.get('world_size')} mp{record.get('mp')} "
            f"z{record.get('stage')} b{record.get('micro_batch')} {record.get('hardware')} #{digest}")  # fmt: skip


JUDGED = "judged"


def role_of(artifact: str, key: str, role: str = JUDGED) -> str:
    """`fitted` for a row the ledger of choices names (choices.fitted_rows), else `role`."""
    return "fitted" if (artifact, key) in fitted_rows() else role


def row(artifact, key, ours, paper_value, source="modelled", role=JUDGED, **cols) -> dict:
    """One compared point; its role is `fitted` where the ledger of choices names (artifact, key), and
    `fitted_by` names those choices."""
    err = None if paper_value in (None, 0) or ours is None else 100.0 * (ours - paper_value) / paper_value
    by = "; ".join(fitted_rows().get((artifact, key), ()))
    return dict(artifact=artifact, key=key, ours=ours, paper=paper_value, error_pct=err, source=source,
                role=role_of(artifact, key, role), fitted_by=by, **cols)  # fmt: skip


def check_roles(df: pd.DataFrame, name: str = "table") -> None:
    """Refuse a table without a `role` column, or with a role outside ROLES, naming it."""
    if "role" not in df:
        raise ValueError(f"{name}: no `role` column (one of {sorted(ROLES)} per row)")
    bad = sorted(set(df["role"].dropna().astype(str)) - set(ROLES))
    if bad or df["role"].isna().any():
        raise ValueError(f"{name}: role must be one of {sorted(ROLES)}, got {bad or ['(empty)']}")


def compared(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that have an error (a number of ours beside a reference)."""
    return df[df["error_pct"].notna()] if "error_pct" in df else df.iloc[0:0]


def judged(df: pd.DataFrame, name: str = "table") -> pd.DataFrame:
    """The rows a verdict reads: compared rows whose role is `judged`."""
    check_roles(df, name)
    rows = compared(df)
    return rows[rows["role"] == JUDGED]


def mape(df: pd.DataFrame, judged_only: bool = False) -> tuple[float, float, int]:
    """(mean |error| %, max |error| %, points) over the rows that have an error; with
    `judged_only`, over the judged rows alone (`judged`): what a verdict reads."""
    rows = judged(df) if judged_only else compared(df)
    if rows.empty:
        return float("nan"), float("nan"), 0
    err = rows["error_pct"].astype(float).abs()
    return float(err.mean()), float(err.max()), int(len(err))
