"""Records -> one artifact's table (results/<artifact>.csv), by its entry in the registry.

Every table has the columns the report reads: `key`, `source` (measured / traced / modelled),
`status`, `ours`, `paper` (the paper's number where it has one for this point), `expected` (the
paper's formula evaluated at our scale, where there is one), `error_pct` (against `paper` where
present, else against `expected`) and `reference` (what the error is measured against). Paper
numbers are references only. Each table also carries its rows' bands
(judging/judged_bands.py) and, where a choice was made on a row, the row read without it
(judging/choice_readings.py). No torch import.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from zerobench.artifacts.judging import choice_readings, judged_bands
from zerobench.artifacts.tables.registry import entry
from zerobench.perfmodel.hardware import get_profile
from zerobench.record_files import read_record
from zerobench.sweeps import sheets


def record_paths(paths: list[str]) -> list[Path]:
    """Record files; a directory (a modelled group's) stands for the records in it, by name."""
    out = []
    for p in map(Path, paths):
        out += sorted(p.glob("*.json")) if p.is_dir() else [p]
    return out


def build(name: str, paths: list[str], sheet: str | None = None, profile: str | None = None) -> pd.DataFrame:
    """The table of artifact `name` from the record files (or modelled groups' directories) at
    `paths`, in the order of the trials of `sheet` (name or path), joined to them by file name
    (<trial id>.json) where the artifact needs its trials; `profile`: the calibrated profile."""
    artifact = entry(name)
    files = record_paths(paths)
    if not files:
        raise ValueError(f"table {name}: needs record files")
    if artifact.needs_profile and not profile:
        raise ValueError(f"table {name}: needs --profile (the calibrated profile it predicts from)")
    extra = (get_profile(str(profile)),) if artifact.needs_profile else ()
    if sheet is None:
        if artifact.joins_trials:
            raise ValueError(f"table {name}: needs --sheet (its trials say what each record was asked for)")
        return judged_bands.add(artifact.table([read_record(p) for p in files], *extra))
    trials = sheets.trials_by_id(sheets.load_sheet(sheet))
    unknown = [p.name for p in files if p.stem not in trials]
    if unknown:
        raise ValueError(f"table {name}: records of no trial in {sheet}: {unknown[:3]}")
    rank = {tid: i for i, tid in enumerate(trials)}
    files.sort(key=lambda p: rank[p.stem])  # the sheet's order
    if artifact.joins_trials:
        builder, pairs = artifact.table, [(trials[p.stem], read_record(p)) for p in files]
        table = choice_readings.add(name, lambda ps: builder(ps, *extra), pairs, builder(pairs, *extra))
        return judged_bands.add(table)
    return judged_bands.add(artifact.table([read_record(p) for p in files], *extra))
