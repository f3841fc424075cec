"""One emulated rank (runtime/emulate.py): its tensor bytes equal the trace's byte for byte
at any world size, every stage, with MP and ZeRO-R; its values stay finite and its fp16 steps are
not skipped; its collectives are priced and placed (perfmodel/replay.py); bad input writes nothing."""

import json
import math
from pathlib import Path

import pytest
import torch

from tests.engine_cases import spec_for
from tests.worlds import spawned
from zerobench import cli
from zerobench.engine.config import ConfigError
from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms
from zerobench.engine.zero.buffers import no_reuse
from zerobench.perfmodel.replay import stall_s
from zerobench.runtime.counter import LiveCounter
from zerobench.runtime.emulate import check, emulate
from zerobench.runtime.trace import build_counted, counted_step, rank_slice, trace_step

LEDGER_KEYS = ("calls", "elements", "bytes", "volume_elements", "volume_bytes")
MEMORY = ("param", "grad", "optimizer")


def _ledger(d: dict) -> dict:
    return {k: {f: v[f] for f in LEDGER_KEYS} for k, v in d.items()}


def _assert_equal_to_trace(spec, rank=0):
    traced = trace_step(spec)
    r = emulate(spec, rank)
    assert r["status"] == "ok", r["error"]
    assert {k: r[f"{k}_bytes"] for k in MEMORY} == {k: traced["bytes"][k] for k in MEMORY}
    assert r["activation_bytes"] == traced["activation_bytes"]
    assert r["tensor_peak_bytes"] == traced["peak_bytes"]
    assert r["peak_breakdown"] == traced["peak_breakdown"]
    assert r["host_peak_bytes"] == traced["host_peak_bytes"]  # P_a+cpu's checkpoints, off the device
    assert r["temporary_bytes"] == traced["high"]["temporary"]
    assert r["tensor_build_peak_bytes"] == traced["build_peak"]
    # the ledger of the timed steps, per step, is the trace's one step
    per_step = {k: {f: v[f] / spec.train.steps for f in LEDGER_KEYS} for k, v in r["comm"].items()}
    assert per_step == _ledger(traced["ledger"])
    assert all(math.isfinite(x) for x in r["losses"])
    return r


@pytest.mark.parametrize("dp", [2, 8, 64])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_tensor_bytes_equal_the_trace(stage, dp):
    spec = spec_for("awkward", precision="bf16", dp=dp, stage=stage, micro_batch=1, steps=2)
    r = _assert_equal_to_trace(spec)
    assert r["source"] == "emulated" and r["emulation"] == {"memory": "measured", "compute": "measured",
                                                             "collectives": "modelled"}  # fmt: skip
    assert len(r["step_calls"]) == 2 and r["step_calls"][0]  # each timed step's calls, on the timeline


def test_tensor_bytes_equal_the_trace_with_mp_and_zero_r():
    """MP 2 × N_d 4 with P_a (the checkpoints partitioned over MP), stage 2; and P_a+cpu, M_D."""
    for extra in ({}, {"offload_activations": True, "contiguous_buffers": True}):
        spec = spec_for("tiny", precision="bf16", dp=4, mp=2, stage=2, micro_batch=2, steps=1,
                        checkpoint_activations=True, partition_activations=True, **extra)  # fmt: skip
        r = _assert_equal_to_trace(spec, rank=3)  # an MP rank 1 of DP rank 1: its real slice
        assert r["comm"]["all_reduce/mp"]["calls"] > 0 and r["comm"]["all_gather/mp"]["calls"] > 0
        assert (r["host_peak_bytes"] > 0) == bool(extra)  # the host holds the offloaded checkpoints alone


def test_fp16_takes_the_real_paths_and_skips_no_step():
    spec = spec_for("tiny", precision="fp16", dp=8, stage=3, micro_batch=2, steps=3)
    r = emulate(spec, 5)
    assert r["status"] == "ok" and r["skipped_steps"] == 0
    assert all(math.isfinite(x) for x in r["losses"])


def test_one_rank_has_no_collectives():
    r = emulate(spec_for("tiny", dp=1, stage=2, steps=2), 0)
    assert r["comm"] == {} and r["step_calls"] == [[], []]


def test_a_tensor_peak_over_the_cap_is_oom():
    spec = spec_for("tiny", dp=2, stage=0, steps=1)
    peak = emulate(spec, 0)["tensor_peak_bytes"]
    capped = emulate(spec.__class__(**{**spec.__dict__, "mem_cap_bytes": peak - 1}), 0)
    assert capped["status"] == "oom" and "over the cap" in capped["error"]
    assert emulate(spec.__class__(**{**spec.__dict__, "mem_cap_bytes": peak}), 0)["status"] == "ok"


def test_stalls_are_placed_where_the_engine_waits():
    price = {"a": 1.0, "b": 0.5}

    def p(op, group, nbytes):
        return price[op]

    def placed(calls):
        """(stall, every call's priced seconds) of one step's calls."""
        shift, priced = stall_s(calls, p)
        return shift, sum(priced.values())

    def call(op, group, issue, wait):
        return {"op": op, "group": group, "bytes": 0, "issue_s": issue, "wait_s": wait}

    assert placed([call("a", "dp", 0.0, 3.0)]) == (0.0, 1.0)  # hidden behind 3 s of compute
    assert placed([call("a", "dp", 0.0, 0.25)]) == (0.75, 1.0)  # waited for early
    assert placed([call("b", "mp", 1.0, 1.0)]) == (0.5, 0.5)  # synchronous: all of it
    # one communicator runs its calls in order: the second starts when the first ends
    assert placed([call("a", "dp", 0.0, 5.0), call("a", "dp", 0.0, 1.5)]) == (0.5, 2.0)
    # two groups run side by side (on one group the second wait would stall 1 s more)
    assert placed([call("a", "dp", 0.0, 0.5), call("a", "mp", 0.0, 0.5)]) == (0.5, 2.0)
    assert placed([call("a", "dp", 0.0, 0.5), call("a", "dp", 0.0, 0.5)]) == (1.5, 2.0)


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--dp", "2", "--rank", "2"], "rank=2"),
        (["--dp", "2", "--mp", "3"], "mp"),  # tiny's heads are not divisible by 3: no such world
        (["--device", "cuda"], "device=cuda"),
        (["--cluster", "no-such-cluster"], "no-such-cluster"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(tmp_path: Path, capsys, argv, field):
    out = tmp_path / "r.json"
    if "cuda" in argv:
        if torch.cuda.is_available():
            pytest.skip("a CUDA device is here")
    assert cli.main(["emulate", "--model", "tiny", "--steps", "1", *argv, "--out", str(out)]) == 2
    assert field in capsys.readouterr().err
    assert not out.exists()


def test_runs_from_any_folder(tmp_path: Path, monkeypatch):
    """The calibrated CPU profile, which prices a CPU rank's collectives, is found by name from a
    folder outside the project (its committed results/profiles), not only from the project's root."""
    monkeypatch.delenv("ZEROBENCH_PROFILES", raising=False)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r.json"
    assert cli.main(["emulate", "--model", "tiny", "--dp", "4", "--stage", "2", "--steps", "1", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["status"] == "ok", r["error"]


def test_check_refuses_a_negative_rank():
    with pytest.raises(ConfigError, match="rank=-1"):
        check(spec_for("tiny", dp=2), -1)


def _real_rank(rank, specs):
    """Rank `rank` of a real gloo world, counted as the emulated rank is (a counted first step),
    for each spec in turn."""
    out = []
    for spec in specs:
        ctx = topology.build(spec.parallel.dp, spec.parallel.mp)
        comms = Comms()
        with LiveCounter() as counter, no_reuse():
            engine = build_counted(spec, ctx, comms, counter, torch.device("cpu"))
            out.append(counted_step(engine, comms, counter, rank_slice(spec, ctx.dp.rank)))
    return out


@pytest.mark.ci
@pytest.mark.slow
def test_tensor_bytes_equal_a_real_two_rank_run():
    """On gloo two ranks exchange pairwise into the tensors the engine allocated (comms.py), so a
    real rank allocates what the emulated one does, and its ledger is the same, call for call.

    Two real gloo ranks beside the emulated one (about 15 s); the emulated rank equals the trace in
    the fast tests above, so it runs in CI only."""
    specs = [spec_for("awkward", precision="bf16", dp=2, stage=s, micro_batch=2, steps=1) for s in (0, 1, 2, 3)]
    for spec, real in zip(specs, spawned(2, _real_rank, specs)[0], strict=True):
        r = emulate(spec, 0)
        assert {k: r[f"{k}_bytes"] for k in MEMORY} == {k: real["bytes"][k] for k in MEMORY}
        assert (r["activation_bytes"], r["tensor_peak_bytes"]) == (real["activation_bytes"], real["peak_bytes"])
        assert r["peak_breakdown"] == real["peak_breakdown"]
        assert {k: {f: v[f] for f in LEDGER_KEYS} for k, v in r["comm"].items()} == _ledger(real["ledger"])
