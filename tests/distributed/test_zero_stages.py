"""ZeRO-DP stages 0–2 against the single-process reference, the memory formulas and the 2Ψ
communication volume (paper §5, §7). Threaded process groups: real collective semantics, fast.
And, for stages 0–3 on gloo, the step that starts while the last reductions are in flight."""

import dataclasses

import pytest
import torch

from tests.engine_cases import TEXT, engine_run, reference_run, rel_err, spec_for, whole_parameters
from tests.worlds import spawned, threaded
from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms
from zerobench.runtime.train import build_engine, train_steps

PGK = {"fp32": (4, 4, 8), "bf16": (2, 2, 12), "fp16": (2, 2, 12)}


@pytest.mark.parametrize("model", ["tiny", "awkward"])
@pytest.mark.parametrize("dp", [2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_parity_with_single_process(stage, dp, model):
    spec = spec_for(model, dp=dp, stage=stage, micro_batch=4 // dp)
    out = threaded(dp, engine_run, spec)
    ref = reference_run(spec)
    for r in out:
        assert rel_err(r["params"], ref["params"]) < 1e-5
    # every rank holds the same replica after the step's all-gather
    for r in out[1:]:
        assert rel_err(r["params"], out[0]["params"]) == 0.0


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_parity_with_gradient_accumulation(stage):
    spec = spec_for("awkward", dp=2, stage=stage, micro_batch=1, grad_accum=3)
    out = threaded(2, engine_run, spec)
    assert rel_err(out[0]["params"], reference_run(spec)["params"]) < 1e-5


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("dp", [2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_model_state_bytes_are_the_formula(stage, dp, precision):
    """Stage 0: (p+g+k)Ψ; stage 1: (p+g)Ψ + kΨ/N_d; stage 2: pΨ + (g+k)Ψ/N_d — to the byte,
    counting the padding of each bucket to a multiple of N_d."""
    spec = spec_for("awkward", precision=precision, dp=dp, stage=stage, steps=1)
    r = threaded(dp, engine_run, spec)[0]
    p, g, k = PGK[precision]
    full, shard = r["padded"], r["shard"]
    expected = {
        0: (p * full, g * full, k * full),
        1: (p * full, g * full, k * shard),
        2: (p * full, g * shard, k * shard),
    }[stage]
    got = r["state_bytes"]
    assert (got["param_bytes"], got["grad_bytes"], got["optimizer_bytes"]) == expected
    assert got == r["state_bytes_before"]  # nothing grows across steps
    # padding is at most N_d − 1 elements per bucket, so this is the paper's formula up to it
    assert full - r["numel"] <= r["buckets"] * (dp - 1)


@pytest.mark.parametrize("dp", [2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_communication_is_2psi(stage, dp):
    """Per step and rank: all-reduce 2Ψ(N_d−1)/N_d at stage 0; reduce-scatter + all-gather,
    Ψ(N_d−1)/N_d each, at stages 1 and 2 — never a third Ψ (paper §7.2.1)."""
    steps = 2
    spec = spec_for("awkward", dp=dp, stage=stage, steps=steps)
    r = threaded(dp, engine_run, spec)[0]
    psi = r["padded"] * (dp - 1) / dp
    vol = r["volume"]
    big = {k: v / steps for k, v in vol.items() if v / steps > 8}  # leave out scalar norm/flag reductions
    if stage == 0:
        assert big == {"all_reduce/dp": pytest.approx(2 * psi)}
    else:
        assert big == {"reduce_scatter/dp": pytest.approx(psi), "all_gather/dp": pytest.approx(psi)}
    # one reduction per bucket per step: the C_B buckets, not one fused buffer
    op = "all_reduce/dp" if stage == 0 else "reduce_scatter/dp"
    assert r["calls"][op] == steps * r["buckets"] > steps


@pytest.mark.parametrize("stage, per_step", [(0, 2.0), (1, 2.0), (2, 4.0)])
def test_communication_with_accumulation(stage, per_step):
    """With m = 3 micro-batches: stages 0/1 reduce once per step (2Ψ); stage 2 reduce-scatters
    every micro-batch and all-gathers once: (m + 1)Ψ."""
    spec = spec_for("tiny", dp=2, stage=stage, steps=1, micro_batch=1, grad_accum=3)
    r = threaded(2, engine_run, spec)[0]
    psi = r["padded"] / 2
    total = sum(v for v in r["volume"].values() if v > 8)
    assert total == pytest.approx(per_step * psi)


def test_bf16_tracks_fp32():
    fp32 = threaded(2, engine_run, spec_for("tiny", dp=2, stage=2, steps=8, data=TEXT))[0]
    bf16 = threaded(2, engine_run, spec_for("tiny", "bf16", dp=2, stage=2, steps=8, data=TEXT))[0]
    assert bf16["losses"][-1] < bf16["losses"][0]  # it trains
    for a, b in zip(bf16["losses"], fp32["losses"]):
        assert a == pytest.approx(b, rel=2e-2)


def test_fp16_loss_scaling_trains():
    r = threaded(2, engine_run, spec_for("tiny", "fp16", dp=2, stage=1, steps=8, data=TEXT))[0]
    fp32 = threaded(2, engine_run, spec_for("tiny", dp=2, stage=1, steps=8, data=TEXT))[0]
    assert r["losses"][-1] < r["losses"][0]
    assert r["losses"][-1] == pytest.approx(fp32["losses"][-1], rel=2e-2)


def _stages_on_gloo(rank):
    """Stages 0–2 one after another in one spawned gloo world (spawning is the slow part)."""
    return [engine_run(rank, spec_for("awkward", dp=2, stage=s, micro_batch=1)) for s in (0, 1, 2)]


def test_parity_on_real_gloo():
    torch.manual_seed(0)
    out = spawned(2, _stages_on_gloo)
    for stage in (0, 1, 2):
        ref = reference_run(spec_for("awkward", dp=2, stage=stage, micro_batch=1))
        assert rel_err(out[0][stage]["params"], ref["params"]) < 1e-5, stage
        assert out[0][stage]["volume"] == out[1][stage]["volume"]


def _count_in_flight(engine) -> list[int]:
    """The reductions in flight as each step starts, recorded into the list returned."""
    counts, step = [], engine.step

    def counted():
        counts.append(len(engine._in_flight))
        return step()

    engine.step = counted
    return counts


def _overlapped_and_not(rank):
    """Every stage trained twice, its step overlapping the last micro-batch's reductions and not:
    parameters, losses, recorded norm and ledger of each, and how many reductions each step found
    still in flight."""
    out = {}
    for stage in (0, 1, 2, 3):
        spec = spec_for("awkward", dp=2, stage=stage, micro_batch=1, grad_accum=2, steps=3)
        spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, clip_norm=0.0))
        for overlap in (True, False):
            ctx, comms = topology.build(2, 1), Comms()
            engine = build_engine(spec, ctx, comms, torch.device("cpu"))
            engine._overlap_step = overlap
            in_flight = _count_in_flight(engine)
            losses = train_steps(engine, spec, ctx, spec.train.steps)
            out[stage, overlap] = {
                "params": whole_parameters(engine, ctx),
                "losses": losses,
                "norm": float(engine.last_grad_norm),
                "ledger": {k: (e["calls"], e["bytes"]) for k, e in comms.ledger.as_dict().items()},
                "in_flight": in_flight,
            }
    return out


def test_step_overlapping_the_last_reductions_changes_nothing():
    """Without clipping or loss scaling (fp32), Adam starts on the pieces already reduced while the
    others are in flight: the same parameters, losses, norm and collectives, bit for bit."""
    out = spawned(2, _overlapped_and_not)[0]
    for stage in (0, 1, 2, 3):
        on, off = out[stage, True], out[stage, False]
        assert max(on["in_flight"]) > 0 and off["in_flight"] == [0, 0, 0], stage
        assert rel_err(on["params"], off["params"]) == 0.0, stage
        assert (on["losses"], on["norm"], on["ledger"]) == (off["losses"], off["norm"], off["ledger"]), stage
