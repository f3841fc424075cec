"""Where a measured trial's ranks come from. Started bare, `run_trial` launches its own ranks with
torch's elastic launcher (what torchrun runs); started under torchrun or srun it joins the world
it is in. Every rank runs `worker`, which measures (zerobench/runtime/train.py) under a watchdog and, on
rank 0, writes the one record, whatever happened (`classify` turns a failure into its status)."""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback
import uuid
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from zerobench import record_files
from zerobench.engine.parallel import topology
from zerobench.runtime import faults, slurm_env
from zerobench.runtime.train import measure
from zerobench.trial import TrialSpec, short_error


def classify(exc: BaseException) -> str:
    """The record status for an exception: running out of memory is a result, not a crash."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, MemoryError) or "OutOfMemoryError" in text or "out of memory" in text.lower():
        return "oom"
    if isinstance(exc, TimeoutError) or "timed out" in text.lower() or "timeout" in type(exc).__name__.lower():
        return "timeout"
    return "error"


def release(device: torch.device) -> None:
    """Give back what a finished or failed attempt left on `device`: the frames an exception holds
    (gc), and on CUDA the caching allocator's blocks and cuBLAS's workspaces (which survive
    empty_cache), so the next attempt or a process spawned after it finds the card free."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch._C._cuda_clearCublasWorkspaces()


def worker(spec_dict: dict) -> str:
    """Entry point of every rank (under our launcher, torchrun or srun); returns this rank's status.
    With several ranks a watchdog ends a rank that makes no progress for `timeout_s` (runtime/faults.py)."""
    spec = TrialSpec.from_dict(spec_dict)
    world = spec.parallel.world_size
    cuda = spec.precision.device == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=spec.timeout_s))
    rank = dist.get_rank() if dist.is_initialized() else 0

    def expired(step: int) -> None:
        error = f"no progress for {spec.timeout_s:g} s at step {step}: a rank died or hung, or a collective stalled"
        if spec.out:
            record_files.write_record(spec.record("measured", status="timeout", error=error), spec.out)

    try:
        with faults.watchdog(spec.timeout_s, rank, expired) if world > 1 else nullcontext():
            ctx = topology.build(spec.parallel.dp, spec.parallel.mp)
            try:
                record = measure(spec, ctx, device)
            except Exception as exc:  # every rank reports; rank 0 writes
                record = spec.record("measured", status=classify(exc), error=short_error(exc))
                if record["status"] == "error":
                    traceback.print_exc()
            release(device)  # an out-of-memory attempt's blocks go back before anything else runs
            if ctx.rank == 0 and spec.out:
                record_files.write_record(record, spec.out)
            if record["status"] == "ok" and world > 1:
                topology.leave_together()  # inside the watchdog: a peer that never arrives is bounded
        return record["status"]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def under_launcher() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run_trial(spec: TrialSpec) -> dict:
    """Run one trial and return its record, which is also written to `spec.out` (if set)."""
    out = spec.out or str(Path(os.environ.get("TMPDIR", "/tmp")) / f"zerobench-{uuid.uuid4().hex}.json")
    spec = TrialSpec(**{**spec.__dict__, "out": out})
    slurm_env.join(spec.parallel.world_size)  # a task of `srun -n W`: RANK, WORLD_SIZE... from SLURM's
    if under_launcher():
        worker(spec.to_dict())
        return record_files.read_record(out) if int(os.environ["RANK"]) == 0 else {}
    Path(out).unlink(missing_ok=True)
    if spec.parallel.world_size == 1:
        worker(spec.to_dict())
    else:
        _launch(spec)
    if not Path(out).exists():  # a rank died before rank 0 could write
        record_files.write_record(
            spec.record("measured", status="error", error="a rank exited without a record; see the log"), out
        )
    return record_files.read_record(out)


def _launch(spec: TrialSpec) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=spec.parallel.world_size,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # a free port, as torchrun --standalone
        max_restarts=0,
        monitor_interval=0.1,
    )
    spec_file = Path(spec.out).with_suffix(".spec.json")
    spec_file.write_text(json.dumps(spec.to_dict()))
    try:  # each rank runs `python -m zerobench.runtime.launch SPEC`, as torchrun would start it
        elastic_launch(config, sys.executable)("-m", "zerobench.runtime.launch", str(spec_file))
    except ChildFailedError as exc:
        # Exit status 1 is a rank that reported its own failure (__main__ below); any other status
        # is a rank that died, which its peers only see as a closed connection.
        failures = exc.failures.values()
        died = [f"rank {f.local_rank} exited with status {f.exitcode}" for f in failures if f.exitcode != 1]
        if Path(spec.out).exists():  # rank 0 wrote why before the launcher stopped the ranks
            record = record_files.read_record(spec.out)
            if died and record.get("status") == "error":
                record["error"] = f"{'; '.join(died)} — {record['error']}"
                record_files.write_record(record, spec.out)
            return
        first = next(iter(exc.failures.values()))
        watchdog = any(f.exitcode == faults.WATCHDOG_EXIT for f in exc.failures.values())
        record_files.write_record(
            spec.record(
                "measured",
                status="timeout" if watchdog else "error",
                error=f"rank {first.local_rank} exited with status {first.exitcode} before a record was written",
            ),
            spec.out,
        )
    finally:
        spec_file.unlink(missing_ok=True)


if __name__ == "__main__":
    # a failed rank exits non-zero, so the launcher stops the others instead of waiting on them
    sys.exit(0 if worker(json.loads(Path(sys.argv[1]).read_text())) == "ok" else 1)
