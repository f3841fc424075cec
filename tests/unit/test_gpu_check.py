"""The GPU check's parts and gates (zerobench/checks/gpu_check.py, gpu_emulated.py), each trial's
process stood in for by tests/stand_in_cli.py (GPU_CHECK_CLI): a child that exits non-zero, writes
no record or is killed fails the check naming it, and a part that did not run never passes; the
emulated part traces on its rank's device, and runs unchanged on this CPU (a tiny rank, one sheet
trial)."""

import json
import sys
import time
from pathlib import Path

import pytest

from zerobench.checks import gpu_check, gpu_emulated
from zerobench.checks.card import CARD_ENV, cuda_only_bytes
from zerobench.checks.gpu_check import CLI_ENV, gates, run_cli

STAND_IN = f"{sys.executable} {Path(__file__).resolve().parents[1] / 'stand_in_cli.py'}"
ROW = {"model": "dp-6b", "stage": 0, "micro_batch": 1, "status": "ok", "peak_allocated_bytes": 97.7e9,
       "traced_peak_bytes": 97.7e9}  # fmt: skip


@pytest.fixture
def stand_in(monkeypatch):
    """Each trial's command answered by the stand-in, as the JSON given says."""
    monkeypatch.setenv(CLI_ENV, STAND_IN)

    def say(**behaviour):
        monkeypatch.setenv("STAND_IN", json.dumps(behaviour))

    say()
    return say


def test_sweep_gates():
    assert gates([ROW, {**ROW, "stage": 3}]) == []
    assert "peak" in gates([{**ROW, "peak_allocated_bytes": 100.5e9}])[0]  # over its trace and the slack
    assert gates([{**ROW, "micro_batch": 4, "status": "error", "error": "x"}, ROW])[0].endswith("error (x)")
    assert gates([{**ROW, "status": "oom"}])  # its trace fits the card: running out is a failure
    assert gates([{**ROW, "status": "timeout"}])
    assert gates([{**ROW, "status": "not_run", "error": "budget spent"}])  # micro-batch 1 fits: it must run
    assert gates([{**ROW, "micro_batch": 16, "status": "not_run"}, ROW]) == []  # a larger one the budget cut
    skipped = {**ROW, "status": "skipped", "error": "traced 97.7 GB ..."}
    assert gates([skipped, {**ROW, "model": "gpt-1.5b"}]) == []  # the card cannot hold it: nothing failed
    assert gates([skipped]) == ["no trial fits this card"]  # ... but nothing passed either


def test_a_child_that_exits_non_zero_without_a_record_is_an_error_naming_it(stand_in, tmp_path):
    stand_in(emulate="exit")
    rec = run_cli("emulate", {"model": "tiny", "stage": 1}, tmp_path / "r.json", timeout=30)
    assert rec["status"] == "error"
    assert "exited with status 3 without a record" in rec["error"] and "failed on purpose" in rec["error"]


def test_a_child_that_writes_no_record_is_an_error_and_one_killed_a_timeout(stand_in, tmp_path):
    stand_in(run="silent")
    assert run_cli("run", {"model": "tiny", "stage": 0}, tmp_path / "r.json", timeout=30)["status"] == "error"
    (tmp_path / "r.json").write_text(json.dumps({"status": "ok"}))  # an earlier run's record is not this one's
    stand_in(run="sleep")
    rec = run_cli("run", {"model": "tiny", "stage": 0}, tmp_path / "r.json", timeout=1)
    assert rec["status"] == "timeout" and "no record after 1 s" in rec["error"]


def test_the_emulated_rank_and_its_trace_run_on_one_device(stand_in, monkeypatch, tmp_path):
    seen = []

    def cli(command, values, out, timeout):
        seen.append((command, values.get("device")))
        return run_cli(command, values, out, timeout)

    monkeypatch.setattr(gpu_emulated, "run_cli", cli)
    assert gpu_emulated.main([str(tmp_path), "--sheets", "", "--device", "cpu"]) == 0
    assert seen == [(c, "cpu") for _ in range(3) for c in ("trace", "emulate")]


@pytest.mark.parametrize(
    "behaviour, failure",
    [({"emulate": "unequal"}, "tensor peak"), ({"emulate": "exit"}, "exited with status 3"),
     ({"emulate": "silent"}, "without a record"), ({"trace": "exit"}, "trace error")],
)  # fmt: skip
def test_each_emulated_fault_fails_the_part_naming_it(stand_in, capsys, tmp_path, behaviour, failure):
    stand_in(**behaviour)
    assert gpu_emulated.main([str(tmp_path), "--sheets", "", "--device", "cpu"]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "FAILED" in last and failure in last and "stage 1" in last


def test_gpu_emulated_on_cuda_without_a_device_exits_naming_it(capsys, tmp_path):
    assert gpu_emulated.main([str(tmp_path), "--device", "cuda"]) == 2
    assert "device=cuda: no CUDA device" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # no trial was started


def test_a_rank_the_card_cannot_hold_is_skipped_not_passed(stand_in, capsys, monkeypatch, tmp_path):
    stand_in(peaks={"dp-6b": 42e9})
    monkeypatch.setenv(CARD_ENV, "NVIDIA A100-SXM4-40GB=42.4e9")
    assert gpu_emulated.main([str(tmp_path), "--sheets", "", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "peaks 0/3 equal" in out and "stages [1, 2, 3] skipped" in out and "leaves the allocator" in out
    assert not list(tmp_path.glob("emulated-*.json"))  # no rank was emulated


def test_an_emulated_sheet_runs_on_cpu(tmp_path: Path):
    sheet = tmp_path / "tiny_emulated.yaml"
    sheet.write_text(
        "title: tiny\npaper: none\nclaim: plumbing\ntable: sweep\ntolerance_pct: 10\ntrials:\n"
        "  - source: emulated\n    base: {model: tiny, gpus: 4, stage: 3, steps: 1, warmup: 0, device: cuda}\n"
    )
    records = gpu_emulated.sheet(str(sheet), tmp_path / "out", deadline=time.monotonic() + 600, device="cpu")
    assert [r["status"] for r in records] == ["ok"] and records[0]["source"] == "emulated"
    assert (tmp_path / "out" / "tiny_emulated.csv").exists() and (tmp_path / "out" / "tiny_emulated.png").exists()


def test_the_sweep_plans_by_the_card_and_reports_what_it_skipped(stand_in, capsys, monkeypatch, tmp_path):
    """An 80 GB card: dp-6b (97.7 GB traced at micro-batch 1) is skipped at every micro-batch and
    said why, and gpt-1.5b at micro-batch 16 (96 GB); the rest runs; the check passes on what ran."""
    stand_in(peaks={"dp-6b": 97.7e9, "gpt-1.5b": 6e9})
    monkeypatch.setenv(CARD_ENV, "NVIDIA H100 80GB HBM3=85.5e9")
    assert gpu_check.main([str(tmp_path), "--budget-s", "120", "--trace-workers", "4"]) == 0
    out = capsys.readouterr().out
    assert out.count("skipped dp-6b") == 6 and "exceeds the 85.1 GB NVIDIA H100 80GB HBM3 leaves" in out
    ran = sorted(p.stem for p in (tmp_path / "runs").glob("*.json"))
    assert ran == ["gpt-1.5b-s0-mb1", "gpt-1.5b-s0-mb4", "gpt-1.5b-s3-mb1", "gpt-1.5b-s3-mb4"]
    assert "8 skipped" in out.splitlines()[-1] and "every gate passed" in out.splitlines()[-1]


def test_a_cuda_rank_may_hold_its_kernels_own_few_tensors_beyond_the_trace(stand_in, tmp_path):
    """One byte over the trace: within what CUDA's kernels keep beyond the host's (fp32 layer-norm
    statistics, philox seeds: 9 KB at cpu-10m, micro-batch 2) on CUDA; unequal on the CPU, whose
    trace runs the very kernels the rank runs."""
    stand_in(emulate="unequal")
    assert cuda_only_bytes(4, 2 * 128) == 9344
    deadline = time.monotonic() + 60
    assert [r["equal"] for r in gpu_emulated.peaks(tmp_path, deadline, device="cuda")] == [True] * 3
    assert [r["equal"] for r in gpu_emulated.peaks(tmp_path, deadline, device="cpu")] == [False] * 3
