"""The host's speed beside measured rows: each run's probe (runtime/probe.py) against a reference
probe, the runs taken in a slow spell set aside, and the step time normalized by the probe
(docs/perfmodel.md, "Measured comparisons on a noisy host"). A record without a probe (taken before
trials read one) has no speed: its columns are missing, never filled in, and it is judged as it was.
No torch import."""

from __future__ import annotations

from statistics import median

import pandas as pd

from zerobench.artifacts.judging.common import JUDGED
from zerobench.slow_spells import SLOW_SPELL, host_speed, slow_spell


def run_speeds(runs: list[dict], reference) -> list[float | None]:
    """Each run's host speed against the `reference` readings (None: no probe on either side)."""
    return [host_speed(run.get("host_probe"), reference) for run in runs]


def timed_runs(runs: list[dict], reference) -> tuple[list[dict], dict]:
    """(the runs a trial's step is judged on, the row's host columns). A run in a slow spell (its
    host more than SLOW_SPELL slower than at `reference`) is set aside, the others kept; where every
    run was slow all are kept and the row is `slow_spell` (no verdict reads it: report.stats).
    Columns: `host_speed` (median over the runs with a probe), `host_speed_runs` (each run's, '-'
    without a probe), `runs_slow`, `slow_spell` (None where no run has a probe) and
    `expected_normalized`: the median over the kept runs of step seconds x host speed, what the
    step would have taken on the host as fast as at calibration (None unless every kept run has a
    probe)."""
    speeds = run_speeds(runs, reference)
    slow = [slow_spell(s) for s in speeds]
    known = [s for s in speeds if s is not None]
    every_slow = bool(known) and all(slow)
    kept = runs if every_slow else [r for r, s in zip(runs, slow, strict=True) if not s]
    kept_speeds = speeds if every_slow else [v for v, s in zip(speeds, slow, strict=True) if not s]
    normalized = None
    if all(v is not None for v in kept_speeds):
        normalized = median(r["step_time_s"] * v for r, v in zip(kept, kept_speeds, strict=True))
    return kept, dict(
        host_speed=median(known) if known else None,
        host_speed_runs=" ".join("-" if s is None else f"{s:.3g}" for s in speeds),
        runs_slow=sum(bool(s) for s in slow),
        slow_spell=every_slow if known else None,
        expected_normalized=normalized,
    )


def note(df: pd.DataFrame) -> str:
    """The host's measured variability in a sentence, from a table's `host_speed_runs` (the spread
    of the per-run speeds) and its judged rows wholly in a slow spell."""
    cells = df.get("host_speed_runs", pd.Series()).dropna()
    speeds = [float(v) for cell in cells for v in str(cell).split() if v != "-"]
    if not speeds:
        return (
            "Host speed: not known; these records, or the profile, carry no host probe (taken before the probe was "
            "recorded), so a slow spell cannot be told from the model's error."
        )
    slow_rows = int((df.role.eq(JUDGED) & df.slow_spell.eq(True)).sum()) if "slow_spell" in df else 0
    slow = sum(bool(slow_spell(s)) for s in speeds)
    return (
        f"Host speed against the calibration's probe over {len(speeds)} probed runs: median {median(speeds):.2f}, "
        f"range {min(speeds):.2f}-{max(speeds):.2f}; {slow} run(s) more than {SLOW_SPELL:.0%} slower set aside, "
        f"{slow_rows} judged row(s) with every run in a slow spell not counted."
    )
