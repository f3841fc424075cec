"""Per-block torch.compile (zerobench/engine/compile.py, the trial field `compile`): off on CPU
unless asked for, and a compiled model trains as the eager one does.

The parity tests compile with inductor on the CPU, generating C++ kernels: the tiny model (two
blocks of width 64) keeps that short, longest with the compiler's cache cold."""

import dataclasses

import pytest
import torch
from torch._dynamo.utils import counters

from tests.engine_cases import engine_run, rel_err, spec_for
from tests.worlds import threaded
from zerobench.engine import parallelize as composition
from zerobench.engine.compile import compiled
from zerobench.engine.config import ConfigError, TrainConfig
from zerobench.engine.model import GPT
from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms
from zerobench.engine.parallelize import parallelize
from zerobench.sweeps.sheets import trial_id
from zerobench.trial import configs


def _with_compile(spec, value: str):
    return dataclasses.replace(spec, train=dataclasses.replace(spec.train, compile=value))


def test_compile_is_off_on_cpu_unless_asked_for():
    assert TrainConfig().compile == "auto"
    assert TrainConfig().compiles("cuda") and not TrainConfig().compiles("cpu")
    assert TrainConfig(compile="on").compiles("cpu") and not TrainConfig(compile="off").compiles("cuda")
    with pytest.raises(ConfigError, match="compile="):
        TrainConfig(compile="yes")
    assert configs({"model": "tiny"})[3].compile == "auto"
    assert configs({"model": "tiny", "compile": "on"})[3].compile == "on"


def test_trial_ids_are_unchanged_at_the_default():
    trial = {"source": "measured", "model": "tiny", "dp": 2, "stage": 3}
    assert trial_id(trial) == "measured_tiny-dp2-z3"
    assert trial_id({**trial, "compile": "on"}) == "measured_tiny-dp2-z3-compile-on"


def _built(rank: int, spec, device: str) -> bool:
    ctx = topology.build(spec.parallel.dp, spec.parallel.mp)
    with torch.device("meta"):
        model = GPT(spec.model)
    return compiled(parallelize(model, ctx, spec.parallel, spec.precision, spec.train, Comms(), torch.device(device)))


def test_the_model_is_compiled_where_the_field_says(monkeypatch):
    # the composition up to its last step, the engine, which would allocate on the device (no GPU
    # here): `parallelize` returns the model it composed
    monkeypatch.setattr(composition, "apply_zero", lambda model, *args: model)
    spec = spec_for("tiny", dp=1, stage=0, compile="auto")
    assert not threaded(1, _built, spec, "cpu")[0]  # auto, on a cpu: every CPU number stays eager
    assert threaded(1, _built, _with_compile(spec, "on"), "cpu")[0]
    assert threaded(1, _built, spec, "cuda")[0]  # auto, on cuda (built on the meta device: no GPU needed)
    assert not threaded(1, _built, _with_compile(spec, "off"), "cuda")[0]


@pytest.mark.ci
@pytest.mark.parametrize("stage, dp", [(0, 1), (3, 2)])
def test_compiled_blocks_train_as_eager_ones(stage, dp):
    """Stage 3 at N_d = 2 gathers and releases each compiled block's buckets around it; with
    checkpointing, the recomputation calls the compiled compute too.

    Inductor generates and compiles C++ for each block (about 30 s a case with the compiler's cache
    cold), so it runs in CI only; the wiring of compile is tested above without a compiler."""
    spec = spec_for("tiny", dp=dp, stage=stage, micro_batch=2 // dp, steps=3, checkpoint_activations=True)
    eager = threaded(dp, engine_run, spec)[0]
    torch._dynamo.reset()
    fused = threaded(dp, engine_run, _with_compile(spec, "on"))[0]
    assert counters["stats"]["unique_graphs"] > 0  # the blocks did run compiled
    assert rel_err(fused["params"], eager["params"]) < 1e-5  # fused kernels round differently
    assert fused["losses"] == pytest.approx(eager["losses"], rel=1e-5)
    assert fused["calls"] == eager["calls"]  # the same collectives, bucket by bucket
