"""The paper's numbers (paper.md §11, zerobench/data/paper_reference.csv): references for overlays
and error columns only, never an output. pandas is imported when the table is read, so a trial
that only writes its record never loads it."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def paper_reference_path() -> Path:
    return Path(str(resources.files("zerobench") / "data" / "paper_reference.csv"))


def load_paper_reference():
    """The paper's numbers (paper.md §11) as a DataFrame: for overlays and error columns only."""
    import pandas as pd

    return pd.read_csv(paper_reference_path())
