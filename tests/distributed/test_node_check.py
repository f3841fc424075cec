"""scripts/gpu_node_check.sh under gloo at N = 2 (its parity and ledger gates: what a GPU node runs
over NCCL, so the script cannot rot), and the node check's gates on made-up numbers: the ledger
against 2Ψ / 3Ψ, memory against the trace and NCCL's allowance, the verdict and the exit status."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.worlds import threaded
from zerobench import record_files
from zerobench.checks import node_check
from zerobench.checks.card import PEAK_RTOL, PEAK_SLACK_BYTES, Card
from zerobench.engine.parallel import topology
from zerobench.perfmodel.engine_memory import NCCL_COMMUNICATOR_BYTES, communicators

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_node_check.sh"


def _script(tmp_path, *args, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "NODE_CHECK_DEVICE": "cpu", **env}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.ci
@pytest.mark.slow
def test_the_script_passes_under_gloo_at_two_ranks(tmp_path):
    """The GPU node check's script under gloo (about 14 s); its gates are tested in process below,
    so it runs in CI only."""
    done = _script(tmp_path, "2")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "cpu-x2" / "node_check.json").read_text())
    assert doc["gates"] == {"parity": {"ok": True, "failures": []}, "ledger": {"ok": True, "failures": []}}
    assert [(r["dp"], r["mp"], r["stage"]) for r in doc["parity"]] == [(2, 1, s) for s in range(4)]
    assert all(max(r["loss_rel_err"], r["param_rel_err"]) < node_check.RTOL for r in doc["parity"])
    assert doc["nccl"] == {"communicators": 1, "allowance_bytes": NCCL_COMMUNICATOR_BYTES}  # WORLD alone
    assert (tmp_path / "cpu-x2" / "versions.txt").exists()


@pytest.mark.ci
def test_a_rank_that_fails_fails_the_script(tmp_path):
    """Runs the node check's script (about 10 s), so it runs in CI only."""
    done = _script(tmp_path, "2", NODE_CHECK_GATES="parity,nonsense")
    assert done.returncode != 0
    assert "nonsense" in done.stdout + done.stderr


def _exact(stage: int, padded: int, dp: int, elem: int, steps: int) -> dict:
    """A ledger (as_dict) that moves exactly the paper's volume, plus the step's two scalars."""
    unit = padded * (dp - 1) / dp
    ops = {0: {"all_reduce": 2}, 1: {"reduce_scatter": 1, "all_gather": 1}, 3: {"all_gather": 2, "reduce_scatter": 1}}
    out = {
        f"{op}/dp": {"calls": 4, "elements": 0, "volume_bytes": k * unit * elem * steps} for op, k in ops[stage].items()
    }
    if stage:
        out["all_reduce/dp"] = {"calls": 2 * steps, "elements": 2 * steps, "volume_bytes": 2.0}
    out["all_reduce/mp"] = {"calls": 1, "elements": 10**6, "volume_bytes": 1e6}  # another group: not the gate's
    return out


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_the_ledger_gate_holds_the_bytes_to_the_formula(stage):
    padded, dp, elem, steps = 1000, 4, 2, 3
    ledger = _exact(stage, padded, dp, elem, steps)
    assert node_check.ledger_failures(ledger, stage, padded, dp, elem, steps) == []
    key = next(k for k in ledger if k.endswith("/dp") and ledger[k]["volume_bytes"] > 2)
    off = {**ledger, key: {**ledger[key], "volume_bytes": ledger[key]["volume_bytes"] - elem}}  # one element short
    assert len(node_check.ledger_failures(off, stage, padded, dp, elem, steps)) == 1
    missing = {k: v for k, v in ledger.items() if k != key}
    assert "none issued" in node_check.ledger_failures(missing, stage, padded, dp, elem, steps)[0]
    extra = {**ledger, "broadcast/dp": {"calls": 1, "elements": 100, "volume_bytes": 100.0}}
    assert "not the step's scalars" in node_check.ledger_failures(extra, stage, padded, dp, elem, steps)[0]


def test_the_memory_gate_holds_the_peak_to_the_trace_and_gates_nothing_unmeasured():
    row = {"model": "dp-6b", "stage": 3, "status": "ok", "traced_peak_bytes": 100 * 2**30}
    slack = row["traced_peak_bytes"] * PEAK_RTOL + PEAK_SLACK_BYTES
    within = {**row, "peak_allocated_bytes": row["traced_peak_bytes"] + slack}
    over = {**row, "peak_allocated_bytes": row["traced_peak_bytes"] + slack + 1}
    assert node_check.memory_failures([within]) == []
    assert "over the trace" in node_check.memory_failures([over])[0]
    oom = {**row, "status": "oom", "peak_allocated_bytes": None}
    untraced = {**within, "traced_peak_bytes": None}
    assert len(node_check.memory_failures([oom, untraced])) == 2
    skipped = {**row, "status": "skipped", "peak_allocated_bytes": None, "error": "traced ... exceeds"}
    assert node_check.memory_failures([skipped, within]) == []  # its card cannot hold it: not run, not failed


def test_a_speed_trial_the_card_cannot_hold_is_skipped_and_a_rank_error_kept(monkeypatch, tmp_path):
    """An 80 GB node: dp-6b at stage 0 (97 GB traced) is not run and says why; a rank that fails
    with any error (not only out of memory) is its row's status, so the node's JSON is written."""
    card = Card.parse("NVIDIA H100 80GB HBM3=85.5e9")
    record_files.write_record({"status": "ok", "peak_allocated_bytes": 97.7e9}, tmp_path / "dp-6b-s0.json")
    record_files.write_record({"status": "ok", "peak_allocated_bytes": 30e9}, tmp_path / "dp-6b-s3.json")
    monkeypatch.setattr(node_check, "measure", lambda spec, ctx, device: (_ for _ in ()).throw(RuntimeError("NCCL")))
    cpu = torch.device("cpu")
    row = node_check.speed(None, node_check.speed_values("dp-6b", 0, 8), tmp_path, 8, cpu, card)
    assert row["status"] == "skipped" and "traced 97.7 GB" in row["error"]
    assert node_check.memory_failures([row]) == []
    row = node_check.speed(None, node_check.speed_values("dp-6b", 3, 8), tmp_path, 8, cpu, card)
    assert row["status"] == "error" and "NCCL" in row["error"]


def test_a_gate_the_device_cannot_run_fails():
    v = node_check.verdict(
        {"parity": [], "ledger": ["stage 3 all_gather/dp: ..."]}, ("parity", "ledger", "memory"), "cpu"
    )
    assert v["parity"]["ok"] and not v["ledger"]["ok"]
    assert v["memory"] == {"ok": False, "failures": ["not run on cpu"]}


def _made(rank: int, dp: int, mp: int) -> int:
    return len(node_check.communicators([topology.build(dp, mp)]))


@pytest.mark.parametrize(("dp", "mp"), [(4, 1), (1, 4), (2, 2)])
def test_the_memory_model_counts_the_communicators_topology_makes(dp, mp):
    assert threaded(4, _made, dp, mp) == [communicators(dp, mp)] * 4
    assert communicators(1, 1) == 0


def test_layouts_add_mp_2_from_four_ranks():
    assert node_check.layouts(2) == [(2, 1)]
    assert node_check.layouts(8) == [(8, 1), (4, 2)]


def test_a_speed_row_puts_the_ledger_beside_the_model_and_the_trace(monkeypatch, tmp_path):
    seen = []

    def measure(spec, ctx, device):
        seen.append(spec)
        comm = {
            "all_gather/dp": {"seconds": 0.6},
            "reduce_scatter/dp": {"seconds": 0.3},
            "all_reduce/world": {"seconds": 9.0},
        }
        return {"status": "ok", "step_time_s": 0.5, "tflops_per_gpu": 100.0, "peak_allocated_bytes": 2e10,
                "hardware": "h200-141gb", "comm": comm}  # fmt: skip

    monkeypatch.setattr(node_check, "measure", measure)
    record_files.write_record({"peak_allocated_bytes": 1.6e10}, tmp_path / "dp-6b-s3.json")
    row = node_check.speed(None, node_check.speed_values("dp-6b", 3, 8), tmp_path, 8, torch.device("cpu"))
    (spec,) = seen
    assert (spec.parallel.dp, spec.parallel.stage, spec.train.steps, spec.train.compile) == (8, 3, 3, "off")
    assert row["dp_comm_s"] == pytest.approx(0.3)  # the DP group's seconds per step, not the world's
    assert row["traced_peak_bytes"] == 1.6e10 and row["hardware"] == "h200-141gb"
    assert row["predicted_dp_comm_s"] > 0 and row["predicted_tflops_per_gpu"] > 0
    untraced = node_check.speed(None, node_check.speed_values("gpt-1.5b", 0, 8), tmp_path, 8, torch.device("cpu"))
    assert untraced["traced_peak_bytes"] is None
