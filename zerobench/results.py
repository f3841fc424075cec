"""Records on disk (one JSON object each; the columns are zerobench/trial/record.py's `TrialRecord`) and
the paper's reference numbers. This module imports no torch, so the workflow's aggregate and
report steps stay light.
"""

from __future__ import annotations

import json
import os
import tempfile
from importlib import resources
from pathlib import Path


def write_record(record: dict, path: str | os.PathLike) -> None:
    """Write atomically: a reader (or a resumed sweep) never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1, sort_keys=False, default=str)
        f.write("\n")
    os.replace(tmp, path)


def read_record(path: str | os.PathLike) -> dict:
    with open(path) as f:
        return json.load(f)


def paper_reference_path() -> Path:
    return Path(str(resources.files("zerobench") / "data" / "paper_reference.csv"))


def load_paper_reference():
    """The paper's numbers (paper.md §11) as a DataFrame: for overlays and error columns only."""
    import pandas as pd

    return pd.read_csv(paper_reference_path())
