"""The traced step (zerobench/runtime/trace.py) and Table 1 from three routes (zerobench/artifacts/tables/table1.py)."""

from decimal import Decimal

import pytest
import torch
import torch.distributed as dist

from tests.engine_cases import spec_for
from zerobench import memory
from zerobench.artifacts.tables.table1 import MODELS, printed, table1, traced_cells
from zerobench.checks.table1_trace import traced_state_bytes
from zerobench.engine.config import ParallelConfig, PrecisionConfig
from zerobench.engine.model import GPT
from zerobench.perfmodel.engine_memory import engine_peak, tensor_peak
from zerobench.perfmodel.hardware import PROFILES
from zerobench.runtime.counter import StorageCounter
from zerobench.runtime.trace import fake_world, trace_record, trace_states, trace_step
from zerobench.trial import TrialSpec, configs


def test_counter_files_bytes_by_category_and_keeps_the_peak():
    with StorageCounter() as c:
        c.phase = "activation"
        a = torch.empty(1000)  # 4000 bytes
        c.tag([a], "param")
        view = a[10:20]  # no new storage
        c.phase = "temporary"
        b = torch.empty(250, dtype=torch.float64)  # 2000 bytes
        assert c.bytes["param"] == 4000 and c.bytes["temporary"] == 2000 and c.total == 6000
        del b
        assert c.bytes["temporary"] == 0 and c.peak == 6000
        assert c.peak_bytes["temporary"] == 2000
        del view
    assert c.bytes["param"] == 4000  # `a` is alive


def test_counter_keeps_the_host_apart_from_the_device():
    with StorageCounter() as c:
        c.phase = "activation"
        a = torch.empty(1000)  # 4000 bytes on the device
        with c.booking("host"):
            h = torch.empty(500)  # 2000 bytes the engine allocates for the host
        assert c.bytes["activation"] == 4000 and c.total == 4000 and c.host_peak == 2000
        assert c.peak == 4000 and "host" not in c.peak_bytes
        b = torch.empty(10)  # the booking ended: the device's again
        assert c.total == 4040
        del h
        assert c.bytes["host"] == 0 and c.host_peak == 2000
    del a, b
    with StorageCounter(device_type="cuda") as c:  # a storage on another device than the counter's is the host's
        c.phase = "activation"
        h = torch.empty(100)
        assert c.total == 0 and c.bytes["host"] == h.nbytes == 400


@pytest.mark.parametrize("layers", [3, 8])
def test_offloaded_checkpoints_leave_the_device(layers):
    """The paper's 100B shape (Fig 6: MP 16, micro-batch 32) on a GPU's semantics, fewer layers:
    C5 (P_a+cpu) holds on the device what C4 (P_a) holds less the checkpoints it moved to the host,
    one per layer of b·s·h·2 / N_m bytes, all but the one chunk staged back for the recomputation."""
    traced = {}
    for zc in ("C4", "C5"):
        values = dict(model="gpt-100b", layers=layers, dp=25, mp=16, zero_config=zc, micro_batch=32, device="cuda")
        traced[zc] = trace_step(TrialSpec(*configs({**values, "checkpoint_activations": True, "command": "trace"})))
    chunk = 32 * 1024 * 8192 * 2 // 16
    assert traced["C4"]["host_peak_bytes"] == 0 and traced["C5"]["host_peak_bytes"] == layers * chunk
    assert traced["C4"]["peak_bytes"] - traced["C5"]["peak_bytes"] == (layers - 1) * chunk


def test_offloaded_checkpoints_leave_the_device_at_mp_1():
    """P_a+cpu at MP 1 (DeepSpeed's CPU checkpointing without MP), stage 3 on a GPU's semantics:
    every block's whole input on the host (b·s·h·2 bytes), and the device's peak below the same
    layout's without offload by the checkpoints it moved, one more with each layer, as the
    model (engine_memory.py) has it."""
    shape = dict(model="gpt-100b", hidden=1024, heads=16, seq=512, vocab=512, dp=64, mp=1, stage=3, micro_batch=8)
    chunk = 8 * 512 * 1024 * 2
    below, modelled = {}, {}
    for layers in (2, 4):
        peaks = {}
        for offload in (False, True):
            values = {**shape, "layers": layers, "device": "cuda", "command": "trace", "checkpoint_activations": True,
                      "partition_activations": offload, "offload_activations": offload}  # fmt: skip
            spec = TrialSpec(*configs(values))
            traced = trace_step(spec)
            assert traced["host_peak_bytes"] == (layers * chunk if offload else 0)
            model = engine_peak(spec.model, spec.parallel, spec.precision, 8, PROFILES["v100-32gb-dgx2"])
            peaks[offload] = (traced["peak_bytes"], tensor_peak(model))
        below[layers], modelled[layers] = (peaks[False][k] - peaks[True][k] for k in (0, 1))
    assert below[2] > 0 and below[4] - below[2] == 2 * chunk
    assert modelled == below


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_state_bytes_are_the_engines_and_the_formula(stage):
    dp = 4
    spec = spec_for("awkward", precision="bf16", dp=dp, stage=stage, micro_batch=1)
    out = trace_step(spec)
    got = out["bytes"]
    assert {"param_bytes": got["param"], "grad_bytes": got["grad"], "optimizer_bytes": got["optimizer"]} == out[
        "engine_state_bytes"
    ]
    assert trace_states(spec) == {k: got[k] for k in ("param", "grad", "optimizer")}  # a step changes none
    # within the padding of each bucket to a multiple of N_d, the paper's formula (§5)
    exact = memory.model_state_bytes(spec.model.num_params, stage, dp)
    for k in ("param", "grad", "optimizer"):
        assert exact[f"{k}_bytes"] <= got[k] <= exact[f"{k}_bytes"] * 1.01
    assert out["peak_bytes"] >= sum(got.values())
    assert out["activation_bytes"] > 0


def test_stage_transients_are_model_states_at_the_peak():
    """Stage 3's gathered buckets count as parameters (at the peak), stage 2's staging buckets as
    gradients (alive in backward only)."""
    s3 = trace_step(spec_for("awkward", precision="bf16", dp=4, stage=3, micro_batch=1))
    assert s3["peak_breakdown"]["param"] > s3["bytes"]["param"]
    s2 = trace_step(spec_for("awkward", precision="bf16", dp=4, stage=2, micro_batch=1))
    assert s2["high"]["grad"] > s2["bytes"]["grad"]
    assert s2["high"]["temporary"] > 0


def test_micro_batch_and_checkpointing_change_activations():
    one = trace_step(spec_for("tiny", dp=2, stage=1, micro_batch=1))["activation_bytes"]
    two = trace_step(spec_for("tiny", dp=2, stage=1, micro_batch=2))["activation_bytes"]
    ckpt = trace_step(spec_for("tiny", dp=2, stage=1, micro_batch=2, checkpoint_activations=True))
    assert 1.8 * one < two  # the weights' fp32 casts are saved once, whatever the batch
    assert ckpt["activation_bytes"] < two


def test_record_is_traced_and_names_its_counter():
    spec = spec_for("tiny", precision="bf16", dp=4, stage=2, micro_batch=1)
    r = trace_record(spec)
    # the counter by its class name: a record holds no module path, which moves with the package
    assert (r["source"], r["status"], r["memory_counter"]) == ("traced", "ok", StorageCounter.__name__)
    assert r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"] <= r["peak_allocated_bytes"]
    rs, ag = r["comm"]["reduce_scatter/dp"], r["comm"]["all_gather/dp"]
    # Ψ each way in 16-bit elements, plus each bucket's padding to a multiple of N_d = 4: at most
    # 3 elements per parameter tensor, since a bucket holds at least one
    model = GPT(spec.model)
    psi, tensors = sum(p.numel() for p in model.parameters()), len(list(model.parameters()))
    assert rs["bytes"] == ag["bytes"] and 2 * psi <= rs["bytes"] <= 2 * (psi + 3 * tensors)
    assert rs["per_step_volume_elements"] == rs["volume_elements"] and rs["seconds"] is None


def test_failed_trace_is_an_error_record_naming_the_field():
    spec = spec_for("tiny", dp=2, stage=3, max_live_bytes=1)
    r = trace_record(spec)
    assert r["status"] == "error" and "max_live_bytes" in r["error"]
    assert not dist.is_initialized()  # the fake world is torn down


def test_fake_world_refuses_a_second_world():
    with fake_world(2):
        with pytest.raises(RuntimeError, match="already initialized"):
            with fake_world(2):
                pass


# -- Table 1 ------------------------------------------------------------------------------------
def test_table1_models_have_the_papers_parameter_counts():
    assert {k: m.num_params for k, m in MODELS.items()} == {7.5: 7_500_000_000, 128: 128 * 10**9, 1000: 10**12}


def test_printed_truncates_or_rounds_like_the_paper():
    assert printed(4187.5, "4187", truncate=True) == Decimal("4187")
    assert printed(4187.5, "4187", truncate=False) == Decimal("4188")
    assert printed(41.25, "41.3", truncate=False) == Decimal("41.3")
    assert printed(0.1171875, "0.12", truncate=False) == Decimal("0.12")
    assert printed(15.625, "15.6", truncate=True) == Decimal("15.6")


def test_formula_gives_every_paper_cell():
    df = table1({})
    assert len(df) == 54 and df.traced_gb.isna().all()
    assert df.match.all(), df[~df.match]


def test_formula_would_catch_a_wrong_cell():
    df = table1({})
    wrong = df.assign(formula_gb=df.formula_gb * 1.01)
    assert not all(
        printed(f, f"{p:g}", r == "truncated") == Decimal(f"{p:g}")
        for f, p, r in zip(wrong.formula_gb, wrong.paper_gb, wrong.rounding)
    )


def test_a_traced_table1_cell():
    """7.5B, P_os+g+p, N_d = 64: 16Ψ/N_d = 1.875 GB, traced from the engine."""
    b = traced_state_bytes(MODELS[7.5], 3, 64)
    assert printed(b / 1e9, "1.88", truncate=False) == Decimal("1.88")
    assert b == pytest.approx(16 * 7.5e9 / 64, rel=1e-6)


def test_table1_from_a_states_only_record():
    """The workflow's route: `zerobench trace --states-only` writes a record, the table reads the
    cell from it (7.5B, P_os+g, N_d = 4: (2 + 14/4)Ψ = 41.25 GB, printed 41.3 in the paper)."""
    spec = TrialSpec(MODELS[7.5], ParallelConfig(dp=4, stage=2), PrecisionConfig(mode="bf16"))
    record = trace_record(spec, states_only=True)
    assert record["status"] == "ok" and record["activation_bytes"] is None  # no step was run
    assert (
        record["param_bytes"] + record["grad_bytes"] + record["optimizer_bytes"]
        == 2 * 7_500_000_000 + 14 * 7_500_000_000 // 4
    )
    df = table1(traced_cells([record]))
    cell = df[(df.model == "7.5B") & (df.nd == 4) & (df.stage == 2)].iloc[0]
    assert cell.traced_gb == pytest.approx(41.25) and cell.match and df.traced_gb.notna().sum() == 1
