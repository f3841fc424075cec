"""The performance model's count of this engine's peak bytes on a CPU host
(perfmodel/engine_memory.py, read from the code) against an independent count: `zerobench trace`,
which runs one step of the real engine under fake tensors and files every storage it allocates."""

from __future__ import annotations

import dataclasses

import pytest

from zerobench.config import ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.perfmodel.engine_memory import engine_peak, tensor_peak
from zerobench.perfmodel.hardware import PROFILES
from zerobench.trace import trace_step
from zerobench.trial import TrialSpec

# wide enough that the loss's logits and the tied embedding count, as in the cpu-10m trials
MODEL = ModelConfig(layers=3, hidden=128, heads=4, seq=64, vocab=4096, name="mem-check")


@pytest.mark.parametrize(
    "micro_batch, parallel",
    [
        (1, dict(dp=1)),  # the tied embedding's gradients are the peak
        (4, dict(dp=1)),  # the activations and the loss's buffers are
        (2, dict(dp=2, stage=1)),
        (2, dict(dp=2, stage=2)),
        (2, dict(dp=2, stage=3)),
        (2, dict(mp=2)),
        (2, dict(dp=2, stage=2, checkpoint_activations=True)),
    ],
)
def test_engine_peak_matches_the_traced_peak(micro_batch, parallel):
    spec = TrialSpec(model=MODEL, parallel=ParallelConfig(**parallel), precision=PrecisionConfig("fp32", "cpu"),
                     train=TrainConfig(micro_batch=micro_batch))  # fmt: skip
    traced = trace_step(spec)["peak_bytes"]
    modelled = tensor_peak(engine_peak(MODEL, spec.parallel, spec.precision, micro_batch, PROFILES["v100-32gb-dgx2"]))
    assert modelled == pytest.approx(traced, rel=0.05)


def test_runtime_bytes_are_added_once():
    hw = dataclasses.replace(PROFILES["v100-32gb-dgx2"], runtime_bytes=20 * 2**20)
    peak = engine_peak(MODEL, ParallelConfig(), PrecisionConfig("fp32", "cpu"), 1, hw)
    assert peak["runtime"] == 20 * 2**20 and tensor_peak(peak) == tensor_peak({**peak, "runtime": 0.0})
