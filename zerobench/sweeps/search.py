"""The paper's "largest that fits, up to the listed value" as a trial policy (issue 15).

The paper ran each configuration at its listed micro-batch where that fitted, else at the largest
that did (AE Tables 1-6), and searched the largest model per configuration by depth (Fig 5, Fig 8,
Table 2). A sheet says so per trial: `micro_batch_policy: largest_fits` with `micro_batch: 16`, or
`layers_policy: largest_fits` with `layers: 1000` as the upper bound. The same loop serves the
engine (each attempt a measured trial: it tries, steps down on OOM) and the performance model
(each attempt a prediction); the record says what ran, what was listed and every attempt.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable

from zerobench.config import ConfigError, preset

POLICIES = ("listed", "largest_fits")
SEARCHED = {"micro_batch_policy": "micro_batch", "layers_policy": "layers"}


def policy_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what runs where the listed size does not fit")
    for policy, field in SEARCHED.items():
        g.add_argument(
            "--" + policy.replace("_", "-"), choices=POLICIES, default="listed",
            help=f"largest_fits: the largest {field} that fits, up to the listed one (bisection on OOM)",
        )  # fmt: skip


def largest_that_fits(attempt: Callable[[int], dict], upper: int) -> tuple[dict, list[list]]:
    """The record at `upper` unless it is out of memory; else the largest value in [1, upper)
    whose record is not, by bisection (memory grows with batch and depth); where none fits, the
    record at 1 (status oom). A status other than ok or oom ends the search with that record.
    Returns the record and the attempts as [value, status] pairs."""
    attempts = []

    def run(value: int) -> dict:
        record = attempt(value)
        attempts.append([value, record["status"]])
        return record

    best = run(upper)
    if best["status"] != "oom":
        return best, attempts
    lo, hi = 0, upper - 1  # lo: the largest value known to fit (0: none yet)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        record = run(mid)
        if record["status"] == "oom":
            hi = mid - 1
            if mid == 1:
                best = record
        elif record["status"] == "ok":
            lo, best = mid, record
        else:
            return record, attempts
    return best, attempts


def searched(args: argparse.Namespace, attempt: Callable[[argparse.Namespace], dict]) -> dict:
    """`attempt(args)` under the policies in `args`: once as listed, or searched; the record
    carries `listed_<field>`, `policy` and `attempts` where a search ran."""
    fields = [field for policy, field in SEARCHED.items() if getattr(args, policy, "listed") == "largest_fits"]
    if not fields:
        return attempt(args)
    if len(fields) > 1:
        raise ConfigError("layers_policy: search the micro-batch or the depth, not both at once")
    field = fields[0]
    upper = getattr(args, field) or getattr(preset(args.model), field)
    if not isinstance(upper, int) or upper < 1:
        raise ConfigError(f"{field}={upper!r}: the listed upper bound must be an integer >= 1")

    def at(value: int) -> dict:
        trial = copy.copy(args)
        setattr(trial, field, value)
        return attempt(trial)

    record, attempts = largest_that_fits(at, upper)
    return {**record, f"listed_{field}": upper, "policy": f"largest_fits {field}", "attempts": attempts}


def pinned(args: argparse.Namespace) -> list[str]:
    """Flags that make a child process run exactly `args`' sizes, without a search of its own."""
    flags = []
    for policy, field in SEARCHED.items():
        flags += ["--" + policy.replace("_", "-"), "listed"]
        if getattr(args, field) is not None:
            flags += ["--" + field.replace("_", "-"), str(getattr(args, field))]
    return flags
