"""The trial flags of `zerobench run`, `trace`, `model`, `estimate` and `peers`, made from the
trial fields (zerobench/engine/fields.py); argparse only."""

from __future__ import annotations

import argparse

from zerobench.engine.fields import FIELDS, takes

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
    """The flags of every trial field `command` takes (zerobench/engine/fields.py), in sections."""
    groups = {}
    for f in FIELDS.values():
        if not takes(command, f.name):
            continue
        g = groups.get(f.group) or groups.setdefault(f.group, p.add_argument_group(GROUPS[f.group]))
        if f.kind is bool:
            g.add_argument(f.option, action="store_true", help=f.help)
        else:
            g.add_argument(f.option, type=f.kind, default=f.default, choices=f.choices, help=f.help)
