"""Records on disk: one JSON object each, whose columns are zerobench/trial/record.py's `TrialRecord`.
This module imports no torch, so the workflow's aggregate and report steps stay light.
"""

from __future__ import annotations

import json
import os
import tempfile
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
