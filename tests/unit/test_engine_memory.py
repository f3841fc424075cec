"""The performance model's count of this engine's peak bytes on a CPU host and on a GPU
(perfmodel/engine_memory.py, read from the code) against an independent count: `zerobench trace`,
which runs one step of the real engine under fake tensors and files every storage it allocates
(on a GPU in the compute dtype, bf16: traced with the precision's device "cuda", no GPU needed)."""

from __future__ import annotations

import dataclasses

import pytest

from zerobench.engine.config import ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.perfmodel.engine_memory import engine_peak, tensor_peak
from zerobench.perfmodel.hardware import PROFILES
from zerobench.runtime.trace import trace_step
from zerobench.trial import TrialSpec

# wide enough that the loss's logits and the tied embedding count, as in the cpu-10m trials
MODEL = ModelConfig(layers=3, hidden=128, heads=4, seq=64, vocab=4096, name="mem-check")
CPU_HOST = dataclasses.replace(PROFILES["v100-32gb-dgx2"], ranks_share_compute=True)  # computes in fp32
GPU = PROFILES["h200-141gb"]


@pytest.mark.parametrize(
    "precision, micro_batch, parallel",
    [
        ("fp32", 1, dict(dp=1)),  # the tied embedding's gradients are the peak
        ("fp32", 4, dict(dp=1)),  # the activations and the loss's buffers are
        ("fp32", 2, dict(dp=2, stage=1)),
        ("fp32", 2, dict(dp=2, stage=2)),
        ("fp32", 2, dict(dp=2, stage=3)),
        ("fp32", 2, dict(mp=2)),
        ("fp32", 8, dict(mp=2)),  # the vocab-parallel loss's two buffers (3 would read 16 % high)
        ("fp32", 2, dict(dp=2, stage=2, checkpoint_activations=True)),
        ("fp32", 2, dict(dp=2, stage=0, checkpoint_activations=True)),  # the loss's buffers, not a block
        ("bf16", 2, dict(dp=2, stage=1)),  # the weights' fp32 casts are saved
        ("bf16", 2, dict(dp=2, stage=3)),  # ... and not at stage 3
    ],
)
def test_engine_peak_matches_the_traced_peak(precision, micro_batch, parallel):
    spec = TrialSpec(model=MODEL, parallel=ParallelConfig(**parallel), precision=PrecisionConfig(precision, "cpu"),
                     train=TrainConfig(micro_batch=micro_batch))  # fmt: skip
    traced = trace_step(spec)["peak_bytes"]
    peak = engine_peak(MODEL, spec.parallel, spec.precision, micro_batch, CPU_HOST)
    # the trace's one step records stage 3's gather order in its first micro-batch: nothing prefetched
    modelled = tensor_peak({**peak, "prefetch": 0.0})
    assert modelled == pytest.approx(traced, rel=0.06)


def test_stage3_counts_its_prefetch_up_to_the_whole_model():
    fp32, hw = PrecisionConfig("fp32", "cpu"), CPU_HOST
    whole = MODEL.num_params * 4
    for prefetch_bytes, expected in ((2**30, whole), (2**20, 2**20)):
        parallel = ParallelConfig(dp=2, stage=3, prefetch_bytes=prefetch_bytes)
        peak = engine_peak(MODEL, parallel, fp32, 4, hw)
        assert peak["prefetch"] == expected
        assert tensor_peak(peak) - tensor_peak({**peak, "prefetch": 0.0}) == pytest.approx(expected)
    assert engine_peak(MODEL, ParallelConfig(dp=2, stage=2), fp32, 4, hw)["prefetch"] == 0.0


def test_runtime_bytes_are_added_once():
    hw = dataclasses.replace(CPU_HOST, runtime_bytes=20 * 2**20, checkpoint_runtime_bytes=30 * 2**20)
    peak = engine_peak(MODEL, ParallelConfig(), PrecisionConfig("fp32", "cpu"), 1, hw)
    assert peak["runtime"] == 20 * 2**20 and tensor_peak(peak) == tensor_peak({**peak, "runtime": 0.0})
    # checkpointing's own runtime (reentrant backward) only where it is switched on
    ckpt = engine_peak(MODEL, ParallelConfig(checkpoint_activations=True), PrecisionConfig("fp32", "cpu"), 1, hw)
    assert ckpt["runtime"] == 50 * 2**20


@pytest.mark.parametrize(
    "micro_batch, parallel",
    [
        (1, dict(dp=1)),  # the step's one fp32 piece or the embedding's gradients
        (4, dict(dp=1, checkpoint_activations=True)),
        (2, dict(dp=2, stage=1)),  # no fp32 weight casts: a GPU computes in the storage dtype
        (2, dict(dp=2, stage=2)),
        (2, dict(dp=1, stage=3, checkpoint_activations=True)),
    ],
)
def test_engine_peak_on_a_gpu_matches_the_traced_peak(micro_batch, parallel):
    spec = TrialSpec(model=MODEL, parallel=ParallelConfig(**parallel), precision=PrecisionConfig("bf16", "cuda"),
                     train=TrainConfig(micro_batch=micro_batch))  # fmt: skip
    traced = trace_step(spec)["peak_bytes"]
    peak = engine_peak(MODEL, spec.parallel, spec.precision, micro_batch, GPU)
    assert tensor_peak({**peak, "prefetch": 0.0}) == pytest.approx(traced, rel=0.06)


def test_16bit_gradients_are_stepped_one_fp32_piece_at_a_time():
    gpt = ModelConfig(layers=4, hidden=512, heads=8, seq=128, vocab=8192, name="step-check")
    bf16, fp32 = PrecisionConfig("bf16", "cuda"), PrecisionConfig("fp32", "cuda")
    for stage, dp in ((0, 1), (2, 4)):
        parallel = ParallelConfig(dp=dp, stage=stage, bucket_bytes=2**20)
        piece = max(2**20 / 2, gpt.largest_param_numel) / (dp if stage else 1)
        assert engine_peak(gpt, parallel, bf16, 1, GPU)["step"] == 4 * piece  # the embedding, whole or sharded
        assert engine_peak(gpt, parallel, fp32, 1, GPU)["step"] == 0.0  # fp32 gradients are read in place
