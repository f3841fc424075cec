"""Both readings of a row a choice was made on: the table's value with the choice, and the model's
without it (`ours_without_choice`, `error_without_choice_pct`), for every choice of the ledger the
model can undo (perfmodel/choices.py `without`: a trial field of the sheet, a Calibration field, or a
field of the trial's hardware profile). `moved` names the rows a reversal moves: the test of the ledger.
The claims ledger reads both and takes the worse verdict (artifacts/claims/claims.py). Modelled records
only: a measured or traced record is what ran, and no switch of the model moves it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pandas as pd

from zerobench.perfmodel.choices import CHOICES, named_rows, reversible
from zerobench.perfmodel.constants import DEFAULT, Calibration
from zerobench.perfmodel.hardware import get_profile
from zerobench.sweeps.groups import model_trial
from zerobench.trial.fields import FIELDS

Pairs = list[tuple[dict, dict]]


_CALIBRATION = {f.name for f in dataclasses.fields(Calibration)}


def _undone(pairs: Pairs, changes: dict) -> Pairs:
    """The pairs with the modelled records predicted again with `changes` applied: a trial field to the
    trial, a Calibration field to the constants, any other to the trial's hardware profile."""
    fields = {k: v for k, v in changes.items() if k in FIELDS}
    cal = DEFAULT.replace(**{k: v for k, v in changes.items() if k in _CALIBRATION and k not in FIELDS})
    profile = {k: v for k, v in changes.items() if k not in FIELDS and k not in _CALIBRATION}

    def trial(t: dict) -> dict:
        hw = {"hardware": dataclasses.replace(get_profile(t["hardware"]), **profile)} if profile else {}
        return {**t, **fields, **hw}

    return [(t, model_trial(trial(t), cal)) if r.get("source") == "modelled" else (t, r) for t, r in pairs]


def moved(builder: Callable[[Pairs], pd.DataFrame], pairs: Pairs, changes: dict) -> set[str]:
    """The keys of the judged or fitted rows whose `ours` the `changes` move (a number becoming none, or
    none a number, included)."""
    now, bare = builder(pairs).set_index("key"), builder(_undone(pairs, changes)).set_index("key")
    rows = now[now.role.isin(("judged", "fitted"))].index.intersection(bare.index)
    a, b = now.loc[rows, "ours"].astype(float), bare.loc[rows, "ours"].astype(float)
    return set(rows[~((a == b) | (a.isna() & b.isna()))])


def add(name: str, builder: Callable[[Pairs], pd.DataFrame], pairs: Pairs, table: pd.DataFrame) -> pd.DataFrame:
    """`table` with each row of reversible choices read again without all of them at once (columns
    empty elsewhere)."""
    choices = reversible(name)
    if not choices:
        return table
    table = table.assign(ours_without_choice=float("nan"), error_without_choice_pct=float("nan"))
    undo: dict[str, dict] = {}  # key -> the changes that undo every reversible choice it was made on or carries
    for c in CHOICES:
        for a, key in named_rows(c):
            if a == name and c.name in choices:
                undo.setdefault(key, {}).update(choices[c.name])
    undo_of = table.key.map(lambda k: tuple(sorted(undo.get(k, {}).items())))
    for changes in {tuple(sorted(v.items())) for v in undo.values()}:
        bare = builder(_undone(pairs, dict(changes))).set_index("key")
        for i in [i for i, u in undo_of.items() if u == changes]:
            key = table.at[i, "key"]
            table.at[i, "ours_without_choice"] = bare.at[key, "ours"]
            table.at[i, "error_without_choice_pct"] = bare.at[key, "error_pct"]
    return table
