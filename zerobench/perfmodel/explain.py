"""One step's data-parallel collectives, call by call, as the model prices them: the worked example
of docs/perfmodel.md. Each group of equal calls (operation, message) with NCCL's algorithm and
protocol for it (nccl_table.py), its latency and bandwidth seconds, then the host's list-form work
(implementation.py) and the step's totals.

`python -m zerobench.perfmodel.explain` prints GPT-3 175B on 1536 A100s (micro-batch 1, stage 3) under
both implementation profiles.
"""

from __future__ import annotations

import sys
from collections import Counter

from zerobench.engine.config import ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.perfmodel import implementation, network, schedule
from zerobench.perfmodel.constants import DEFAULT
from zerobench.perfmodel.hardware import get_profile
from zerobench.perfmodel.host_cost import HOST_OP_S
from zerobench.perfmodel.predict import predict

ADDED, HIDDEN = "added to the step (a synchronize per gather)", "hidden while under the compute"
GPT3_175B = ModelConfig(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200, name="gpt3-175b")


def calls_table(
    model: ModelConfig,
    parallel: ParallelConfig,
    hardware: str,
    impl_name: str,
    micro_batches: int = 1,
    storage_bytes: int = 2,
) -> str:
    """Markdown: one row per group of equal DP calls of a step, with NCCL's pick and its seconds."""
    hw, impl, mp = get_profile(hardware), implementation.get(impl_name), parallel.mp
    cal = DEFAULT.for_hardware(hw.name)
    units, kept = schedule.stage3_units(model, mp, impl)
    plan = schedule.dp_schedule(model.num_params / mp, parallel.stage, storage_bytes, cal, micro_batches, units,
                                   kept, impl.reduce_bucket_elems)  # fmt: skip
    group = network.ring(parallel.dp, mp, hw, cal)
    counts = Counter()
    for c in plan:
        counts[(c.op, round(c.nbytes))] += c.calls
    lines = [f"DP group: {group.size} ranks, {group.per_node} per node on {group.nodes} nodes ({impl.name})",
             "| op | message (MB) | calls | algorithm / protocol | latency (ms) | bandwidth (ms) | seconds |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    total = 0.0
    for (op, nbytes), n in sorted(counts.items(), key=lambda kv: -kv[0][1] * kv[1]):
        pick = group.choice(op, nbytes)
        total += n * pick.seconds
        ms = f"{pick.latency_s * 1e3:.3g} | {pick.bandwidth_s * 1e3:.3g}"
        lines.append(
            f"| {op} | {nbytes / 1e6:.3g} | {n} | {pick.algorithm} / {pick.protocol} | {ms} | {n * pick.seconds:.3g} |"
        )
    gathers = sum(c.calls for c in plan if c.op == "all_gather")
    reductions = sum(c.calls for c in plan if c.op == "reduce_scatter")
    host = implementation.list_form_host_s(gathers, reductions, parallel.dp, impl, HOST_OP_S)
    lines.append(
        f"\nCollectives {total:.3g} s; list-form host work {host:.3g} s ({impl.ops_per_rank} ops per rank "
        f"per gather / reduce-scatter × {parallel.dp} ranks × {HOST_OP_S * 1e6:.3g} µs), "
        f"{ADDED if impl.sync_per_gather else HIDDEN}."
    )
    train = TrainConfig(micro_batch=1, grad_accum=micro_batches)
    pred = predict(model, parallel, PrecisionConfig("fp16", "cuda"), train, hardware, implementation=impl_name)
    lines.append(
        f"Step {pred.step_time_s:.3g} s: compute {pred.compute_s:.3g}, DP {pred.dp_comm_s:.3g}, "
        f"overhead {pred.overhead_s:.3g}; {pred.tflops_per_gpu:.3g} TFLOPS per GPU (modelled)."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    gpus = int(sys.argv[1]) if len(sys.argv) > 1 else 1536
    layout = ParallelConfig(dp=gpus, mp=1, stage=3, checkpoint_activations=True)
    for name in implementation.PROFILES:
        print(calls_table(GPT3_175B, layout, "a100-80gb", name), end="\n\n")
