"""The node check: ZeRO-DP on one node of N GPUs over NCCL, run by scripts/gpu_node_check.sh
(docs/gpu.md, "A node of N GPUs"); on a CPU the same code runs gloo ranks (its parity and ledger
gates, in the test suite). Every failed gate makes the exit status 1.

Gates:
- parity: stages 0–3 at dp N, and at dp N/2 × mp 2 where N ≥ 4, against the single-process
  reference on the same global batch (checks/reference.py, paper §5: ZeRO-DP trains as DP does):
  every step's loss and the final parameters within fp32's tolerance (TF32 off on a GPU);
- ledger: one step's DP collectives move exactly the paper's volume, 2Ψ(N_d−1)/N_d elements per
  rank at stages 0–2 and 3Ψ(N_d−1)/N_d at stage 3 (§7, zerobench/stages.py), in bytes, Ψ the
  rank's padded parameter count; nothing else crosses the DP group but the step's scalars;
- memory (GPU): at every speed trial whose trace fits this node's card (the others are skipped and
  said why, checks/card.py), each rank's peak allocated is at most the trace of the same trial
  (runtime/trace.py, written by `trace` before the ranks start) plus the allocator's slack.
  The device memory outside the caching allocator that the ranks' runs added (NCCL's own buffers,
  mem_get_info less the allocator's reserved) is reported beside perfmodel/engine_memory.py's
  allowance per communicator, not gated: the allowance is not a measurement.
Reported beside them: step time and TFLOPS per GPU of gpt-1.5b and dp-6b at each stage at dp N,
and the ledger's seconds in DP collectives per step beside the model's prediction on this node's
profile (its NVLink / NVSwitch links); `OUT/node_check.json`, `OUT/speed.csv`.

    python -m zerobench.checks.node_check trace OUT --gpus N          # no process group: before torchrun
    torchrun --nproc-per-node N -m zerobench.checks.node_check run OUT [--device cpu] [--gates parity,ledger]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from zerobench import record_files
from zerobench.checks.card import Card, bound_bytes, misfit
from zerobench.checks.reference import reference_run, rel_err, whole_parameters
from zerobench.engine.config import ParallelConfig, PrecisionConfig, TrainConfig, preset
from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms
from zerobench.perfmodel import model_record
from zerobench.perfmodel.engine_memory import NCCL_COMMUNICATOR_BYTES
from zerobench.perfmodel.kernels import ENGINE_ATTENTION
from zerobench.runtime.launch import classify
from zerobench.runtime.train import build_engine, measure, train_steps
from zerobench.stages import ring_volume, rule
from zerobench.trial import TrialSpec, configs, short_error

GATES = ("parity", "ledger", "memory")
RTOL = 1e-5  # fp32 against the reference: the distributed tests' tolerance (a reordered sum, ~1e-7 a step)
SCALARS = 2  # elements per call of the step's other DP collectives: the gradient norm, the overflow flag
SPEED_MODELS = ("gpt-1.5b", "dp-6b")


def layouts(n: int) -> list[tuple[int, int]]:
    """(dp, mp) layouts the parity gate runs on n ranks."""
    return [(n, 1)] + ([(n // 2, 2)] if n >= 4 and n % 2 == 0 else [])


def parity_spec(dp: int, mp: int, stage: int, device: str) -> TrialSpec:
    """A small model over several buckets (64 KiB), fp32, the global batch 2·dp sequences."""
    parallel = ParallelConfig(dp=dp, mp=mp, stage=stage, bucket_bytes=64 * 1024)
    return TrialSpec(
        model=preset("tiny"),
        parallel=parallel,
        precision=PrecisionConfig(mode="fp32", device=device),
        train=TrainConfig(steps=3, warmup=0, micro_batch=2),
    )


def speed_values(model: str, stage: int, n: int) -> dict:
    """A speed trial's fields (trial/fields.py): bf16, activation checkpointing, micro-batch 4;
    eager, as the trace runs it (a compiled block keeps other tensors than the traced one)."""
    return {
        "model": model,
        "stage": stage,
        "dp": n,
        "micro_batch": 4,
        "precision": "bf16",
        "device": "cuda",
        "checkpoint_activations": True,
        "compile": "off",
        "steps": 3,
        "warmup": 1,
    }


def speed_spec(values: dict) -> TrialSpec:
    model, parallel, precision, train = configs({**values, "command": "run"})
    return TrialSpec(model=model, parallel=parallel, precision=precision, train=train)


def ledger_failures(ledger: dict, stage: int, padded: int, dp: int, elem_bytes: int, steps: int) -> list[str]:
    """How the DP entries of `ledger` (Ledger.as_dict) over `steps` steps differ from the paper's
    volume at `stage` (§7): per op, its ring units × Ψ(N_d − 1)/N_d elements per step, in bytes;
    any other DP op at most SCALARS elements a call. Empty when they agree."""
    expected = Counter()
    for op in rule(stage).collectives:
        expected[op] += ring_volume(op, dp) * padded
    out = []
    for key, e in ledger.items():
        op, group = key.split("/")
        if group != "dp":
            continue
        if op in expected:
            want = expected.pop(op) * elem_bytes * steps
            if e["volume_bytes"] != want:
                out.append(f"stage {stage} {key}: {e['volume_bytes']:.0f} bytes moved, the formula {want:.0f}")
        elif e["elements"] > SCALARS * e["calls"]:
            out.append(f"stage {stage} {key}: {e['elements']} elements in {e['calls']} calls, not the step's scalars")
    out += [f"stage {stage} {op}/dp: none issued, the formula {v * steps:.0f} elements" for op, v in expected.items()]
    return out


def _worst(values: list[float], group, device: torch.device) -> list[float]:
    """Each value's largest over the ranks of `group` (its own ledger: the engine's stays clean)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    Comms().all_reduce(t, group, op=dist.ReduceOp.MAX)
    return t.tolist()


def parity(ctx, spec: TrialSpec, device: torch.device) -> dict:
    """Train `spec` on this rank and on the single-process reference; the worst loss and parameter
    errors over the ranks, and the ledger's differences from the formula (gated if `ledger`)."""
    comms = Comms()
    engine = build_engine(spec, ctx, comms, device)
    losses = torch.tensor(train_steps(engine, spec, ctx, spec.train.steps), dtype=torch.float64, device=device)
    Comms().all_reduce(losses, ctx.dp)  # each rank's micro-batch mean -> the global batch's
    losses = (losses / ctx.dp.size).tolist()
    ref = reference_run(spec)
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref["losses"]))
    param_err = rel_err(whole_parameters(engine, ctx), ref["params"])
    elem = spec.precision.bytes_pgk[1]
    failures = ledger_failures(comms.ledger.as_dict(), spec.parallel.stage, engine.layout.padded_numel,
                               ctx.dp.size, elem, spec.train.steps)  # fmt: skip
    loss_err, param_err, failed = _worst([loss_err, param_err, float(len(failures))], ctx.world, device)
    p = spec.parallel
    if failed != len(failures):
        failures.append("(another rank's ledger differs)")
    return {
        "dp": p.dp,
        "mp": p.mp,
        "stage": p.stage,
        "loss_rel_err": loss_err,
        "param_rel_err": param_err,
        "ledger_failures": failures,
    }


def outside_allocator_bytes() -> int:
    """This GPU's memory in use that PyTorch's caching allocator does not hold: the CUDA context,
    and NCCL's buffers once its communicators exist."""
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def speed(ctx, values: dict, traced: Path, n: int, device: torch.device, card: Card | None = None) -> dict:
    """One speed trial measured (runtime/train.py's `measure`: the record `zerobench run` writes)
    beside the model on this node's profile and the trace of the same trial; not run (`skipped`,
    saying why) where that trace does not fit `card` (checks/card.py). Any rank error is the row's
    status (`classify`), so the node's JSON keeps every other row."""
    spec = speed_spec(values)
    path = traced / f"{values['model']}-s{values['stage']}.json"
    trace = record_files.read_record(path) if path.exists() else {}
    why = misfit(trace, card, spec.parallel.dp, spec.parallel.mp) if card is not None else None
    if why:
        return {**values, "status": "skipped", "error": why, "traced_peak_bytes": trace.get("peak_allocated_bytes")}
    gc.collect()
    torch.cuda.empty_cache()  # the last trial's blocks: each trial's peak is its own
    try:
        rec = measure(spec, ctx, device)
    except Exception as exc:
        rec = {"status": classify(exc), "error": short_error(exc)}
    row = {**values, **{k: rec.get(k) for k in ("status", "error", "step_time_s", "tflops_per_gpu",
                                                 "peak_allocated_bytes")}}  # fmt: skip
    comm = rec.get("comm") or {}
    row["dp_comm_s"] = sum(v["seconds"] for k, v in comm.items() if k.endswith("/dp")) / spec.train.steps
    hw = rec.get("hardware")
    if hw and rec["status"] == "ok":
        pred = model_record(
            spec.model, spec.parallel, spec.precision, spec.train, hw, gpus_per_node=n, attention=ENGINE_ATTENTION
        )
        row["hardware"] = hw
        row.update({f"predicted_{k}": pred.get(k) for k in ("step_time_s", "tflops_per_gpu", "dp_comm_s")})
    row["traced_peak_bytes"] = trace.get("peak_allocated_bytes")
    return row


def memory_failures(rows: list[dict]) -> list[str]:
    """The memory gate's failures over the speed trials' rows: a trial that fits its card by the
    trace and did not run ok, or peaked above its trace and the slack. NCCL's bytes are reported
    beside their allowance, not gated: the allowance is an assumption, not a measurement."""
    out = []
    for r in rows:
        if r["status"] == "skipped":
            continue
        name, peak, bound = f"{r['model']} stage {r['stage']}", r["peak_allocated_bytes"], r["traced_peak_bytes"]
        if r["status"] != "ok" or bound is None:
            out.append(f"{name}: {r['status']}, traced {bound}" + (f" ({r['error']})" if r.get("error") else ""))
        elif peak > bound_bytes(bound):
            out.append(f"{name}: peak {peak / 2**30:.2f} GiB over the trace's {bound / 2**30:.2f} GiB and the slack")
    return out


def communicators(ctxs) -> list:
    """The distinct process groups of more than one rank in these contexts: NCCL's communicators."""
    return list({id(g.pg): g for c in ctxs for g in (c.dp, c.mp, c.world) if g.pg is not None}.values())


def run(out: Path, device: str, gates: tuple[str, ...]) -> int:
    """Every rank (under torchrun): the gates and the speed trials; rank 0 writes; returns the exit status."""
    cuda = device == "cuda"
    n, local = int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # parity needs true fp32
        torch.zeros(1, device=dev)  # the CUDA context, before any communicator
        before = outside_allocator_bytes()
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=300))
    ctxs = {lay: topology.build(*lay) for lay in layouts(n)}
    groups = communicators(ctxs.values())
    for g in groups:  # each communicator made now, by a one-element call, so its bytes can be read apart
        Comms().all_reduce(torch.zeros(1, device=dev), g)
    nccl = {"communicators": len(groups), "allowance_bytes": len(groups) * NCCL_COMMUNICATOR_BYTES}
    if cuda:
        torch.cuda.synchronize()
        nccl["at_creation_bytes"] = outside_allocator_bytes() - before
    rows = [parity(ctxs[lay], parity_spec(*lay, s, device), dev) for lay in layouts(n) for s in range(4)]
    failed = {
        "parity": [
            f"dp {r['dp']} mp {r['mp']} stage {r['stage']}: loss {r['loss_rel_err']:.2g}, "
            f"parameters {r['param_rel_err']:.2g} relative"
            for r in rows
            if max(r["loss_rel_err"], r["param_rel_err"]) >= RTOL
        ],
        "ledger": [f for r in rows for f in r["ledger_failures"]],
    }
    speed_rows, base = [], ctxs[(n, 1)]
    if cuda:
        trials = [speed_values(m, s, n) for m in SPEED_MODELS for s in range(4)]
        card = Card.of_device(local)
        speed_rows = [speed(base, values, out / "traced", n, dev, card) for values in trials]
        # what the runs added outside the allocator: NCCL's buffers, which it connects lazily per
        # algorithm, and the CUDA modules loaded at first use (an upper bound on NCCL's), reported
        # beside the allowance it is not yet measured against
        nccl["after_runs_bytes"] = _worst([float(outside_allocator_bytes() - before)], base.world, dev)[0]
        nccl["seen_over_allowance"] = nccl["after_runs_bytes"] / nccl["allowance_bytes"] if groups else None
        failed["memory"] = memory_failures(speed_rows)
    verdicts = verdict(failed, gates, device)
    if dist.get_rank() == 0:
        _write(out, device, n, verdicts, rows, speed_rows, nccl)
    topology.leave_together()
    return 0 if all(v["ok"] for v in verdicts.values()) else 1


def verdict(failed: dict[str, list[str]], gates: tuple[str, ...], device: str) -> dict:
    """Per asked gate, ok and its failures; a gate asked of a device that cannot run it fails."""
    return {
        g: {"ok": not failed[g], "failures": failed[g]}
        if g in failed
        else {"ok": False, "failures": [f"not run on {device}"]}
        for g in gates
    }


def _write(out: Path, device: str, n: int, verdict: dict, rows: list, speed_rows: list, nccl: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "device": device,
        "ranks": n,
        "torch": torch.__version__,
        "gates": verdict,
        "parity": rows,
        "speed": speed_rows,
        "nccl": nccl,
    }
    (out / "node_check.json").write_text(json.dumps(doc, indent=1) + "\n")
    if speed_rows:
        import pandas as pd  # pandas only where there are speed rows to write (a GPU node)

        pd.DataFrame(speed_rows).to_csv(out / "speed.csv", index=False)
    for gate, v in verdict.items():
        print(f"node_check: {gate}: {'ok' if v['ok'] else 'FAILED'}", *v["failures"], sep="\n  ", flush=True)


def trace(out: Path, n: int) -> None:
    """The trace of every speed trial (no process group may exist in this process)."""
    from zerobench.runtime.trace import trace_record  # torch._dynamo's import (~6 s): the ranks need none

    (out / "traced").mkdir(parents=True, exist_ok=True)
    for model in SPEED_MODELS:
        for stage in range(4):
            rec = trace_record(speed_spec(speed_values(model, stage, n)))
            record_files.write_record(rec, out / "traced" / f"{model}-s{stage}.json")
            print(f"node_check: traced {model} stage {stage}: {rec['status']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zerobench.checks.node_check", description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("trace", "run"))
    p.add_argument("out", type=Path, help="this node's folder, OUT/<device>-x<N>")
    p.add_argument("--gpus", type=int, help="trace: the ranks the run will have")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--gates", default=",".join(GATES), help=f"comma-separated, of {', '.join(GATES)}")
    args = p.parse_args(argv)
    gates = tuple(g for g in args.gates.split(",") if g)
    if unknown := set(gates) - set(GATES):
        p.error(f"--gates: {sorted(unknown)} not among {GATES}")
    if args.command == "trace":
        if not args.gpus:
            p.error("trace needs --gpus")
        trace(args.out, args.gpus)
        return 0
    if "WORLD_SIZE" not in os.environ:
        p.error("run is one rank of a world: start it under torchrun (scripts/gpu_node_check.sh)")
    return run(args.out, args.device, gates)


if __name__ == "__main__":
    sys.exit(main())
