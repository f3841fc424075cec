"""The paper's "largest that fits, up to the listed value" as a trial policy.

The paper ran each configuration at its listed micro-batch where that fitted, else at the largest
that did (AE Tables 1-6), and searched the largest model per configuration by depth (Fig 5, Fig 8,
Table 2). A sheet says so per trial: `micro_batch_policy: largest_fits` with `micro_batch: 16`, or
`layers_policy: largest_fits` with `layers: 1000` as the upper bound. The same loop serves the
engine (each attempt a measured trial: it tries, steps down on OOM) and the performance model
(each attempt a prediction); the record says what ran, what was listed and every attempt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from zerobench.trial import TrialSpec
from zerobench.trial.errors import InputError

SEARCHED = {"micro_batch_policy": "micro_batch", "layers_policy": "layers"}  # policy field -> the size it picks


def size(spec: TrialSpec, field: str) -> int:
    """The trial's micro-batch or depth."""
    return spec.train.micro_batch if field == "micro_batch" else spec.model.layers


def at_size(spec: TrialSpec, field: str, value: int) -> TrialSpec:
    """The same trial at another micro-batch or depth."""
    if field == "micro_batch":
        return dataclasses.replace(spec, train=dataclasses.replace(spec.train, micro_batch=value))
    return dataclasses.replace(spec, model=dataclasses.replace(spec.model, layers=value))


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


def searched(policies: Mapping) -> str | None:
    """The size a trial's policies (its field values) search, "micro_batch" or "layers", or None
    where every policy is `listed`: the trial runs once, at its listed sizes, and never enters
    `search`."""
    fields = [field for policy, field in SEARCHED.items() if policies.get(policy, "listed") == "largest_fits"]
    if len(fields) > 1:
        raise InputError("layers_policy: search the micro-batch or the depth, not both at once")
    return fields[0] if fields else None


def search(spec: TrialSpec, field: str, attempt: Callable[[TrialSpec], dict]) -> dict:
    """`attempt(spec)` at the largest `field` ("micro_batch" or "layers") that fits, up to the
    spec's; the record carries `listed_<field>`, `policy` and `attempts`, and where the listed size
    did not fit, `capped_by`: that attempt's error (what it needed, by term)."""
    upper = size(spec, field)
    at_listed = {}

    def attempt_at(value: int) -> dict:
        record = attempt(at_size(spec, field, value))
        at_listed.setdefault("error", record.get("error"))  # the first attempt is the listed size
        return record

    record, attempts = largest_that_fits(attempt_at, upper)
    capped = {"capped_by": at_listed["error"]} if attempts[0][1] == "oom" else {}
    return {**record, f"listed_{field}": upper, "policy": f"largest_fits {field}", "attempts": attempts, **capped}


def listed_flags(spec: TrialSpec, listed: TrialSpec) -> list[str]:
    """Flags that make a child process of the `listed` trial's command run exactly `spec`'s
    sizes, without a search of its own: every policy `listed`, and each size that differs."""
    flags = []
    for policy, field in SEARCHED.items():
        flags += ["--" + policy.replace("_", "-"), "listed"]
        if size(spec, field) != size(listed, field):
            flags += ["--" + field.replace("_", "-"), str(size(spec, field))]
    return flags
