"""The slow-spell rule, written once: how fast a host ran for a trial against a reference (two
lists of host-probe readings, runtime/probe.py takes them), and when that is a slow spell.
A shared host has slow spells of a minute or more; a run in one is set aside by the tables
(artifacts/judging/host_speed.py, artifacts/tables/superlinear.py) and run again by `zerobench run`
(`rerun_if_slow`). Torch-free.

A reading is one row [GEMM n, copy bytes, GEMM FLOP/s, bytes copied per s]; readings compare only
at the same sizes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

SLOW_SPELL = 0.15  # a host more than 15 % slower than its reference (host_speed < 0.85): a slow spell


def check(readings, where: str = "host_probe") -> list[list]:
    """The readings as rows, or ValueError naming the one that is not [n >= 1, bytes >= 1, FLOP/s > 0,
    bytes/s > 0]."""
    if not isinstance(readings, list | tuple):
        raise ValueError(f"{where}={readings!r}: must be a list of readings [gemm_n, copy_bytes, flop/s, bytes/s]")
    rows = []
    for i, row in enumerate(readings):
        ok = isinstance(row, list | tuple) and len(row) == 4
        ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in row)
        if not ok or min(row) <= 0 or row[0] != int(row[0]) or row[1] != int(row[1]):
            raise ValueError(f"{where}[{i}]={row!r}: must be [gemm_n >= 1, copy_bytes >= 1, flop/s > 0, bytes/s > 0]")
        rows.append(list(row))
    return rows


def host_speed(readings: Sequence | None, reference: Sequence | None) -> float | None:
    """How fast the host ran at `readings` against `reference` (both lists of readings): the
    geometric mean over GEMM and copy of (geometric mean of the rate over `readings`) / (the same
    over `reference`). Below 1: slower (0.8 = 20 % slower). None where either has no reading or
    their sizes differ (a reading compares only with one of the same work)."""
    if not readings or not reference:
        return None
    readings, reference = check(readings), check(reference, "reference")
    if {tuple(r[:2]) for r in readings} | {tuple(r[:2]) for r in reference} != {tuple(readings[0][:2])}:
        return None

    def geomean(values) -> float:
        return math.exp(statistics.fmean(math.log(v) for v in values))

    ratios = [geomean(r[k] for r in readings) / geomean(r[k] for r in reference) for k in (2, 3)]
    return geomean(ratios)


def slow_spell(speed: float | None) -> bool | None:
    """True where `speed` (host_speed) is more than SLOW_SPELL slower than its reference; None
    where it is unknown (no probe)."""
    return None if speed is None else speed < 1 - SLOW_SPELL


def rerun_if_slow(run: Callable[[object], dict], reference: Sequence, log=print) -> Callable[[object], dict]:
    """`run` (a trial spec -> its record) that, when the record's host probe says the trial ran in
    a slow spell against `reference` (a profile's readings), runs it once more and keeps the second
    record, with the first's speed and step time under `slow_spell_rerun`. A second slow run is
    kept as it is: the tables flag it (artifacts/judging/host_speed.py)."""

    def wrapped(spec) -> dict:
        record = run(spec)
        speed = host_speed(record.get("host_probe"), reference)
        if record.get("status") != "ok" or not slow_spell(speed):
            return record
        log(f"host speed {speed:.2f} of the reference's: a slow spell; running the trial once more")
        again = run(spec)
        again["slow_spell_rerun"] = {"first_host_speed": speed, "first_step_time_s": record.get("step_time_s")}
        return again

    return wrapped
