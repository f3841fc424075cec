"""The trial flags of `zerobench run`, `trace`, `model`, `estimate` and `peers`, made from the
trial fields (zerobench/trial/fields.py), and those fields' flags for a command of its own
(`plan`); argparse only."""

from __future__ import annotations

import argparse

from zerobench.trial.fields import FIELDS, takes

GROUPS = {
    "model": "model",
    "parallel": "parallel layout and ZeRO",
    "train": "training",
    "hardware": "the performance model",
    "search": "what runs where the listed size does not fit",
    "run": "this run",
    "trace": "the trace",
    "emulate": "one rank of the world, emulated",
}


def trial_args(p: argparse.ArgumentParser, command: str) -> None:
    """The flags of every trial field `command` takes (zerobench/trial/fields.py), in sections."""
    groups = {}
    for f in FIELDS.values():
        if not takes(command, f.name):
            continue
        g = groups.get(f.group) or groups.setdefault(f.group, p.add_argument_group(GROUPS[f.group]))
        _add(g, f)


def field_args(p: argparse.ArgumentParser | argparse._ArgumentGroup, names: tuple[str, ...], **required) -> None:
    """The flags of the trial fields `names` as `trial_args` makes them, for a command that is no
    trial (`plan`); `required`: name -> True for a flag that must be given (no default)."""
    for name in names:
        _add(p, FIELDS[name], required.get(name, False))


def _add(g, f, required: bool = False) -> None:
    if f.kind is bool:
        g.add_argument(f.option, action="store_true", help=f.help)
    elif required:
        g.add_argument(f.option, type=f.kind, required=True, choices=f.choices, help=f.help)
    else:
        g.add_argument(f.option, type=f.kind, default=f.default, choices=f.choices, help=f.help)
