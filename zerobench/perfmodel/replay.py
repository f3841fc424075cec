"""The collectives of an emulated rank (`source: emulated`, runtime/emulate.py), priced and
placed: each call the engine issued in a timed step is priced by the model's collective pricing
(network.py: NCCL's tuning model on a datasheet GPU profile, the measured curves on a calibrated
host) over the group it ran on, laid out as a rank of that world sits (MP innermost), and placed
where the engine issued it. The step time is the measured compute plus every second a wait found
its call unfinished: a call starts when the engine issues it, or when the previous call on the
same group is done (one communicator runs its calls in order; DP and MP run side by side), and a
wait that comes before it ends stalls the rank until it does. So an asynchronous gradient
reduction hides behind the backward it was issued in, as far as that backward lasts, and a
synchronous MP all-reduce adds its whole time. Not modelled: collectives slowing the compute they
overlap (NCCL's kernels share the GPU's SMs and memory), and ranks waiting for each other.
"""

from __future__ import annotations

import statistics

from zerobench.gpus import mfu
from zerobench.perfmodel.constants import DEFAULT, Calibration
from zerobench.perfmodel.hardware import HardwareProfile, get_profile
from zerobench.perfmodel.network import ring
from zerobench.trial.errors import InputError

DEFAULT_HOST = "calibrated-cpu"  # a CPU rank's collectives: this machine's calibrated profile


def cluster_of(device: str, gpu_profile: str | None, cluster: str | None = None) -> str:
    """The profile that prices the collectives: the one named, else the device's own (its GPU's
    profile; a CPU rank's the calibrated host)."""
    if cluster:
        return cluster
    if device == "cuda":
        if not gpu_profile:
            raise InputError("cluster: this GPU has no profile of its own (zerobench/gpus.py); name one")
        return gpu_profile
    return DEFAULT_HOST


def pricer(hw: HardwareProfile, dp: int, mp: int, cal: Calibration = DEFAULT):
    """price(op, group, bytes) -> seconds of one call on `hw`: the DP group strided by mp across
    the world, the MP group consecutive ranks (engine/parallel/topology.py)."""
    groups = {"dp": ring(dp, mp, hw, cal), "mp": ring(mp, 1, hw, cal), "world": ring(dp * mp, 1, hw, cal)}

    def price(op: str, group: str, nbytes: float) -> float:
        # a broadcast moves the message once to every rank, as an all-gather's (n-1)/n does
        return getattr(groups[group], "all_gather" if op == "broadcast" else op)(nbytes)

    return price


def stall_s(calls: list[dict], price) -> tuple[float, dict[str, float]]:
    """(seconds the rank stalls at its waits, every call's priced seconds by op/group) for one
    step's `calls` (see the module's docstring)."""
    events = sorted(
        [(c["issue_s"], 0, i) for i, c in enumerate(calls)] + [(c["wait_s"], 1, i) for i, c in enumerate(calls)]
    )
    shift, free, end, priced = 0.0, {}, {}, {}
    for t, kind, i in events:
        c = calls[i]
        if kind == 0:  # issued: starts once its group is free
            seconds = price(c["op"], c["group"], c["bytes"])
            key = f"{c['op']}/{c['group']}"
            priced[key] = priced.get(key, 0.0) + seconds
            start = max(t + shift, free.get(c["group"], 0.0))
            end[i] = free[c["group"]] = start + seconds
        elif end[i] > t + shift:  # waited for before it is done
            shift += end[i] - (t + shift)
    return shift, priced


def complete(record: dict, cluster: str, cal: Calibration = DEFAULT) -> dict:
    """The emulated record with its collectives priced on the profile `cluster` (`cluster_of`) and
    its step time: per timed step, measured compute + stalls (their median); throughput, TFLOPS
    and MFU from that."""
    if record["status"] != "ok":
        return {**record, "cluster": cluster}
    hw = get_profile(cluster)
    price = pricer(hw, record["dp"], record["mp"], cal)
    kept = {k: v for k, v in record.items() if k != "step_calls"}  # the timeline is priced, not kept
    stalls = [stall_s(calls, price) for calls in record["step_calls"]]
    steps = [c + s for c, (s, _) in zip(record["compute_times_s"], stalls, strict=True)]
    step = statistics.median(steps)
    first = stalls[0][1] if stalls else {}
    comm = {k: {**v, "modelled_seconds_per_step": first.get(k)} for k, v in (record.get("comm") or {}).items()}
    tokens = record["global_batch"] * record["seq"]
    tflops = record["flops_per_gpu_per_step"] / step / 1e12
    return {
        **kept,
        "comm": comm,
        "cluster": cluster,
        "step_time_s": step,
        "step_time_min_s": min(steps),
        "step_time_max_s": max(steps),
        "samples_per_s": record["global_batch"] / step,
        "tokens_per_s": tokens / step,
        "tflops_per_gpu": tflops,
        "mfu": mfu(tflops, record.get("hardware")),
        "collective_stall_s": statistics.median(s for s, _ in stalls),  # exposed: what the rank waited
        "collective_s": statistics.median(sum(p.values()) for _, p in stalls),  # every call's, hidden or not
        "step_calls_count": len(record["step_calls"][0]) if record["step_calls"] else 0,
    }
