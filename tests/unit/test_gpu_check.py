"""The GPU check's gates (zerobench/checks/gpu_check.py, gpu_emulated.py): each fails the check with
a reason, and the emulated part runs unchanged on this CPU (a tiny rank, one sheet trial)."""

from pathlib import Path

from zerobench.checks import gpu_emulated
from zerobench.checks.gpu_check import gates

ROW = {"model": "dp-6b", "stage": 0, "micro_batch": 1, "status": "ok", "peak_allocated_bytes": 97.7e9}


def test_sweep_gates():
    assert gates([ROW, {**ROW, "stage": 3}]) == []
    assert "peak" in gates([{**ROW, "peak_allocated_bytes": 100.5e9}])[0]
    assert gates([{**ROW, "micro_batch": 4, "status": "error"}, ROW])[0].endswith("error")
    assert gates([{**ROW, "model": "gpt-1.5b"}]) == ["dp-6b mb 1 did not run"]
    assert gates([{**ROW, "status": "oom"}])  # dp-6b at micro-batch 1 must fit one H200


def _fake_cli(peak_of):
    def cli(command, values, out, timeout):
        peak = peak_of(command, values)
        record = {"status": "ok", "peak_allocated_bytes": peak, "tensor_peak_bytes": peak, **values}
        return {"status": "error", "error": "boom"} if peak is None else record

    return cli


def test_emulated_gates(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(gpu_emulated, "run_cli", _fake_cli(lambda c, v: 100))
    assert gpu_emulated.main([str(tmp_path), "--sheets", ""]) == 0
    monkeypatch.setattr(gpu_emulated, "run_cli", _fake_cli(lambda c, v: 100 + (c == "emulate" and v["stage"] == 2)))
    assert gpu_emulated.main([str(tmp_path), "--sheets", ""]) == 1  # stage 2's peak is not the trace's
    monkeypatch.setattr(gpu_emulated, "run_cli", _fake_cli(lambda c, v: None if c == "emulate" else 100))
    assert gpu_emulated.main([str(tmp_path), "--sheets", ""]) == 1  # an emulated trial errored


def test_an_emulated_sheet_runs_on_cpu(tmp_path: Path):
    sheet = tmp_path / "tiny_emulated.yaml"
    sheet.write_text(
        "title: tiny\npaper: none\nclaim: plumbing\ntable: sweep\ntolerance_pct: 10\ntrials:\n"
        "  - source: emulated\n    base: {model: tiny, gpus: 4, stage: 3, steps: 1, warmup: 0, device: cuda}\n"
    )
    records = gpu_emulated.sheet(str(sheet), tmp_path / "out", deadline=1e12, device="cpu")
    assert [r["status"] for r in records] == ["ok"] and records[0]["source"] == "emulated"
    assert (tmp_path / "out" / "tiny_emulated.csv").exists() and (tmp_path / "out" / "tiny_emulated.png").exists()
