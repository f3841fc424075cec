"""zerobench.checks.smoke's gate on hand-made records: exact bytes, losses within LOSS_RTOL, trials that
appear or vanish, and the baseline rewritten only when asked."""

from __future__ import annotations

import json

import pytest

from zerobench.checks import smoke


def rec(**fields) -> dict:
    comm = {"all_reduce/dp": {"calls": 3, "bytes": 600, "seconds": 0.1}}
    r = dict(source="measured", status="ok", param_bytes=200, grad_bytes=200, optimizer_bytes=1200, comm=comm,
             losses=[5.5, 5.4], step_time_s=0.5)  # fmt: skip
    return {**r, **fields}


def test_exact_fields_and_loss_tolerance():
    base = {"t": smoke.numbers(rec())}
    slower = rec(comm={"all_reduce/dp": {"calls": 3, "bytes": 600, "seconds": 9.0}})
    assert smoke.differences({"t": smoke.numbers(slower)}, base) == []  # seconds are not gated
    assert smoke.differences({"t": smoke.numbers(rec(losses=[5.5, 5.4 * (1 + 1e-7)]))}, base) == []
    diffs = smoke.differences({"t": smoke.numbers(rec(grad_bytes=100, losses=[5.5, 5.41]))}, base)
    assert diffs == ["/t/grad_bytes: 100, baseline 200", "/t/losses[1]: 5.41, baseline 5.4 (rtol 1e-05)"]
    bytes_changed = rec(comm={"all_reduce/dp": {"calls": 3, "bytes": 602, "seconds": 0.1}})
    assert smoke.differences({"t": smoke.numbers(bytes_changed)}, base) == [
        "/t/comm/all_reduce/dp/bytes: 602, baseline 600"
    ]


def test_traced_records_gate_their_memory_by_category():
    traced = rec(source="traced", losses=None, activation_bytes=7, peak_allocated_bytes=9, temporary_bytes=3)
    n = smoke.numbers(traced)
    assert (n["activation_bytes"], n["peak_allocated_bytes"], n["temporary_bytes"]) == (7, 9, 3) and "losses" not in n
    assert "activation_bytes" not in smoke.numbers(rec())  # a measured peak depends on the machine


def test_trials_added_or_missing_are_differences():
    base = {"a": smoke.numbers(rec())}
    assert smoke.differences({"b": smoke.numbers(rec())}, base) == [
        "/a: in the baseline, not measured", "/b: measured, not in the baseline"]  # fmt: skip


@pytest.mark.parametrize("update", [False, True])
def test_main_fails_on_a_change_unless_updating(tmp_path, update, capsys):
    (tmp_path / "t.json").write_text(json.dumps(rec(param_bytes=202)))
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"t": smoke.numbers(rec())}))
    argv = [str(tmp_path / "t.json"), "--baseline", str(baseline), "--out", str(tmp_path / "out.json")]
    assert smoke.main(argv + (["--update"] if update else [])) == (0 if update else 1)
    assert json.loads(baseline.read_text())["t"]["param_bytes"] == (202 if update else 200)
    assert json.loads((tmp_path / "out.json").read_text())["timing_ratios_not_gated"] == {"t": 1.0}
