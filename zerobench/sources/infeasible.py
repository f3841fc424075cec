"""The record of a layout that cannot exist (status `infeasible`, the message naming the field and
the rule): a result row, not a crash, for a command whose configuration is refused."""

from __future__ import annotations

from collections.abc import Mapping

from zerobench.trial import new_record
from zerobench.trial.fields import COMMAND

SOURCE = {command: source for source, command in COMMAND.items()}  # `run` -> measured, ...


def record(command: str, values: Mapping, exc: ValueError) -> dict:
    """`command`'s record of the refused configuration `values` (parsed flags): the fields it was
    given that say which layout it was, and the error."""
    fields = {k: values.get(k) for k in ("model", "dp", "mp", "stage", "precision", "micro_batch")}
    return new_record(SOURCE[command], status="infeasible", error=str(exc), **fields)
