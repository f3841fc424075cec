"""A gloo world of `n` spawned processes on this machine, for the peers comparison and the tests:
a file rendezvous (no ports to collide on), one thread per rank, and each rank's return value
brought back to the caller."""

from __future__ import annotations

import os
import pickle
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist

from zerobench.parallel.topology import leave_together


def _rank_main(rank: int, n: int, tmp: str, timeout_s: float | None, fn, args) -> None:
    torch.set_num_threads(1)  # one rank per core
    timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rdzv", rank=rank, world_size=n, timeout=timeout)
    try:
        result = fn(rank, *args)
        with open(os.path.join(tmp, f"out{rank}.pkl"), "wb") as f:
            pickle.dump(result, f)
        leave_together()
    finally:
        if dist.is_initialized():  # a failed rank leaves alone
            dist.destroy_process_group()


def spawned(n: int, fn, *args, timeout_s: float | None = None) -> list:
    """`fn(rank, *args)` on every rank of a new n-process gloo world (`fn` must be importable);
    the list of their return values. `timeout_s` bounds each collective (torch's default if None)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank_main, args=(n, tmp, timeout_s, fn, args), nprocs=n, join=True)
        out = []
        for r in range(n):
            with open(os.path.join(tmp, f"out{r}.pkl"), "rb") as f:
                out.append(pickle.load(f))
        return out
