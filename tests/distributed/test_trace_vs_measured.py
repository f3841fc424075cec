"""A traced step (FakeTensorMode, fake process group) against a measured one (threaded process
group, real tensors) of the same configuration: model-state bytes and every collective of the
ledger — calls, elements, bytes, ring volume, per op and group — equal, exactly."""

import pytest
import torch

from tests.engine_cases import spec_for
from tests.worlds import threaded
from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms
from zerobench.runtime.trace import trace_step
from zerobench.runtime.train import build_engine, train_steps

LEDGER_KEYS = ("calls", "elements", "bytes", "volume_elements", "volume_bytes")


def _measured(rank, spec):
    """As `zerobench run` counts: one warm-up step, then the ledger of one step."""
    ctx = topology.build(spec.parallel.dp, spec.parallel.mp)
    comms = Comms()
    engine = build_engine(spec, ctx, comms, torch.device("cpu"))
    train_steps(engine, spec, ctx, 1)
    comms.ledger.reset()
    train_steps(engine, spec, ctx, 1, first_step=1)
    ledger = {k: {f: v[f] for f in LEDGER_KEYS} for k, v in comms.ledger.as_dict().items()}
    return engine.model_state_bytes(), ledger


CASES = [(s, dp, "bf16") for s in (0, 1, 2, 3) for dp in (2, 4)] + [(s, 2, "fp32") for s in (0, 2, 3)]


@pytest.mark.parametrize("stage, dp, precision", CASES)
def test_traced_equals_measured(stage, dp, precision):
    spec = spec_for("awkward", precision=precision, dp=dp, stage=stage, micro_batch=2, steps=1)
    traced = trace_step(spec)
    states, ledger = threaded(dp, _measured, spec)[0]
    got = traced["bytes"]
    assert {"param_bytes": got["param"], "grad_bytes": got["grad"], "optimizer_bytes": got["optimizer"]} == states
    assert {k: {f: v[f] for f in LEDGER_KEYS} for k, v in traced["ledger"].items()} == ledger
    assert ledger  # a world of 2 or 4 communicates


def test_traced_equals_measured_with_accumulation():
    """Stage 2 reduce-scatters every micro-batch: the trace runs them all."""
    spec = spec_for("tiny", precision="bf16", dp=2, stage=2, micro_batch=1, grad_accum=3, steps=1)
    traced = trace_step(spec)
    _, ledger = threaded(2, _measured, spec)[0]
    assert {k: {f: v[f] for f in LEDGER_KEYS} for k, v in traced["ledger"].items()} == ledger
    assert ledger["reduce_scatter/dp"]["calls"] == 3 * ledger["all_gather/dp"]["calls"]
