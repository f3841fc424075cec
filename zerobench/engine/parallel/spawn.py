"""A gloo world of `n` spawned processes on this machine, for the peers comparison and the tests:
a file rendezvous (no ports to collide on), one thread per rank, and each rank's return value
brought back to the caller.

A rank that has written its result and then dies at exit is not a failed run: gloo's threads can
still abort a process in teardown ("terminate called without an active exception", SIGABRT) though
the ranks leave together (topology.leave_together); docs/engine-measurements.md says how often.
When every rank's result is on disk, they are returned and the exit is reported on stderr;
otherwise the failure is raised as torch gives it."""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist

from zerobench.engine.parallel.topology import leave_together

_GRACE_S = 5.0  # seconds the other ranks get to leave after one has failed


def _rank_main(rank: int, n: int, tmp: str, timeout_s: float | None, fn, args) -> None:
    torch.set_num_threads(1)  # one rank per core
    timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rdzv", rank=rank, world_size=n, timeout=timeout)
    try:
        result = fn(rank, *args)
        path = _result_path(tmp, rank)
        with open(f"{path}.part", "wb") as f:  # renamed once whole: a rank killed while writing leaves none
            pickle.dump(result, f)
        os.replace(f"{path}.part", path)
        leave_together()
    finally:
        if dist.is_initialized():  # a failed rank leaves alone
            dist.destroy_process_group()


def spawned(n: int, fn, *args, timeout_s: float | None = None) -> list:
    """`fn(rank, *args)` on every rank of a new n-process gloo world (`fn` must be importable);
    the list of their return values. `timeout_s` bounds each collective (torch's default if None)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        procs = mp.start_processes(_rank_main, args=(n, tmp, timeout_s, fn, args), nprocs=n, join=False)
        try:
            # when one rank fails, the others get the grace period to finish their own exit
            while not procs.join(grace_period=_GRACE_S):
                pass
        except mp.ProcessExitedException as exc:
            if not all(os.path.exists(_result_path(tmp, r)) for r in range(n)):
                raise
            print(f"spawned: every rank returned its result, then {exc} at exit; results kept", file=sys.stderr)
        out = []
        for r in range(n):
            with open(_result_path(tmp, r), "rb") as f:
                out.append(pickle.load(f))
        return out


def _result_path(tmp: str, rank: int) -> str:
    return os.path.join(tmp, f"out{rank}.pkl")
