"""What every implementation in the side-by-side comparison shares: the same GPT with the same
initial weights, the same token batches, and one measurement harness run on every rank of a
world of its own (one spawned gloo world per implementation, zerobench/engine/parallel/spawn.py;
on CUDA a world of one rank on one GPU (the command refuses more), whose FSDP2 collectives on CUDA
tensors go over an NCCL group of that rank, `device_group`).

The harness times whole optimizer steps on the engine's step timer (runtime/devices.py: on CUDA
the stream waited for at each mark, so a step's time is its work, not its launch; median and
spread over the timed steps), records the loss of every step averaged over DP ranks, the peak
resident set of each rank (VmHWM: the high-water mark of this process's own address space, so
the launcher's memory is not counted), on CUDA the peak allocated device memory of each rank
(`torch.cuda.max_memory_allocated`, from a reset before the model is built), and the collective
bytes each implementation issues, observed at torch.distributed's Python API. TFLOPS follow
zerobench/flops.py's convention and MFU zerobench/gpus.py's datasheet peak, as a measured trial's
record gives them. For ours it also times the timed steps' collectives issued again with no
compute, after them in the same world (ours.py, `collective_seconds`).
"""

from __future__ import annotations

import functools
import importlib
import json
import statistics
import threading

import torch
import torch.distributed as dist

from zerobench.engine.model import GPT
from zerobench.engine.parallel.spawn import spawned
from zerobench.engine.step import shifted
from zerobench.engine.zero.activations import apply_activation_checkpointing
from zerobench.gpus import mfu
from zerobench.runtime.batches import SyntheticTokens
from zerobench.runtime.devices import StepTimer, hardware_profile, peak_memory
from zerobench.runtime.train import rank_batch
from zerobench.trial import TrialSpec

# torch's own peer of each ZeRO stage (zerobench/peers/torch_peers.py)
TORCH_PEER = {0: "ddp", 1: "zero-redundancy-optimizer", 2: "fsdp2-no-reshard", 3: "fsdp2-reshard"}
# The plain PyTorch loop, eager and compiled (zerobench/peers/plain.py): one process, one device,
# nothing partitioned, so beside stage 0.
PLAIN = ("plain", "plain-compile")
# Implementation name -> (module in zerobench.peers, the ZeRO stage it corresponds to). Ordered by
# stage, so each stage's rows are measured close together in time (a shared machine's load drifts).
IMPLEMENTATIONS: dict[str, tuple[str, int]] = {
    name: (module, stage)
    for stage in range(4)
    for name, module in (
        (f"ours-{stage}", "ours"),
        *(((plain, "plain") for plain in PLAIN) if stage == 0 else ()),
        (TORCH_PEER[stage], "torch_peers"),
        (f"deepspeed-{stage}", "deepspeed_peer"),
    )
}
# What one device compares unless told (world size 1): ours at every stage, the plain loop eager and
# compiled, and FSDP2 (at world size 1 its per-block unshard and reshard, bf16 casts and gradient
# hand-over, with whatever collectives its version still issues there, counted in the row).
SINGLE_DEVICE = ("ours-0", "plain", "plain-compile", "ours-1", "ours-2", "fsdp2-no-reshard", "ours-3", "fsdp2-reshard")


class Unavailable(Exception):
    """The implementation cannot run here (a package missing, code not written yet)."""


def family(impl: str):
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"impl={impl!r}: unknown; choose from {list(IMPLEMENTATIONS)}")
    return importlib.import_module(f"zerobench.peers.{IMPLEMENTATIONS[impl][0]}")


def default_impls(world_size: int, stage: int | None = None) -> list[str]:
    """What `zerobench peers` compares unless told (of `stage`, if given): on one device
    `SINGLE_DEVICE`; in a world of several ranks every data-parallel implementation."""
    names = SINGLE_DEVICE if world_size == 1 else [i for i in IMPLEMENTATIONS if i not in PLAIN]
    return [i for i in names if stage is None or IMPLEMENTATIONS[i][1] == stage]


def reference_model(spec, checkpoint: bool = True) -> GPT:
    """The GPT every peer trains: our model, fp32, on the trial's device (the current GPU on
    CUDA), with our seeded init drawn there as our engine draws it. With `checkpoint` and a trial
    that checkpoints activations, each block checkpointed by our engine's function (the same
    recomputation as ours)."""
    with torch.device(spec.precision.device):
        model = GPT(spec.model)
    if checkpoint and spec.parallel.checkpoint_activations:
        apply_activation_checkpointing(model, spec.parallel)
    model.init_weights(spec.train.seed)
    return model


@functools.cache
def device_group(device: str):
    """The process group for collectives on `device`'s tensors: the (gloo) world on CPU, None;
    on CUDA an NCCL group of every rank, made once per process (every rank calls this alike)."""
    return None if device == "cpu" else dist.new_group(backend="nccl")


def rank_batches(spec, dp_rank: int, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's (inputs, targets) micro-batches of `step`: the slices our engine takes."""
    data = SyntheticTokens(spec.model.vocab, spec.model.seq, spec.train.seed)
    return [shifted(mb) for mb in rank_batch(data, step, spec.train, dp_rank)]


# -- collective observer ------------------------------------------------------------------------
# torch.distributed's Python entry points and the op they count as. Only the package namespace
# is patched: torch's own wrappers call each other inside distributed_c10d, so nothing counts twice.
_OPS = {
    "all_reduce": "all_reduce",
    "reduce": "reduce",
    "broadcast": "broadcast",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",
    "_all_gather_base": "all_gather",
    "all_gather": "all_gather",
    "isend": "send",  # point-to-point: our comms' pairwise exchange on gloo (bytes sent)
}


def finish_step(loss: torch.Tensor, model: torch.nn.Module, opt: torch.optim.Optimizer, clip_norm: float) -> float:
    """The rest of a torch peer's step after its forward: backward, torch's global-norm clip where
    asked (DDP's gradients are replicated, FSDP2's are DTensors: either way the global norm), the
    optimizer step; the loss as a float."""
    loss.backward()
    if clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def _message_bytes(name: str, args, kwargs) -> int:
    """Bytes of the full message: the input of a reduction, the output of a gather."""
    first = args[0] if args else next(iter(kwargs.values()))
    if name in ("reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base", "reduce_scatter"):
        first = args[1] if len(args) > 1 else kwargs.get("input", kwargs.get("input_list"))
    tensors = first if isinstance(first, list | tuple) else [first]
    return sum(t.numel() * t.element_size() for t in tensors)


class CollectiveObserver:
    """Counts calls and message bytes per op of every collective issued through
    torch.distributed's Python API (our Comms, FSDP2, ZeroRedundancyOptimizer, DeepSpeed; DDP's
    C++ reducer is routed through it by a comm hook). Install before DeepSpeed binds its functions."""

    def __init__(self):
        self.counts: dict[str, dict[str, int]] = {}
        self.active = False
        self._local = threading.local()
        for name, op in _OPS.items():
            setattr(dist, name, self._wrap(name, op, getattr(dist, name)))

    def _wrap(self, name: str, op: str, fn):
        @functools.wraps(fn)
        def counted(*args, **kwargs):
            depth = getattr(self._local, "depth", 0)
            if self.active and depth == 0:
                entry = self.counts.setdefault(op, {"calls": 0, "bytes": 0})
                entry["calls"] += 1
                entry["bytes"] += _message_bytes(name, args, kwargs)
            self._local.depth = depth + 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._local.depth = depth

        return counted


def _read_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


# -- one rank -------------------------------------------------------------------------------------
def train_on_rank(impl: str, spec, observer: CollectiveObserver | None = None) -> dict:
    """Build `impl` on this rank of an initialized world and train warm-up + timed steps.
    Returns this rank's losses (every step), step times (timed steps), the warm-up's seconds
    (a compiled peer's compilation in them) and base RSS."""
    base_rss = _read_status_kib("VmRSS") * 1024
    trainer = family(impl).build(impl, spec)
    warmup = spec.train.warmup
    timer = StepTimer(torch.device(spec.precision.device))
    losses = []
    timer.mark()
    for step in range(warmup + spec.train.steps):
        if observer is not None:
            observer.active = step >= warmup  # count the timed steps only
        losses.append(trainer.step(step))
        timer.mark()
    if observer is not None:
        observer.active = False
    times = timer.times()
    return {
        "losses": losses,
        "times": times[warmup:],
        "warmup_s": sum(times[:warmup]),
        "base_rss": base_rss,
        "note": trainer.note,
        "trainer": trainer,
    }


def timed_collectives(trainer, observer: CollectiveObserver) -> dict:
    """Calls and message bytes per op over the timed steps: from the trainer's own ledger where it
    keeps one (ours: the logical collectives, however parallel/comms.py realizes them), else as observed."""
    own = getattr(trainer, "timed_collectives", None)
    return own() if own is not None else observer.counts


def _on_rank(rank: int, impl: str, spec_dict: dict) -> dict | None:
    """One rank of `measure`'s world; rank 0 returns the raw measurements."""
    spec = TrialSpec.from_dict(spec_dict)
    world = dist.get_world_size()
    device = torch.device(spec.precision.device)
    if device.type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.reset_peak_memory_stats(device)  # this rank's peak from here: build and steps
    observer = CollectiveObserver()  # before DeepSpeed binds torch.distributed's functions
    out = train_on_rank(impl, spec, observer)
    peak = _read_status_kib("VmHWM") * 1024
    allocated = peak_memory(device)[1] if device.type == "cuda" else None
    replay = getattr(out["trainer"], "collective_seconds", None)  # ours: the bound row's collectives
    collective_s = replay() if replay is not None else None
    loss_t = torch.tensor(out["losses"], dtype=torch.float64)
    dist.all_reduce(loss_t)
    loss_t /= world
    per_rank = [None] * world
    dist.all_gather_object(per_rank, (peak, out["base_rss"], allocated))
    if rank != 0:
        return None
    return {
        "times": out["times"],
        "warmup_s": out["warmup_s"],
        "losses": loss_t.tolist(),
        "peak_rss": [p for p, _, _ in per_rank],
        "base_rss": [b for _, b, _ in per_rank],
        "peak_allocated": [a for _, _, a in per_rank],
        "hardware": hardware_profile(device),
        "comm": timed_collectives(out["trainer"], observer),
        "collective_s": collective_s,
        "note": out["note"],
    }


def measure(impl: str, spec, ranks: int | None = None) -> dict:
    """Train `spec` with `impl` in a world of its own; the raw measurements of rank 0.
    `ranks`: processes in that world (default: the spec's dp); with a one-rank spec and more
    ranks, each process trains the spec alone, all at once. Raises Unavailable when the
    implementation cannot run here."""
    family(impl).check(impl, spec)  # fails fast, in this process, with the reason
    n = ranks or spec.parallel.dp
    return spawned(n, _on_rank, impl, spec.to_dict(), timeout_s=spec.timeout_s)[0]


def summarise(raw: dict, spec) -> dict:
    """Row fields from raw measurements: median step time and spread, TFLOPS per device and MFU,
    memory, bytes per step."""
    times = raw["times"]
    steps = len(times)
    comm = {op: {"calls": v["calls"] / steps, "bytes": v["bytes"] / steps} for op, v in sorted(raw["comm"].items())}
    step_time = statistics.median(times)
    tflops = spec.tflops_per_gpu(step_time)
    allocated = raw.get("peak_allocated") or [None]
    return {
        "step_time_s": step_time,
        "warmup_time_s": raw.get("warmup_s"),
        "hardware": raw.get("hardware"),
        "tflops_per_gpu": tflops,
        "mfu": mfu(tflops, raw.get("hardware")),
        "peak_allocated_bytes": None if None in allocated else max(allocated),
        "step_time_min_s": min(times),
        "step_time_max_s": max(times),
        "step_time_iqr_s": _iqr(times),
        "peak_rss_bytes": max(raw["peak_rss"]),
        "peak_rss_bytes_per_rank": json.dumps(raw["peak_rss"]),
        "base_rss_bytes": max(raw["base_rss"]),
        "comm_bytes_per_step": sum(v["bytes"] for v in comm.values()),
        "comm_per_step": json.dumps(comm),
        "losses": json.dumps(raw["losses"]),
        "collective_s_per_step": statistics.median(raw["collective_s"]) if raw.get("collective_s") else None,
        "note": raw["note"],
    }


def _iqr(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    q = statistics.quantiles(xs, n=4)
    return q[2] - q[0]
