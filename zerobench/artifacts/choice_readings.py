"""Both readings of a row a choice was made on: the table's value with the choice, and the model's
without it (`ours_without_choice`, `error_without_choice_pct`), for every choice of the ledger the
model can undo (perfmodel/choices.py `without`: a trial field of the sheet, or a Calibration field).
The claims ledger reads both and takes the worse verdict (artifacts/claims.py). Modelled records
only: a measured or traced record is what ran, and no switch of the model moves it."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from zerobench.engine.fields import FIELDS
from zerobench.perfmodel.choices import CHOICES, reversible
from zerobench.perfmodel.constants import DEFAULT
from zerobench.sweeps.groups import model_trial

Pairs = list[tuple[dict, dict]]


def _undone(pairs: Pairs, changes: dict) -> Pairs:
    """The pairs with the modelled records predicted again with `changes` applied."""
    fields = {k: v for k, v in changes.items() if k in FIELDS}
    cal = DEFAULT.replace(**{k: v for k, v in changes.items() if k not in FIELDS})
    return [(t, model_trial({**t, **fields}, cal)) if r.get("source") == "modelled" else (t, r) for t, r in pairs]


def add(name: str, builder: Callable[[Pairs], pd.DataFrame], pairs: Pairs, table: pd.DataFrame) -> pd.DataFrame:
    """`table` with each reversible choice's rows read again without it (columns empty elsewhere)."""
    choices = reversible(name)
    if not choices:
        return table
    table = table.assign(ours_without_choice=float("nan"), error_without_choice_pct=float("nan"))
    rows_of = {c.name: {k for a, k in c.rows if a == name} for c in CHOICES}
    for choice, changes in choices.items():
        bare = builder(_undone(pairs, changes)).set_index("key")
        for i in table.index[table.key.isin(rows_of[choice])]:
            key = table.at[i, "key"]
            table.at[i, "ours_without_choice"] = bare.at[key, "ours"]
            table.at[i, "error_without_choice_pct"] = bare.at[key, "error_pct"]
    return table
