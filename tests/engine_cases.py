"""Training runs shared by the engine tests: the engine on one rank of a world, and the plain
single-process reference it must match (zerobench/checks/reference.py, shared with the node check)."""

from __future__ import annotations

import copy

import torch

from zerobench.checks.reference import reference_run, rel_err, whole_parameters  # noqa: F401 - the tests' import
from zerobench.engine.config import ParallelConfig, PrecisionConfig, TrainConfig, preset
from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms
from zerobench.runtime.train import build_engine, train_steps
from zerobench.trial import TrialSpec

SMALL_BUCKET = 64 * 1024  # bytes: several buckets even for the tiny models
# Byte tokens of a shipped text: a loss that falls within a few steps (uniform random tokens leave
# nothing to learn, their loss wanders about ln V), for a test that asks whether a run trains.
TEXT = "corpus_tinyshakespeare.txt"


def spec_for(
    model="tiny",
    precision="fp32",
    steps=5,
    micro_batch=2,
    grad_accum=1,
    device="cpu",
    compile="off",
    data="synthetic",
    **parallel,
) -> TrialSpec:
    """A trial of the tests; eager unless `compile` says otherwise, so that a GPU test compiles
    nothing cold (tests/gpu/test_emulated_gpu.py compiles, once). `data`: the token source
    (runtime/batches.py token_source)."""
    parallel.setdefault("bucket_bytes", SMALL_BUCKET)
    return TrialSpec(
        model=preset(model),
        parallel=ParallelConfig(**parallel),
        precision=PrecisionConfig(mode=precision, device=device),
        train=TrainConfig(steps=steps, warmup=0, micro_batch=micro_batch, grad_accum=grad_accum, compile=compile),
        data=data,
    )


def engine_run(rank: int, spec: TrialSpec, probe=None) -> dict:
    """Train `spec` on this rank; return what the tests compare. `probe(engine)`, if given, is
    called after every step and its answers are returned under "probes"."""
    ctx = topology.build(spec.parallel.dp, spec.parallel.mp)
    comms = Comms()
    engine = build_engine(spec, ctx, comms, torch.device(spec.precision.device))
    state_before = engine.model_state_bytes()
    probes = []
    on_step = (lambda step, loss: probes.append(probe(engine))) if probe else None
    losses = train_steps(engine, spec, ctx, spec.train.steps, on_step=on_step)
    layout = engine.layout
    return {
        "probes": probes,
        "params": whole_parameters(engine, ctx),
        "losses": losses,
        "volume": {k: v["volume_elements"] for k, v in comms.ledger.as_dict().items()},
        "calls": {k: v["calls"] for k, v in comms.ledger.as_dict().items()},
        "state_bytes": engine.model_state_bytes(),
        "state_bytes_before": state_before,
        "numel": layout.numel,
        "padded": layout.padded_numel,
        "shard": layout.shard_numel,
        "buckets": len(layout.buckets),
    }


def clone(spec: TrialSpec, **changes) -> TrialSpec:
    return copy.replace(spec, **changes) if hasattr(copy, "replace") else TrialSpec(**{**spec.__dict__, **changes})
