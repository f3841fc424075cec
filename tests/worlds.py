"""Ways to run a function on every rank of a small world, for tests.

- `threaded(n, fn, *args)`: PyTorch's threaded process group — real collective semantics, n
  ranks as threads of this process, ~0.1 s to start. For exact checks of collective logic.
- `spawned(n, fn, *args)`: n processes on gloo with a file rendezvous (no ports to collide on),
  ~4 s per rank here. For the real backend (zerobench/engine/parallel/spawn.py, shared with the peers).
Both return the list of each rank's return value; `fn(rank, *args)` must be importable.
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.multi_threaded_pg import (
    ProcessLocalGroup,
    _install_threaded_pg,
    _uninstall_threaded_pg,
)

from zerobench.engine.parallel.spawn import spawned  # noqa: F401 - the tests' processes world


def threaded(n: int, fn, *args):
    world = _install_threaded_pg()
    store = dist.HashStore()
    out, errors = [None] * n, []

    def run(rank):
        try:
            dist.init_process_group(backend="threaded", rank=rank, world_size=n, store=store)
            out[rank] = fn(rank, *args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append((rank, exc))
            ProcessLocalGroup.exception_handle(exc)  # wake the other ranks
        finally:
            if world == dist.distributed_c10d._world and dist.is_initialized():
                dist.destroy_process_group()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    torch._C._distributed_c10d._set_thread_isolation_mode(True)  # per-thread group registry
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        ProcessLocalGroup.reset()
        _uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
    if errors:
        rank, exc = errors[0]
        raise RuntimeError(f"rank {rank} failed: {exc!r}") from exc
    return out
