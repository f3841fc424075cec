"""One emulated rank on a GPU (runtime/emulate.py), and the one compiled GPU test. Skipped
without CUDA; run by scripts/gpu_check.sh."""

import dataclasses
import math

import pytest
import torch

from tests.engine_cases import engine_run, spec_for
from zerobench.checks.card import cuda_only_bytes
from zerobench.runtime.emulate import emulate
from zerobench.runtime.trace import trace_step

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_emulated_rank_counts_the_trace_and_the_allocator_holds_it(stage):
    """N_d 8 on one GPU: the counted tensor peak is the trace's (made with the rank's device, so in
    fp16), up to the tensors CUDA's kernels keep beyond the host's, which the trace runs
    (checks/card.py: fp32 layer-norm mean and rstd, flash attention's philox seeds); the caching
    allocator's peak holds at least those tensors; fp16 skips no step for an overflow."""
    spec = spec_for("cpu-10m", "fp16", device="cuda", dp=8, stage=stage, steps=2)
    r = emulate(spec, 3)
    assert r["status"] == "ok", r["error"]
    above = r["tensor_peak_bytes"] - trace_step(spec)["peak_bytes"]
    assert 0 <= above <= cuda_only_bytes(spec.model.layers, spec.train.micro_batch * spec.model.seq), above
    assert r["peak_reserved_bytes"] >= r["peak_allocated_bytes"] >= r["tensor_peak_bytes"]
    assert r["skipped_steps"] == 0 and all(math.isfinite(x) for x in r["losses"])


def test_a_capped_allocator_runs_out_of_memory_for_real():
    """Capped at twice what micro-batch 1 reserves, micro-batch 1 fits under the cap and 64 fails
    to allocate (a real CUDA out-of-memory error, recorded as oom)."""
    one = spec_for("cpu-100m", "bf16", device="cuda", dp=8, stage=2, steps=1, micro_batch=1)
    cap = 2 * emulate(one, 0)["peak_reserved_bytes"]
    fits = emulate(dataclasses.replace(one, mem_cap_bytes=cap), 0)
    assert fits["status"] == "ok" and fits["peak_reserved_bytes"] <= cap
    many = dataclasses.replace(one, mem_cap_bytes=cap, train=dataclasses.replace(one.train, micro_batch=64))
    r = emulate(many, 0)
    assert r["status"] == "oom" and "memory" in r["error"].lower(), r


def test_compiled_blocks_train_as_eager_on_cuda():
    """The one GPU test that compiles (every other runs eager): bf16 losses within bf16's rounding."""
    eager = engine_run(0, spec_for("cpu-10m", "bf16", device="cuda", stage=2, steps=4))["losses"]
    compiled = engine_run(0, spec_for("cpu-10m", "bf16", device="cuda", stage=2, steps=4, compile="on"))["losses"]
    assert all(abs(a - b) / abs(a) < 5e-3 for a, b in zip(eager, compiled, strict=True))
