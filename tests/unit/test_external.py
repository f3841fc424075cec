"""External validation (fitting/external.py, zerobench/data/external_runs.csv) and the per-GPU
constants: measured GEMM efficiency, the rest fitted on the GPU's own runs (docs/perfmodel.md)."""

from __future__ import annotations

import pytest

from zerobench.engine.config import ModelConfig, ParallelConfig, PrecisionConfig
from zerobench.fitting.external import CODE, load, summary, validate
from zerobench.fitting.fit import HARDWARE_KNOBS, fit_hardware
from zerobench.perfmodel.constants import DEFAULT, GEMM_EFF_MEASURED
from zerobench.perfmodel.feasibility import breakdown, logits_bytes
from zerobench.perfmodel.hardware import get_profile


def test_three_independent_sources_with_a100_or_newer_and_a_split_per_source():
    df = load()  # fit and validation rows (the holdout: test_holdout.py)
    assert df.source.nunique() >= 3 and len(df) >= 20
    assert set(df.hardware) <= {"a100-80gb", "h100-80gb", "h200-141gb"}
    for source, rows in df.groupby("source"):  # every source has rows on both sides of the split
        assert set(rows.split) == {"fit", "validation"}, source
        assert rows.citation.str.contains("commit").all(), source  # a pinned revision in every citation


def test_nemo_megatron_rows_are_the_readme_tables_per_gpu():
    rows = load().query("source == 'nemo-megatron'")
    # 1-node throughputs of the two README tables (39543 and 40345 tokens/s on 8 GPUs)
    assert sorted(rows[rows.gpus == 8].value) == pytest.approx([39543 / 8, 40345 / 8], abs=1e-3)
    global_batch = rows.micro_batch * rows.grad_accum * rows.gpus / rows.mp
    assert set(global_batch) == {1440, 2048}  # the 5b.yaml of each commit
    assert (rows.split == "fit").sum() == 5  # every third row of the source


def test_gemm_efficiency_is_the_microbenchmark_and_not_fitted():
    assert GEMM_EFF_MEASURED["a100-80gb"] == pytest.approx(0.869, abs=1e-3)  # 271.2 / 312 TFLOPS
    assert GEMM_EFF_MEASURED["h100-80gb"] == pytest.approx(0.803, abs=1e-3)  # 794.5 / 989 TFLOPS
    for name, eff in GEMM_EFF_MEASURED.items():
        assert DEFAULT.for_hardware(name).gemm_eff_max == eff
    assert "gemm_eff_max" not in HARDWARE_KNOBS
    fitted = fit_hardware("h100-80gb", iters=2)
    assert fitted["gemm_eff_max"] == GEMM_EFF_MEASURED["h100-80gb"]


def test_per_hardware_is_the_fixed_point_of_its_fit():
    fitted = fit_hardware("a100-80gb")
    for knob in HARDWARE_KNOBS:
        assert DEFAULT.per_hardware["a100-80gb"][knob] == pytest.approx(fitted[knob], rel=2e-3), knob


def test_validation_mape_per_source_meets_the_target():
    table = summary(validate())
    val = table[table.split == "validation"]
    assert (val.mape_pct <= 15.0).all()  # the target, per source and over all (7.9 % when written)
    assert val.points.iloc[-1] == val.points.iloc[:-1].sum()


def test_each_source_runs_with_its_codes_memory_behaviour():
    """FSDP keeps 16 B per parameter (fp32 flat params, grads, Adam) and gathered units, no DeepSpeed
    fp32 gradient copy; the fused cross-entropy holds 16-bit logits and gradient; NeMo O2 has no 16-bit
    gradients and no flattened copy (docs/perfmodel.md "External validation")."""
    mpt = ModelConfig(layers=48, hidden=7168, heads=56, seq=2048, vocab=50368)
    fsdp_cal = DEFAULT.replace(**CODE["llm-foundry"])
    par = ParallelConfig(dp=8, mp=1, stage=3, checkpoint_activations=True)
    m = breakdown(mpt, par, PrecisionConfig("bf16", "cuda"), 1, get_profile("a100-80gb"), fsdp_cal, "fused")
    assert m.model_state_bytes == pytest.approx(16 * mpt.num_params / 8)
    assert m.buffer_bytes == pytest.approx((3 * 12 * 7168**2 + 2 * 50368 * 7168) * 2)
    assert logits_bytes(mpt, 1, 1, 2, fused=True) == 2048 * 50368 * 4  # bf16 logits + bf16 gradient
    assert logits_bytes(mpt, 1, 1, 2, fused=False) == 2048 * 50368 * 6  # + Megatron's fp32 softmax
    gpt = ModelConfig(layers=24, hidden=4096, heads=32, seq=2048, vocab=50432)
    tp2 = ParallelConfig(dp=4, mp=2, stage=0)
    o2 = breakdown(gpt, tp2, PrecisionConfig("bf16", "cuda"), 2, get_profile("a100-80gb"),
                   DEFAULT.replace(**CODE["nemo-megatron"]))  # fmt: skip
    assert o2.grad_bytes == 0 and o2.reduce_transient_bytes == 0
    assert o2.model_state_bytes + o2.buffer_bytes == pytest.approx(18 * gpt.num_params / 2)  # 2 + 4 + 8 + 4


def test_runs_that_trained_mostly_fit():
    rows = validate()
    assert (~rows.model_fits).sum() <= 6  # 24 of 77 before the codes' memory behaviour (docs/perfmodel.md)
    assert rows[rows.source == "nemo-megatron"].model_fits.all()
