"""`zerobench calibrate`: microbenchmarks of what each term of the performance model stands for,
written as a measured hardware profile (perfmodel/profile_file.py) that `model`, `estimate` and
the workflow take by path or name.

Terms and what measures them (docs/perfmodel.md, "Calibrated profiles"):
- compute (zerobench/microbench/kernel_bench.py), in the compute dtype the engine uses (fp32 on CPU,
  where 16-bit matmul is ~300x slower; bf16 on GPU): F.linear over a grid of shapes and the named
  kernels by size, forward and backward through autograd; the engine's Adam and clip per
  parameter; the cost of an op beside its arithmetic, and the ops a layer runs;
- collectives: all-reduce, reduce-scatter and all-gather through zerobench/engine/parallel/comms.py in spawned
  gloo (CPU) or NCCL (GPU) worlds of each group size: the mean time per message size (the curve
  the model reads; the median over three runs spread over the calibration), and α + ring volume
  / bandwidth fitted to it (beyond its largest message);
- sync waits, in the same worlds: what a rank waits at a collective after the same compute as the
  others (`_sync_waits`); and what an MP all-reduce costs inside the engine's own MP steps beyond
  the curve (zerobench/microbench/engine_runs.py, CPU);
- host↔device copies (GPU only): pinned copies, bytes/s;
- the runtime's memory (CPU only): RSS a fresh process gains beyond its tensors (a tiny trial,
  zerobench/microbench/engine_runs.py), and what it gains more with activation checkpointing;
- concurrency (CPU only): the step's kernels on one core, alone and with every rank running.
Every benchmark prints one progress line. About 5 minutes on two CPU cores (under 2 with `--passes 1`).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from zerobench.clock import device_clock
from zerobench.engine.parallel.comms import Comms
from zerobench.engine.parallel.topology import Group
from zerobench.microbench.concurrency import concurrency_slowdown
from zerobench.microbench.engine_runs import MP_STEP_ROUNDS, mp_step_waits, runtime_bytes
from zerobench.microbench.kernel_bench import (
    GEMM_PASSES,
    gemm_table,
    kernel_table,
    median_rows,
    op_overhead,
    timed,
)
from zerobench.perfmodel.hardware import PROFILES, HardwareProfile
from zerobench.perfmodel.profile_file import OPS, profile_dir, save
from zerobench.runtime import probe
from zerobench.runtime.devices import hardware_profile
from zerobench.trial.errors import InputError

COLLECTIVE_NUMEL = (2**8, 2**12, 2**16, 2**18, 2**20, 2**21)  # fp32 elements per message
# Calls per message size, and the time kept is their mean, not their median: a step pays every
# call, and on loopback some calls wait for a wake-up (docs/perfmodel.md gives the readings)
COLLECTIVE_CALLS = 40
# Runs of the whole collective benchmark (fresh processes each, a minute or more apart); each call's
# time and each wait is the median over them, so one run caught in a slow spell is set aside
COLLECTIVE_RUNS = 3
# (seconds of compute between two syncs, rounds) of the sync-wait benchmark: 1-3 s each
SYNC_COMPUTE = ((0.002, 500), (0.02, 100), (0.2, 15))


def host_copy_bw(log) -> float:
    x = torch.empty(2**26, dtype=torch.uint8, pin_memory=True)
    d = torch.empty(2**26, dtype=torch.uint8, device="cuda")
    rate = min(
        x.numel() / timed(lambda: d.copy_(x, non_blocking=True), "cuda"),
        x.numel() / timed(lambda: x.copy_(d, non_blocking=True), "cuda"),
    )
    log(f"host<->device: {rate / 1e9:.1f} GB/s")
    return rate


def host_probe(device: str, log) -> list:
    """One reading of the host speed probe (runtime/probe.py), logged."""
    reading = probe.read(device)
    log(f"host probe: GEMM {reading[2] / 1e9:.1f} GFLOP/s, copy {reading[3] / 1e9:.2f} GB/s")
    return reading


def _collective_worker(rank: int, size: int, init: str, device: str, out: str) -> None:

    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=size)
    group = Group("calibrate", size, rank, dist.group.WORLD)
    comms, rows, clock = Comms(), [], device_clock(device)
    warm = torch.ones(COLLECTIVE_NUMEL[0] * size, device=device)
    for _ in range(COLLECTIVE_CALLS):  # the first calls on a new group set up its connections (ms each)
        comms.all_reduce(warm, group)
        comms.all_gather(warm, warm[: COLLECTIVE_NUMEL[0]], group)
        comms.reduce_scatter(warm[: COLLECTIVE_NUMEL[0]], warm, group)
    for numel in COLLECTIVE_NUMEL:
        full = torch.ones(numel * size, device=device)
        part = torch.ones(numel, device=device)
        calls = {
            "all_reduce": lambda full=full: comms.all_reduce(full, group),
            "reduce_scatter": lambda full=full, part=part: comms.reduce_scatter(part, full, group),
            "all_gather": lambda full=full, part=part: comms.all_gather(full, part, group),
        }
        for op in OPS:
            calls[op]()  # warm-up
            comms.ledger.reset()
            dist.barrier()
            times = []
            for _ in range(COLLECTIVE_CALLS):  # a fixed count: every rank must issue the same calls
                t0 = clock()  # on CUDA: the transfer, not its launch
                calls[op]()
                times.append(clock() - t0)
            entry = comms.ledger.entries[(op, "calibrate")]
            rows.append([op, entry.volume_bytes / entry.calls, statistics.mean(times)])
    sync = _sync_waits(comms, group, device, min(t for op, _, t in rows if op == "all_reduce"))
    if rank == 0:
        torch.save({"rows": rows, "sync": sync}, out)
    dist.destroy_process_group()


def _sync_waits(comms, group, device: str, alone: float) -> list[list[float]]:
    """Rows (seconds of compute between two synchronising collectives, seconds each rank waits at
    the collective beyond its own time `alone`): every rank runs the same matmuls, then a one-
    element all-reduce, as an MP rank does between its all-reduces and a DP rank before its
    reduction. The ranks finish their equal work at different times (a shared host's cores run
    unevenly), and the first one waits: the mean wait over ranks and rounds is what a sync adds."""
    x, tiny, clock = torch.randn(256, 256, device=device), torch.ones(1, device=device), device_clock(device)
    x @ x
    t0 = clock()
    for _ in range(20):
        x @ x
    per = torch.tensor([(clock() - t0) / 20], dtype=torch.float64, device=device)
    comms.all_reduce(per, group, op=dist.ReduceOp.MAX)  # the same work on every rank
    rows = []
    for compute, rounds in SYNC_COMPUTE:
        n, waits = max(1, round(compute / float(per))), []
        dist.barrier()
        for _ in range(rounds):
            for _ in range(n):
                x @ x
            t0 = clock()  # on CUDA: once this rank's matmuls are done
            comms.all_reduce(tiny, group)
            waits.append(clock() - t0)
        mean = torch.tensor([statistics.mean(waits)], dtype=torch.float64, device=device)
        comms.all_reduce(mean, group)
        rows.append([n * float(per), max(0.0, float(mean) / group.size - alone)])
    return rows


def _fit_alpha_beta(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(α, β) of t = α + v/β over (per-rank ring volume in bytes, seconds): α is the time of the
    smallest message (its bytes take no time to speak of), β the least-squares bandwidth of what
    the messages of 256 KiB and up take beyond α. A plain line fit lets the largest messages'
    noise set the intercept."""
    alpha = min(points)[1]
    large = [(v, t - alpha) for v, t in points if v >= 2**18] or [max(points)]
    return alpha, sum(v * v for v, _ in large) / max(sum(v * t for v, t in large), 1e-12)


def collective_run(device: str, sizes: list[int], log) -> dict[int, dict]:
    """One run of the collective benchmark per group size, in processes of its own: {size: {"rows":
    [[op, bytes per call, mean s]], "sync": [[compute s, wait s]]}}."""
    runs = {}
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            init, out = f"file://{tmp}/rendezvous", os.path.join(tmp, "rows.pt")
            mp.start_processes(_collective_worker, args=(size, init, device, out), nprocs=size, start_method="spawn")
            runs[size] = torch.load(out)
        small = min(t for op, _, t in runs[size]["rows"] if op == "all_reduce")
        log(f"collectives x{size}: one run, the smallest all-reduce {small * 1e6:.0f} us")
    return runs


def collectives(runs: list[dict[int, dict]], log) -> tuple[list[list], list[list], list[list]]:
    """(α–β rows (op, size, α, bytes/s), curve rows (op, size, per-rank ring volume, seconds),
    sync rows (group size, compute s between syncs, wait s), see `_sync_waits`) from the runs of
    `collective_run`: each call's time, and each wait, the median over the runs."""
    rows, curve, syncs = [], [], []
    for size in runs[0]:
        sync = median_rows([run[size]["sync"] for run in runs], 0)
        syncs += [[size, *row] for row in sync]
        log(f"sync x{size}: " + ", ".join(f"{w * 1e3:.2f} ms waited after {c * 1e3:.0f} ms" for c, w in sync))
        measured = median_rows([run[size]["rows"] for run in runs], 2)
        for op in OPS:
            pts = [(v, t) for o, v, t in measured if o == op]
            # a message never takes longer than a larger one: each point at most the larger ones' time
            pts = [(v, min(u for w, u in pts if w >= v)) for v, _ in sorted(pts)]
            alpha, bw = _fit_alpha_beta(pts)
            rows.append([op, size, alpha, bw])
            curve += [[op, size, v, t] for v, t in pts]
            log(
                f"{op} x{size}: alpha {alpha * 1e6:.0f} us, {bw / 1e9:.2f} GB/s of ring volume"
                f" (median of {len(runs)} runs)"
            )
    return rows, curve, syncs


def calibrate(
    device: str = "cpu",
    group_sizes: tuple[int, ...] = (2,),
    name: str | None = None,
    log=print,
    passes: int = GEMM_PASSES,
):
    """Run every microbenchmark on this machine; return (profile, raw samples). `passes`: sweeps
    of the linear grid and of the kernels (each row their median; 1 for a quick smoke profile)."""
    if device not in ("cpu", "cuda"):
        raise InputError(f"device={device!r}: must be cpu or cuda")
    if not isinstance(passes, int) or passes < 1:
        raise InputError(f"passes={passes!r}: must be an integer >= 1")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("device='cuda': no CUDA device is visible")
    dtype = torch.float32 if device == "cpu" else torch.bfloat16  # the engine's compute dtypes
    if device == "cpu":  # per core, as the workflow runs its ranks: one intra-op thread each (Snakefile)
        torch.set_num_threads(1)
    devices = torch.cuda.device_count() if device == "cuda" else os.cpu_count() or 1
    sizes = [n for n in group_sizes if n <= devices or device == "cpu"]  # NCCL: one rank per GPU
    # The collective runs are spread over the calibration, first, after the grids and last: a
    # shared host's slow spells last a minute or more, and one run in one took its calls 2-5x as long.
    runs = COLLECTIVE_RUNS if passes > 1 else 1
    probes = [host_probe(device, log)]  # at the start and the end: what a trial's probe is compared with
    coll_runs = [collective_run(device, sizes, log)]
    gemm = gemm_table(device, dtype, log, passes)
    kernels = kernel_table(device, dtype, log, passes)
    if runs > 1:
        coll_runs.append(collective_run(device, sizes, log))
    per_op, (ops_per_layer, ops_fixed) = op_overhead(device, log)
    runtime, ckpt_runtime = runtime_bytes(log) if device == "cpu" else (0.0, 0.0)  # a GPU's is the paper's
    # CPU ranks share a host's memory bandwidth and cache (a GPU per rank shares nothing)
    ranks = min(max(group_sizes), os.cpu_count() or 1)
    slowdown = concurrency_slowdown(ranks, log) if device == "cpu" and ranks > 1 else 1.0
    # bytes/s of the residual add (read 2, write 1) at its largest size: the memory bandwidth
    add = max((r for r in kernels if r[0] == "residual_add"), key=lambda r: r[1])
    stream_bw = 3 * add[1] * dtype.itemsize / add[2]
    coll_runs += [collective_run(device, sizes, log) for _ in range(runs - len(coll_runs))]
    coll, curve, syncs = collectives(coll_runs, log) if sizes else ([], [], [])
    probes.append(host_probe(device, log))
    if coll:
        ring_bw = max(r[3] for r in coll if r[0] == "all_reduce")
        alpha = min(r[2] for r in coll if r[0] == "all_reduce")
    else:  # a single GPU: no group to measure; the datasheet's links, said so in the log
        sheet = PROFILES[hardware_profile(torch.device("cuda")) or "h100-80gb"]
        ring_bw, alpha = sheet.intra_bw, sheet.intra_latency
        log(f"collectives: not measured ({devices} GPU); links from the {sheet.name} datasheet profile")
    reserve = 0.0  # a CPU host: no CUDA context; its budget is counted as RSS growth
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        gpu, memory, per_node = props.name, float(props.total_memory), torch.cuda.device_count()
        host = host_copy_bw(log)
        # never usable by tensors: what is neither free nor the caching allocator's (the CUDA context,
        # cuBLAS's and other processes' memory), measured now that every benchmark has run
        free, total = torch.cuda.mem_get_info()
        reserve = float(total - free - torch.cuda.memory_reserved())
        log(f"memory: {total / 1e9:.2f} GB, {reserve / 1e9:.2f} GB outside the allocator and not free")
    else:
        gpu = f"CPU x{os.cpu_count()} cores"
        memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        per_node, host = os.cpu_count() or 1, stream_bw  # a host "copy" is a memcpy
    profile = HardwareProfile(
        name=name or f"calibrated-{device}", gpu=gpu, peak_flops=max(r[3] for r in gemm), memory_bytes=memory,
        hbm_bw=stream_bw, gpus_per_node=per_node, intra_bw=ring_bw, nic_bw=ring_bw,
        nics_per_node=1, host_bw=host, intra_latency=alpha, inter_latency=alpha, measured=True,
        gemm_table=tuple(map(tuple, gemm)), kernel_table=tuple(map(tuple, kernels)),
        op_overhead_s=per_op, ops_per_layer=ops_per_layer, ops_fixed=ops_fixed, runtime_bytes=runtime,
        checkpoint_runtime_bytes=ckpt_runtime, concurrency_slowdown=slowdown,
        collectives=tuple(map(tuple, coll)), collective_table=tuple(map(tuple, curve)),
        sync_table=tuple(map(tuple, syncs)),
        ranks_share_compute=device == "cpu", reserve_bytes=reserve,
        host_probe=tuple(map(tuple, probes)),
    )  # fmt: skip
    if device == "cpu" and 2 in sizes and (os.cpu_count() or 1) >= 2:  # MP 2 as the trials run it
        waits = mp_step_waits(profile, log, MP_STEP_ROUNDS if passes > 1 else 1)
        profile = dataclasses.replace(profile, mp_sync_table=tuple(map(tuple, waits)))
    samples = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gemm": gemm,
        "collective_runs": coll_runs,
    }
    return profile, samples


def output_path(out: str) -> Path:
    """`--out`: a path ending in .json, or a name written under the profile directory."""
    return Path(out) if out.endswith(".json") or os.sep in out else profile_dir() / f"{out}.json"


def main(device: str, out: str, group_sizes: tuple[int, ...], passes: int | None = None) -> Path:
    """`calibrate` into the profile file `out`; `passes` None: GEMM_PASSES."""
    path = output_path(out)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[calibrate {time.perf_counter() - t0:5.1f}s] {msg}", flush=True)

    profile, samples = calibrate(device, group_sizes, path.stem, log, GEMM_PASSES if passes is None else passes)
    save(profile, path, samples)
    log(f"wrote {path}")
    return path
