"""The whole GPU check rehearsed on this CPU (scripts/gpu_check.sh's driver, zerobench/checks/
gpu_driver.py): its pre-flight, deadline arithmetic, parts and gates, with a card standing in for
the device (GPU_CHECK_CARD) and tests/stand_in_cli.py for each trial's process (GPU_CHECK_CLI).
Three cards (80 GB, 141 GB, one without a profile) each get the trials their trace fits; each
injected fault fails the check, naming the gate; every part's time is reported (parts.json)."""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.unit.test_gpu_check import STAND_IN
from zerobench.checks import gpu_driver
from zerobench.checks.card import CARD_ENV, Card
from zerobench.checks.gpu_check import CLI_ENV, plan, trace_all, trial

CARDS = {"80 GB": "NVIDIA H100 80GB HBM3=85.5e9", "141 GB": "NVIDIA H200=150.1e9", "no profile": "NVIDIA L40S=47.7e9"}
# the stand-in's traced peaks at micro-batch 1 (times the micro-batch): dp-6b's as its real trace
PEAKS = {"dp-6b": 97.7e9, "gpt-1.5b": 3e9}
PY = sys.executable
PASS = (PY, "-c", "print('1 passed')")


def _rehearse(monkeypatch, tmp_path, card: str, stand_in: dict, **changes) -> tuple[int, str, Path]:
    """The driver on `card`, its parts as the check's own but for the GPU tests, calibrate and the
    peers (stand-ins: none runs on a CPU), the emulated part's ranks on the CPU without its sheets, and the
    parts named in `changes` changed so (Part's fields). Returns the exit status, the summary line
    and the card's folder."""
    monkeypatch.setenv(CLI_ENV, STAND_IN)
    monkeypatch.setenv("STAND_IN", json.dumps({"peaks": PEAKS, **stand_in}))
    monkeypatch.setenv(CARD_ENV, card)
    out = tmp_path / Card.parse(card).name.replace(" ", "-")
    check = {p.name: p for p in gpu_driver.parts(out)}
    emulated = (*check["emulated"].argv, "--device", "cpu", "--sheets", "")
    changes = {"tests": {"argv": PASS}, "emulated": {"argv": emulated}, "calibrate": {"argv": PASS},
               "peers": {"argv": PASS}, **changes}  # fmt: skip
    rc = gpu_driver.main([str(tmp_path)], [replace(p, **changes.get(p.name, {})) for p in check.values()])
    return rc, (out / "summary.txt").read_text().strip(), out


@pytest.mark.ci
@pytest.mark.parametrize("card", CARDS)
def test_the_check_passes_on_each_card_with_what_fits_it(monkeypatch, capsys, tmp_path, card):
    """The whole check rehearsed per card (about 7 s each); every gate is seen failing in the fault-
    injection test, which runs everywhere, so this runs in CI only."""
    rc, last, out = _rehearse(monkeypatch, tmp_path, CARDS[card], {})
    log = capsys.readouterr().out
    assert rc == 0, log
    assert last.startswith("gpu_check: passed") and log.splitlines()[0].startswith("gpu_check: pre-flight")
    ran = sorted(p.stem for p in (out / "runs").glob("*.json"))
    assert ("dp-6b-s0-mb1" in ran) == (card == "141 GB")  # 97.7 GB traced: only the 141 GB card holds it
    assert ("gpt-1.5b-s3-mb16" in ran) == (card != "no profile")  # 48 GB traced: not on the 48 GB card
    assert all(f"skipped {p}" in (out / "sweep.log").read_text() for p in {"dp-6b", "gpt-1.5b"} - {r[:-7] for r in ran})
    parts = {p["part"]: p for p in json.loads((out / "parts.json").read_text())}
    assert [p["status"] for p in parts.values()] == ["passed"] * 5
    print({name: p["seconds"] for name, p in parts.items()})  # each part's time on this CPU (docs/gpu.md)


def test_injected_faults_fail_their_gates_naming_them(monkeypatch, tmp_path):
    """A trial's child that exits non-zero (the sweep) and an emulated rank whose peak is not its
    trace's; then a gated part killed at its budget, one that exits non-zero, one not run."""
    rc, last, _ = _rehearse(monkeypatch, tmp_path, CARDS["141 GB"], {"run": "exit", "emulate": "unequal"})
    assert rc == 1 and "sweep: failed" in last and "emulated: failed" in last and "tests" not in last
    sleep = {"argv": (PY, "-c", "import time; print('working'); time.sleep(60)"), "cap_s": 1, "grace_s": 0}
    fail = {"argv": (PY, "-c", "import sys; print('3 failed'); sys.exit(1)")}
    rc, last, _ = _rehearse(monkeypatch, tmp_path, CARDS["80 GB"], {}, sweep={**sleep, "floor_s": 1}, tests=fail)
    assert rc == 1 and "sweep: timeout after 1 s of 1 s — working" in last and "tests: failed — 3 failed" in last


def test_a_gated_part_the_deadline_leaves_no_time_fails(monkeypatch, tmp_path):
    monkeypatch.setenv(CARD_ENV, CARDS["80 GB"])
    plan_ = [replace(p, argv=PASS) for p in gpu_driver.parts(tmp_path)]
    assert gpu_driver.main([str(tmp_path), "--deadline-s", "60"], plan_) == 1  # 40 s left: under every floor
    last = (tmp_path / "NVIDIA-H100-80GB-HBM3" / "summary.txt").read_text()
    assert "sweep: not_run" in last and "emulated: not_run" in last and "calibrate" not in last


def test_a_missing_package_stops_the_check_at_the_pre_flight(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(CARD_ENV, CARDS["141 GB"])
    real = gpu_driver.importlib.util.find_spec
    monkeypatch.setattr(gpu_driver.importlib.util, "find_spec", lambda name: None if name == "pytest" else real(name))
    assert gpu_driver.main([str(tmp_path)], [replace(p, argv=PASS) for p in gpu_driver.parts(tmp_path)]) == 1
    log = capsys.readouterr().out
    assert "missing packages pytest" in log.splitlines()[0] and "package pytest is missing (needed by tests)" in log
    assert "passed" not in log  # no part ran


def test_no_device_stops_the_check_at_the_pre_flight(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv(CARD_ENV, raising=False)
    assert gpu_driver.main([str(tmp_path)], []) == 1
    assert "FAILED at pre-flight — device: no CUDA device is available here" in capsys.readouterr().out


@pytest.mark.ci
def test_three_cards_plan_dp_6b_by_its_real_trace_with_cuda_semantics(tmp_path):
    """dp-6b at micro-batch 1, stage 0, traced as the check traces it (`zerobench trace` with the
    trial's device, cuda: bf16 compute): 97.7 GB, which an 80 GB card and a 48 GB card without a
    profile cannot hold (skipped, and why) and a 141 GB card can (planned).

    A real dp-6b trace (about 20 s); the planning against a card's memory is tested with stand-in
    traces above, so it runs in CI only."""
    values = trial("dp-6b", 0, 1)
    (traced,) = trace_all([values], tmp_path, timeout=300, workers=1)
    assert traced["status"] == "ok" and traced["precision"] == "bf16" and traced["device"] == "cuda"
    assert 96e9 < traced["peak_allocated_bytes"] < 99e9
    for card, fits in (("80 GB", False), ("141 GB", True), ("no profile", False)):
        planned, rows = plan(Card.parse(CARDS[card]), [values], [traced])
        assert bool(planned) == fits and [r["status"] for r in rows] == ["skipped"] * (not fits), card
        assert fits or "traced 97.7 GB + the allocator's slack exceeds" in rows[0]["error"]
