"""The paper's codes priced as themselves (perfmodel/implementation.py PAPER_CODES): each profile's
memory is its code's formulas, term by term, and its switches are its code's overlaps; this
engine stays the default (its memory its trace: test_engine_memory.py)."""

import dataclasses

import pytest

from zerobench.engine.config import ModelConfig, ParallelConfig
from zerobench.perfmodel.constants import DEFAULT
from zerobench.perfmodel.feasibility import breakdown, engine_breakdown
from zerobench.perfmodel.hardware import PROFILES as HARDWARE
from zerobench.perfmodel.implementation import PAPER_CODES, PROFILES, Implementation, get
from zerobench.perfmodel.paper_setups import PAPER_PRECISION
from zerobench.sources import modelled

V100 = HARDWARE["v100-32gb-dgx2"]
MODEL = ModelConfig(layers=24, hidden=2048, heads=16, seq=1024, vocab=50304, name="gpt-1.3b")
FIG2_40B = dict(model="gpt-40b", gpus=384, mp=32, heads=64, micro_batch=4, stage=0, precision="fp16",
                hardware="v100-32gb-dgx2", attention="materialized", checkpoint_activations=True,
                micro_batch_policy="largest_fits")  # fmt: skip


def _mem(impl: str, stage: int = 0, dp: int = 8, mp: int = 1):
    parallel = ParallelConfig(dp=dp, mp=mp, stage=stage, checkpoint_activations=True)
    return breakdown(MODEL, parallel, PAPER_PRECISION, 4, V100, DEFAULT, "materialized", get(impl))


def test_every_paper_code_prices_its_own_memory_and_cites_its_source():
    assert set(PAPER_CODES) <= set(PROFILES)
    for name in PAPER_CODES:
        impl = get(name)
        assert impl.memory == "code" and impl.switches and "/" in impl.source, name
    assert get("efficient").memory == "engine" and get("efficient").switches == ()


def test_megatron_2019_holds_an_fp32_gradient_per_parameter_and_a_transient_flat_copy():
    psi = MODEL.num_params
    mem = _mem("megatron-lm-2019")
    assert mem.buffer_bytes == pytest.approx(4 * psi)  # fp16util.model_grads_to_master_grads: fp32 master.grad
    assert mem.reduce_transient_bytes == pytest.approx(2 * psi)  # distributed.allreduce_params' flat copy
    assert mem.model_state_bytes == pytest.approx(16 * psi)
    alone = _mem("megatron-lm-2019", dp=1)  # nothing to all-reduce: no copy
    assert alone.reduce_transient_bytes == 0
    eng = engine_breakdown(MODEL, ParallelConfig(dp=8, checkpoint_activations=True), PAPER_PRECISION, 4, V100, DEFAULT)
    assert mem.total_bytes > eng.total_bytes  # the engine keeps no fp32 gradient buffer


def test_pytorch_ddp_keeps_its_bucket_copy_resident_and_zero_os_caps_its_copy():
    psi = MODEL.num_params
    local, torch_ddp = _mem("megatron-lm-2019"), _mem("pytorch-ddp-2019")
    assert torch_ddp.buffer_bytes - local.buffer_bytes == pytest.approx(2 * psi)  # reducer.cpp bucket contents
    assert torch_ddp.reduce_transient_bytes == 0
    os_ = _mem("deepspeed-zero-os-2020", stage=1)
    assert os_.reduce_transient_bytes == pytest.approx(min(2 * psi, 2 * 500_000_000))
    assert _mem("deepspeed-zero-2020", stage=1).reduce_transient_bytes == pytest.approx(2 * psi)
    assert _mem("deepspeed-zero-2020", stage=2).reduce_transient_bytes == 0


def test_a_code_switch_overrides_the_calibration_and_a_bad_profile_is_refused():
    assert get("megatron-lm-2019").calibrated(DEFAULT).ddp_overlap is False
    assert get("pytorch-ddp-2019").calibrated(DEFAULT.replace(ddp_overlap=False)).ddp_overlap is True
    assert get("deepspeed-zero-os-2020").calibrated(DEFAULT).zero_os_stage1 is True
    with pytest.raises(ValueError, match="memory="):
        dataclasses.replace(get("efficient"), memory="traced")
    with pytest.raises(ValueError, match="grad_copy="):
        Implementation("x", False, 0, 0, (0, 0), False, "here", grad_copy="sometimes")


def test_fig2_baseline_40b_as_megatron_2019_runs_the_largest_micro_batch_its_memory_admits():
    engine = modelled.record({**FIG2_40B, "implementation": "efficient"})
    megatron = modelled.record({**FIG2_40B, "implementation": "megatron-lm-2019"})
    assert (engine["micro_batch"], megatron["micro_batch"]) == (4, 2)
    assert megatron["max_micro_batch"] == 2 and megatron["implementation"] == "megatron-lm-2019"
    over = modelled.record({**FIG2_40B, "implementation": "megatron-lm-2019", "micro_batch_policy": "listed"})
    assert over["status"] == "oom"  # the listed 4 does not fit Megatron's own memory
