"""The concurrency benchmark of `zerobench calibrate` (CPU): how much slower one core runs a step's
kernels while every rank's process runs them at once on the host's other cores, sharing its
memory bandwidth and cache. The model multiplies a CPU host's compute and optimizer times by it
when a host runs more than one rank (perfmodel/predict.py).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F


def _step_like(reps: int) -> float:
    """Seconds of `reps` rounds of a step's kernel mix on one thread: a linear, GeLU and the loss,
    forward and backward (the shapes of cpu-10m at micro-batch 4)."""
    torch.set_num_threads(1)
    x, w, b, logits = (
        torch.randn(*shape).requires_grad_() for shape in ((512, 256), (1024, 256), (1024,), (512, 8192))
    )
    target = torch.randint(0, 8192, (512,))
    t0 = time.perf_counter()
    for _ in range(reps):
        F.gelu(F.linear(x, w, b), approximate="tanh").sum().backward()
        F.cross_entropy(logits, target).backward()
        for t in (x, w, b, logits):
            t.grad = None
    return time.perf_counter() - t0


def _concurrent_worker(rank: int, reps: int, rounds: int, start, out) -> None:
    _step_like(1)  # warm-up (and torch imported) before anything is timed
    start.wait()
    for _ in range(rounds):
        if rank == 0:
            out.put(("alone", _step_like(reps)))
        start.wait()  # rank 0's solo run is over; all ranks go at once
        out.put(("together", _step_like(reps)))
        start.wait()


def concurrency_slowdown(ranks: int, log, reps: int = 60, rounds: int = 7) -> float:
    """How much slower the step's kernels run on one core while `ranks` processes (one per core,
    sharing memory bandwidth and cache) run them at once: the median over `rounds` of (mean time
    together) / (rank 0's time alone, just before), in fresh processes (alone in calibrate's own,
    its heap grown by every earlier benchmark, the ratio read 0.72-0.89)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(ranks + 1), ctx.Queue()
    procs = [ctx.Process(target=_concurrent_worker, args=(r, reps, rounds, start, out)) for r in range(ranks)]
    for p in procs:
        p.start()
    start.wait()  # every rank started and warm
    ratios = []
    for _ in range(rounds):
        start.wait()  # rank 0 ran alone
        start.wait()  # then every rank at once
        times = [out.get() for _ in range(ranks + 1)]
        alone = next(t for kind, t in times if kind == "alone")
        ratios.append(statistics.mean(t for kind, t in times if kind == "together") / alone)
    for p in procs:
        p.join()
    factor = max(1.0, statistics.median(ratios))
    log(
        f"concurrency: {ranks} ranks at once run the step's kernels {factor:.2f}x as long as one alone "
        f"({', '.join(f'{r:.2f}' for r in ratios)})"
    )
    return factor
