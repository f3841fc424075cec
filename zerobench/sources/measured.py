"""The measured source (`source: measured`, `zerobench run`): one trial's record from real steps of
the engine on its dp x mp ranks (zerobench/runtime/launch.py), under its batch/depth policy; with a
time limit, each attempt runs in a child process killed past it (status `timeout`), and with a
calibrated profile, a trial the host probe says ran in a slow spell runs once more
(zerobench/slow_spells.py). No torch import: a time-limited parent never loads it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping

from zerobench import slow_spells
from zerobench.perfmodel import profile_file
from zerobench.record_files import read_record, write_record
from zerobench.runtime.procs import process_tree
from zerobench.trial import TrialSpec, configs, mib, policy
from zerobench.trial.errors import InputError


def spec(values: Mapping) -> TrialSpec:
    """The trial a `zerobench run`'s parsed flags describe, at its listed sizes."""
    cap = mib(values["mem_cap_mb"], "mem_cap_mb") if values["mem_cap_mb"] is not None else None
    return TrialSpec(
        *configs(values),
        values["out"],
        values["timeout"],
        data=values["data"],
        mem_cap_bytes=cap,
        resume=values["resume"],
        save=values["save"],
    )


def record(values: Mapping, argv: list[str]) -> dict:
    """The measured record of a `zerobench run`'s parsed flags `values` (`argv`: the flags as given,
    for a time-limited attempt's child); written to `values["out"]` by the ranks, and again here
    where the record carries the search's trail or the rerun's."""
    listed = spec(values)

    def run(attempt: TrialSpec) -> dict:
        return _run_once(values, argv, attempt, listed)

    if values["probe_reference"]:
        run = slow_spells.rerun_if_slow(run, profile_file.load(values["probe_reference"]).host_probe)
    field = policy.searched(values)
    out = run(listed) if field is None else policy.search(listed, field, run)
    if values["out"] and ("policy" in out or "slow_spell_rerun" in out):  # with the search's trail, or the rerun's
        write_record(out, values["out"])
    return out


def _run_once(values: Mapping, argv: list[str], attempt: TrialSpec, listed: TrialSpec) -> dict:
    if values["time_limit"]:
        return _run_with_time_limit(values, argv, attempt, listed)
    from zerobench.runtime.launch import run_trial  # imports torch: not for a time-limited parent

    return run_trial(attempt)


def _run_with_time_limit(values: Mapping, argv: list[str], attempt: TrialSpec, listed: TrialSpec) -> dict:
    """This same command at `attempt`'s sizes in a child process; past `values["time_limit"]`
    seconds it is killed with the launcher and every rank, and the record says `timeout`."""
    limit, out = values["time_limit"], values["out"]
    if not out:
        raise InputError("time_limit: needs --out (the record is written there)")
    # this attempt's sizes, no search and no rerun of its own
    child_argv = [*argv, *policy.listed_flags(attempt, listed), "--time-limit", "0", "--probe-reference", ""]
    child = subprocess.Popen([sys.executable, "-m", "zerobench.cli", *child_argv])
    try:
        child.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        for pid in process_tree(child.pid):  # the launcher starts each rank in a session of its own
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        child.wait()
        error = f"over the time limit of {limit:g} s"
        write_record(attempt.record("measured", status="timeout", error=error), out)
    if not os.path.exists(out):
        error = f"exit code {child.returncode}"
        write_record(attempt.record("measured", status="error", error=error), out)
    return read_record(out)
