"""The traced source (`source: traced`, `zerobench trace`): one trial's record from the engine built
and stepped under FakeTensorMode on a fake process group (zerobench/runtime/trace.py): exact bytes
by category and exact collective bytes at any scale, nothing allocated."""

from __future__ import annotations

from collections.abc import Mapping

from zerobench.trial import TrialSpec, configs
from zerobench.trial.fields import defaults


def record(values: Mapping, out: str | None = None) -> dict:
    """The traced record of a trial's field values (parsed `zerobench trace` flags); `states_only`
    builds the engine and counts its model states, no step."""
    from zerobench.runtime.trace import trace_record  # imports torch: not for the command line's parse

    v = {**defaults("trace"), "command": "trace", **values}
    return trace_record(TrialSpec(*configs(v), out=out), v["states_only"])
