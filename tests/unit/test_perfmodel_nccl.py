"""NCCL's cost structure (perfmodel/nccl_table.py), the collective schedule counted as the engine
issues it (perfmodel/schedule.py) and the implementation profiles (perfmodel/implementation.py)."""

import pytest

from zerobench.engine.config import ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.perfmodel import implementation, nccl_table, schedule
from zerobench.perfmodel.constants import DEFAULT
from zerobench.perfmodel.predict import estimate_text, model_record, predict

US = 1e-6
GPT175 = ModelConfig(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200, name="gpt3-175b")


def test_ring_latency_is_tuning_cc_s_sum_of_steps():
    # 1536 ranks on 192 nodes of 8: 1535 steps, 191 of them across the network (tuning.cc)
    simple = nccl_table.latency("all_gather", "ring", "Simple", 8, 192)
    assert simple == pytest.approx((8.4 + 1344 * 3.4 + 191 * 14.0) * US)
    assert nccl_table.latency("all_reduce", "ring", "LL", 8, 1) == pytest.approx((3.6 + 14 * 0.47) * US)
    # it grows with ranks, and more with nodes than with ranks inside a node
    assert nccl_table.latency("all_gather", "ring", "Simple", 8, 48) < simple
    assert nccl_table.latency("all_gather", "ring", "Simple", 1, 16) > nccl_table.latency(
        "all_gather", "ring", "Simple", 16, 1
    )
    tree = nccl_table.latency("all_reduce", "tree", "LL", 8, 192)  # log2 of the nodes, not linear
    assert tree < nccl_table.latency("all_reduce", "ring", "LL", 8, 192) / 10


def test_protocol_and_algorithm_follow_the_size():
    small = nccl_table.choose("all_gather", 8, 192, simple_s=1e-6)
    large = nccl_table.choose("all_gather", 8, 192, simple_s=1.0)
    assert (small.algorithm, small.protocol) == ("ring", "LL")
    assert (large.algorithm, large.protocol) == ("ring", "Simple")
    assert nccl_table.algorithms("reduce_scatter") == ("ring",)  # no tree gather/scatter in 2.7-2.9
    big_reduce = nccl_table.choose("all_reduce", 8, 192, simple_s=1e-3)
    assert big_reduce.algorithm == "tree"
    assert nccl_table.choose("all_gather", 1, 1, 1.0).seconds == 0.0
    with pytest.raises(ValueError, match="op="):
        nccl_table.algorithms("broadcast")


def test_schedule_reads_the_stage_table():
    calls = schedule.dp_schedule(1e9, 2, 2, DEFAULT)
    assert [(c.op, c.exposed) for c in calls] == [("reduce_scatter", False), ("all_gather", True)]
    assert [c.op for c in schedule.dp_schedule(1e9, 0, 2, DEFAULT)] == ["all_reduce"]
    units = (10.0, 20.0)
    three = schedule.dp_schedule(30.0, 3, 2, DEFAULT, micro_batches=4, units=units)
    assert [c.op for c in three] == ["all_gather"] * 2 + ["all_gather"] * 2 + ["reduce_scatter"] * 2
    assert all(c.calls == 4 for c in three)  # per micro-batch: 3mΨ
    assert sum(c.nbytes * c.calls for c in three) == pytest.approx(3 * 4 * 30 * 2)


def test_deepspeed_profile_gathers_parameter_by_parameter():
    ds = implementation.get("deepspeed-0.3")
    units, kept = schedule.stage3_units(GPT175, 1, ds)
    assert len(units) == 4 * 96 + 2  # four weights a layer, wte and wpe; layernorms and biases stay whole
    assert sum(units) + kept == pytest.approx(sum(schedule.stage3_modules(GPT175)))
    eff_units, eff_kept = schedule.stage3_units(GPT175, 1, implementation.get("efficient"))
    assert len(eff_units) == 6 * 96 + 2 and eff_kept == 0
    with pytest.raises(ValueError, match="implementation="):
        implementation.get("nope")


def test_list_form_host_cost_grows_with_the_ranks():
    ds = implementation.get("deepspeed-0.3")
    assert implementation.list_form_host_s(10, 5, 1, ds, 1e-5) == 0.0
    assert implementation.list_form_host_s(10, 5, 1000, ds, 1e-5) == pytest.approx((10 * 2 + 5) * 1000 * 1e-5)
    train, prec = TrainConfig(micro_batch=1), PrecisionConfig("fp16", "cuda")

    def step(gpus, impl):
        par = ParallelConfig(dp=gpus, mp=1, stage=3, checkpoint_activations=True)
        return predict(GPT175, par, prec, train, "a100-80gb", implementation=impl).step_time_s

    # the published framework's host work adds, and more at more ranks; the engine's does not
    assert step(1536, "deepspeed-0.3") - step(1536, "efficient") > 2 * (
        step(384, "deepspeed-0.3") - step(384, "efficient")
    )


def test_record_and_estimate_name_the_profile():
    par = ParallelConfig(dp=64, mp=1, stage=3, checkpoint_activations=True)
    args = (GPT175, par, PrecisionConfig("fp16", "cuda"), TrainConfig(micro_batch=1), "a100-80gb")
    assert model_record(*args)["implementation"] == "efficient"
    assert model_record(*args, implementation="deepspeed-0.3")["implementation"] == "deepspeed-0.3"
    text = estimate_text(*args)
    assert "implementation profile: efficient" in text
