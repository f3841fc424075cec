"""`zerobench calibrate`: microbenchmarks of what each term of the performance model stands for,
written as a measured hardware profile (perfmodel/profile_file.py) that `model`, `estimate` and
the workflow take by path or name.

Terms and what measures them (docs/perfmodel.md, "Calibrated profiles"):
- GEMMs (compute.py): `torch.mm` over a grid of (m, n, k) shapes in the compute dtype the engine
  uses (fp32 on CPU, where 16-bit matmul is ~300x slower; bf16 on GPU);
- element-wise kernels: layernorm, GeLU and a residual add at several tensor sizes, as bytes read
  and written per second (caches make small tensors faster, so it is a table by size);
- the optimizer: torch's Adam (fused on CPU, as zero/optimizer.py runs it) seconds per parameter;
- collectives: all-reduce, reduce-scatter and all-gather through zerobench/comms.py in spawned
  gloo (CPU) or NCCL (GPU) worlds of each group size, fitted as α + ring volume / bandwidth;
- host↔device copies (GPU only): pinned copies, bytes/s.
Every benchmark prints one progress line. About a minute on two CPU cores.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from zerobench.config import ConfigError
from zerobench.devices import hardware_profile
from zerobench.perfmodel.hardware import PROFILES, HardwareProfile
from zerobench.perfmodel.profile_file import OPS, profile_dir, save

# GEMM grid per device: each dimension from these values (log-spaced), shapes above the FLOP cap
# skipped (they are saturated; the model reads their rate from the largest measured neighbours).
GEMM_DIMS = {"cpu": (64, 256, 1024, 4096), "cuda": (256, 1024, 4096, 16384)}
GEMM_FLOP_CAP = {"cpu": 4e9, "cuda": 2e12}
ELEMENTWISE_NUMEL = {"cpu": (2**16, 2**19, 2**22), "cuda": (2**20, 2**24, 2**27)}
COLLECTIVE_NUMEL = (2**10, 2**14, 2**18, 2**21)  # fp32 elements per message
COLLECTIVE_REPS = 5
ADAM_PARAMS = 2**22


def _time(fn, device: str, min_s: float = 0.05, reps: int = 3) -> float:
    """Median seconds of `fn()` over `reps` timings, each repeating it for at least `min_s`."""
    fn()  # warm-up (first-call allocation, kernel selection)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    samples = []
    for _ in range(reps):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            sync()
            if (elapsed := time.perf_counter() - t0) >= min_s:
                break
        samples.append(elapsed / n)
    return statistics.median(samples)


def gemm_table(device: str, dtype: torch.dtype, log) -> list[list]:
    rows = []
    dims = GEMM_DIMS[device]
    for m in dims:
        for n in dims:
            for k in dims:
                if 2 * m * n * k > GEMM_FLOP_CAP[device]:
                    continue
                a = torch.randn(m, k, device=device, dtype=dtype)
                b = torch.randn(k, n, device=device, dtype=dtype)
                rows.append([m, n, k, 2 * m * n * k / _time(lambda a=a, b=b: torch.mm(a, b), device, 0.02)])
    best = max(r[3] for r in rows)
    log(f"gemm: {len(rows)} shapes, {dtype}, best {best / 1e9:.1f} GFLOP/s")
    return rows


def elementwise_table(device: str, dtype: torch.dtype, log) -> tuple[list[list], dict]:
    """Bytes read + written per second by the layer's element-wise kernels, per tensor size; the
    table keeps the median over the kernels at each size."""
    rows, per_kernel = [], {}
    h = 256  # row width of the normalised tensors
    for numel in ELEMENTWISE_NUMEL[device]:
        x = torch.randn(numel // h, h, device=device, dtype=dtype)
        y = torch.randn_like(x)
        w = torch.ones(h, device=device, dtype=dtype)
        nbytes = numel * x.element_size()
        kernels = {  # (fn, tensors read + written)
            "layernorm": (lambda x=x, w=w: F.layer_norm(x, (h,), w, w), 2),
            "gelu": (lambda x=x: F.gelu(x), 2),
            "residual_add": (lambda x=x, y=y: x + y, 3),
        }
        rates = {name: io * nbytes / _time(fn, device, 0.02) for name, (fn, io) in kernels.items()}
        per_kernel[str(nbytes)] = rates
        rows.append([nbytes, statistics.median(rates.values())])
        log(f"elementwise {nbytes / 2**20:.1f} MiB: {rows[-1][1] / 1e9:.1f} GB/s ({', '.join(rates)})")
    return rows, per_kernel


def adam_seconds_per_param(device: str, log) -> float:
    p = torch.zeros(ADAM_PARAMS, device=device, requires_grad=True)
    p.grad = torch.randn_like(p)
    opt = torch.optim.Adam([p], lr=1e-3, fused=device == "cpu" or None, foreach=False if device == "cpu" else None)
    s = _time(opt.step, device, 0.1) / ADAM_PARAMS
    log(f"adam: {s * 1e9:.2f} ns per parameter")
    return s


def host_copy_bw(log) -> float:
    x = torch.empty(2**26, dtype=torch.uint8, pin_memory=True)
    d = torch.empty(2**26, dtype=torch.uint8, device="cuda")
    rate = min(x.numel() / _time(lambda: d.copy_(x, non_blocking=True), "cuda"),
               x.numel() / _time(lambda: x.copy_(d, non_blocking=True), "cuda"))  # fmt: skip
    log(f"host<->device: {rate / 1e9:.1f} GB/s")
    return rate


def _collective_worker(rank: int, size: int, init: str, device: str, out: str) -> None:
    from zerobench.comms import Comms
    from zerobench.parallel.topology import Group

    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=size)
    group = Group("calibrate", size, rank, dist.group.WORLD)
    comms, rows = Comms(), []
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
            for _ in range(COLLECTIVE_REPS):  # a fixed count: every rank must issue the same calls
                t0 = time.perf_counter()
                calls[op]()
                times.append(time.perf_counter() - t0)
            entry = comms.ledger.entries[(op, "calibrate")]
            rows.append([op, entry.volume_bytes / entry.calls, statistics.median(times)])
    if rank == 0:
        torch.save(rows, out)
    dist.destroy_process_group()


def _fit_alpha_beta(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares t = α + v/β over (per-rank ring volume in bytes, seconds); α ≥ 0."""
    n = len(points)
    mv = sum(v for v, _ in points) / n
    mt = sum(t for _, t in points) / n
    slope = sum((v - mv) * (t - mt) for v, t in points) / sum((v - mv) ** 2 for v, _ in points)
    return max(0.0, mt - slope * mv), 1.0 / slope


def collectives(device: str, sizes: list[int], log) -> tuple[list[list], dict]:
    rows, samples = [], {}
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            init, out = f"file://{tmp}/rendezvous", os.path.join(tmp, "rows.pt")
            mp.start_processes(_collective_worker, args=(size, init, device, out), nprocs=size, start_method="spawn")
            measured = torch.load(out)
        for op in OPS:
            pts = [(v, t) for o, v, t in measured if o == op]
            alpha, bw = _fit_alpha_beta(pts)
            rows.append([op, size, alpha, bw])
            samples[f"{op}/{size}"] = pts
            log(f"{op} x{size}: alpha {alpha * 1e6:.0f} us, {bw / 1e9:.2f} GB/s of ring volume")
    return rows, samples


def calibrate(device: str = "cpu", group_sizes: tuple[int, ...] = (2,), name: str | None = None, log=print):
    """Run every microbenchmark on this machine; return (profile, raw samples)."""
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r}: must be cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda': no CUDA device is visible")
    dtype = torch.float32 if device == "cpu" else torch.bfloat16  # the engine's compute dtypes
    if device == "cpu":  # per core, as the workflow runs its ranks: one intra-op thread each (Snakefile)
        torch.set_num_threads(1)
    gemm = gemm_table(device, dtype, log)
    elementwise, per_kernel = elementwise_table(device, dtype, log)
    adam = adam_seconds_per_param(device, log)
    devices = torch.cuda.device_count() if device == "cuda" else os.cpu_count() or 1
    sizes = [n for n in group_sizes if n <= devices or device == "cpu"]  # NCCL: one rank per GPU
    coll, coll_samples = collectives(device, sizes, log)
    if coll:
        ring_bw = max(r[3] for r in coll if r[0] == "all_reduce")
        alpha = min(r[2] for r in coll if r[0] == "all_reduce")
    else:  # a single GPU: no group to measure; the datasheet's links, said so in the log
        sheet = PROFILES[hardware_profile(torch.device("cuda")) or "h100-80gb"]
        ring_bw, alpha = sheet.intra_bw, sheet.intra_latency
        log(f"collectives: not measured ({devices} GPU); links from the {sheet.name} datasheet profile")
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        gpu, memory, per_node = props.name, float(props.total_memory), torch.cuda.device_count()
        host = host_copy_bw(log)
    else:
        gpu = f"CPU x{os.cpu_count()} cores"
        memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        per_node, host = os.cpu_count() or 1, max(r[1] for r in elementwise)  # a host "copy" is a memcpy
    profile = HardwareProfile(
        name=name or f"calibrated-{device}", gpu=gpu, peak_flops=max(r[3] for r in gemm), memory_bytes=memory,
        hbm_bw=max(r[1] for r in elementwise), gpus_per_node=per_node, intra_bw=ring_bw, nic_bw=ring_bw,
        nics_per_node=1, host_bw=host, intra_latency=alpha, inter_latency=alpha, measured=True,
        gemm_table=tuple(map(tuple, gemm)), elementwise_table=tuple(map(tuple, elementwise)),
        adam_s_per_param=adam, collectives=tuple(map(tuple, coll)), ranks_share_compute=device == "cpu",
        reserve_bytes=0.0 if device == "cpu" else None,
    )  # fmt: skip
    samples = {"elementwise_per_kernel": per_kernel, "collectives": coll_samples, "torch": torch.__version__,
               "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "gemm": gemm}  # fmt: skip
    return profile, samples


def output_path(out: str) -> Path:
    """`--out`: a path ending in .json, or a name written under the profile directory."""
    return Path(out) if out.endswith(".json") or os.sep in out else profile_dir() / f"{out}.json"


def main(device: str, out: str, group_sizes: tuple[int, ...]) -> Path:
    path = output_path(out)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[calibrate {time.perf_counter() - t0:5.1f}s] {msg}", flush=True)

    profile, samples = calibrate(device, group_sizes, path.stem, log)
    save(profile, path, samples)
    log(f"wrote {path}")
    return path
