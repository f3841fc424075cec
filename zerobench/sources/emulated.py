"""The emulated source (`source: emulated`, `zerobench emulate`): one trial's record from its field values: the
rank checked before anything runs (a bad rank, device or cluster writes nothing), run under its
batch/depth policy, each attempt's collectives priced on its cluster (perfmodel/replay.py).
Imports torch: the CLI imports it when the command runs."""

from __future__ import annotations

from collections.abc import Mapping

from zerobench.perfmodel.engine_memory import outside_allocator_bytes
from zerobench.perfmodel.hardware import get_profile
from zerobench.perfmodel.replay import cluster_of, complete
from zerobench.runtime.devices import hardware_profile
from zerobench.runtime.emulate import check, emulate
from zerobench.trial import TrialSpec, configs, mib, policy
from zerobench.trial.fields import defaults


def record(values: Mapping, out: str | None = None) -> dict:
    """The emulated record of a trial's field values (parsed `zerobench emulate` flags)."""
    v = {**defaults("emulate"), "command": "emulate", **values}
    cap = mib(v["mem_cap_mb"], "mem_cap_mb") if v["mem_cap_mb"] is not None else None
    spec = TrialSpec(*configs(v), out, data=v["data"], mem_cap_bytes=cap)
    device = check(spec, v["rank"])
    cluster = cluster_of(device.type, hardware_profile(device), v["cluster"])
    get_profile(cluster)  # an unknown profile fails here, before the run
    # a GPU rank's allocator gets its budget less what its card holds outside it (the CUDA context,
    # NCCL's communicators); on a host the counted tensor peak is held against the budget itself
    reserved = outside_allocator_bytes(spec.parallel.dp, spec.parallel.mp) if device.type == "cuda" else 0

    def attempt(s: TrialSpec) -> dict:
        return complete(emulate(s, v["rank"], reserved), cluster)

    field = policy.searched(v)
    return attempt(spec) if field is None else policy.search(spec, field, attempt)
