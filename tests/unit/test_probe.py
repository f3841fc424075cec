"""The host speed probe (runtime/probe.py) and what the measured tables make of it: a reading's rates
from an injected clock, a trial's record carrying its readings taken outside its memory window, the
profile keeping the calibration's, and, from hand-made records with injected readings, each run's
host speed, the slow-spell flag, the runs set aside, the normalized step, and a slow-spell row that
cannot move a verdict (docs/perfmodel.md, "Measured comparisons on a noisy host")."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
import torch

from tests.engine_cases import spec_for
from tests.records import TINY_STEP
from tests.unit.test_calibrate import CPU
from zerobench import slow_spells
from zerobench.engine.parallel import topology
from zerobench.perfmodel import profile_file
from zerobench.runtime import probe, train
from zerobench.trial.errors import InputError

S = 2**25  # copy bytes of every hand-made reading
CAL = ((512, S, 100e9, 5e9), (512, S, 100e9, 5e9))  # the calibration's readings: 100 GFLOP/s, 5 GB/s


def reading(speed_gemm: float, speed_copy: float) -> list:
    """A reading whose GEMM and copy run `speed_*` x the calibration's."""
    return [512, S, 100e9 * speed_gemm, 5e9 * speed_copy]


def test_read_takes_its_rates_from_the_clock_on_one_thread():
    seen, now = [], [0.0]

    def clock():  # every timed call takes 1 ms; the thread count the probe runs at, noted
        seen.append(torch.get_num_threads())
        now[0] += 0.001
        return now[0]

    torch.set_num_threads(2)
    n, nbytes, gemm, copy = probe.read("cpu", clock)
    assert (n, nbytes) == (probe.GEMM_N["cpu"], probe.COPY_BYTES["cpu"])
    assert gemm == pytest.approx(2 * 512**3 / 0.001) and copy == pytest.approx(2**25 / 0.001)
    # per timing one read, then one a call until WINDOW_S (10 calls of 1 ms); all on one thread
    assert len(seen) == 2 * probe.REPEATS * (1 + round(probe.WINDOW_S / 0.001)) and set(seen) == {1}
    assert torch.get_num_threads() == 2  # the caller's setting given back


def test_host_speed_by_hand():
    # GEMM at 50 then 200 GFLOP/s: geometric mean 100 against 125 -> 0.8; copy 4 GB/s against 5 -> 0.8
    trial = [[512, S, 50e9, 4e9], [512, S, 200e9, 4e9]]
    assert slow_spells.host_speed(trial, [[512, S, 125e9, 5e9]]) == pytest.approx(0.8)
    # GEMM 0.64 of the calibration's, copy as fast: sqrt(0.64 x 1) = 0.8
    assert slow_spells.host_speed([reading(0.64, 1.0)], CAL) == pytest.approx(0.8)
    assert slow_spells.host_speed([reading(2.0, 2.0)], CAL) == pytest.approx(2.0)  # faster than at calibration
    # nothing to compare: no probe on either side, or readings of other sizes
    assert slow_spells.host_speed(None, CAL) is None and slow_spells.host_speed([reading(1, 1)], ()) is None
    assert slow_spells.host_speed([[256, S, 1e9, 1e9]], CAL) is None
    assert slow_spells.host_speed([[512, 2**20, 1e9, 1e9]], CAL) is None


@pytest.mark.parametrize(
    "bad", [[[512, S, 0.0, 1e9]], [[512, S, 1e9]], [[512.5, S, 1e9, 1e9]], "x", [[512, S, True, 1]]]
)
def test_host_speed_refuses_a_malformed_reading(bad):
    with pytest.raises(ValueError, match="host_probe"):
        slow_spells.host_speed(bad, CAL)


def test_slow_spell_threshold():
    assert slow_spells.SLOW_SPELL == 0.15
    assert (
        slow_spells.slow_spell(0.849) is True
        and slow_spells.slow_spell(0.85) is False
        and slow_spells.slow_spell(1.3) is False
    )
    assert slow_spells.slow_spell(None) is None


def test_measured_record_carries_the_probe_read_outside_its_memory_window(monkeypatch):
    calls = []
    readings = iter([[512, S, 1e11, 5e9], [512, S, 9e10, 4e9]])
    monkeypatch.setattr(train.probe, "read", lambda device: calls.append(("probe", device)) or next(readings))
    reset, peak = train.memory.reset_peak_rss, train.peak_memory
    monkeypatch.setattr(train.memory, "reset_peak_rss", lambda: calls.append(("reset",)) or reset())
    monkeypatch.setattr(train, "peak_memory", lambda device: calls.append(("peak",)) or peak(device))
    spec = spec_for("tiny", steps=1)
    record = train.measure(spec, topology.build(1, 1), torch.device("cpu"))
    assert record["status"] == "ok"
    assert record["host_probe"] == [[512, S, 1e11, 5e9], [512, S, 9e10, 4e9]]  # before, after
    # before the peak marks are reset, after the last peak is read: the probe's buffers are no part of the trial
    names = [c[0] for c in calls]
    assert names[:2] == ["probe", "reset"] and names[-2:] == ["peak", "probe"] and calls[0] == ("probe", "cpu")


def test_profile_keeps_the_calibrations_probe_and_refuses_a_bad_one(tmp_path):
    hw = dataclasses.replace(CPU, host_probe=CAL)
    path = profile_file.save(hw, tmp_path / "p.json")
    assert profile_file.load(path).host_probe == CAL
    d = profile_file.to_dict(hw)
    with pytest.raises(InputError, match=r"host_probe\[1\].gemm_flops_per_s"):
        profile_file.from_dict({**d, "host_probe": [list(CAL[0]), [512, S, -1.0, 5e9]]})
    with pytest.raises(InputError, match=r"host_probe\[0\].gemm_n"):
        profile_file.from_dict({**d, "host_probe": [[0, S, 1e9, 5e9]]})


def _run(step: float, speed: float | None, **fields) -> dict:
    """A run of a step of `step` s whose host ran at `speed` x the calibration's (both readings)."""
    probe_ = None if speed is None else [reading(speed, speed)] * 2
    return dict(TINY_STEP, step_time_s=step, host_probe=probe_, **fields)


def test_model_vs_measured_sets_aside_slow_runs_and_normalizes_by_the_probe():
    from zerobench.artifacts.tables.vs_measured import model_vs_measured

    hw = dataclasses.replace(CPU, host_probe=CAL)
    runs = [_run(0.50, 1.0), _run(0.90, 0.5), _run(0.54, 0.9)]  # the second in a slow spell
    runs += [_run(1.0, 0.5, micro_batch=8), _run(1.2, 0.8, micro_batch=8)]  # every run slow
    runs += [_run(t, None, micro_batch=2) for t in (0.3, 0.4, 0.2)]  # records without a probe
    df = model_vs_measured(runs, hw).set_index("micro_batch")
    b4, b8, b2 = df.loc[4], df.loc[8], df.loc[2]
    assert b4.host_speed_runs == "1 0.5 0.9" and b4.host_speed == pytest.approx(0.9) and b4.runs_slow == 1
    assert not b4.slow_spell and b4.runs == 3 and b4.measured_runs_s == "0.5 0.9 0.54"
    assert b4.expected == pytest.approx(0.52)  # median of 0.50 and 0.54: the slow run set aside
    # normalized: each kept run's step x its host speed, what it would have taken at calibration speed
    assert b4.expected_normalized == pytest.approx((0.50 * 1.0 + 0.54 * 0.9) / 2)
    assert b4.error_normalized_pct == pytest.approx(100 * (b4.ours / b4.expected_normalized - 1))
    assert b4.error_pct == pytest.approx(100 * (b4.ours / 0.52 - 1))
    # every run slow: all kept, the row flagged
    assert b8.slow_spell and b8.runs_slow == 2 and b8.expected == pytest.approx(1.1)
    assert b8.expected_normalized == pytest.approx((1.0 * 0.5 + 1.2 * 0.8) / 2)
    # no probe: missing, not invented; judged as before on the median of every run
    assert pd.isna(b2.slow_spell) and math.isnan(b2.host_speed) and b2.host_speed_runs == "- - -"
    assert b2.expected == pytest.approx(0.3) and math.isnan(b2.error_normalized_pct)
    # a profile without a probe: no speed for any run, the same rows as without probes
    bare = model_vs_measured(runs, CPU)
    assert bare.slow_spell.isna().all() and bare.expected.tolist()[:2] == [0.54, 1.1]  # every run's median


def test_a_slow_spell_row_cannot_move_the_verdict():
    from zerobench.artifacts.judging.host_speed import note
    from zerobench.artifacts.report.report import stats, verdict

    quiet = pd.DataFrame(dict(key=["a", "b"], role="judged", status="ok", error_pct=[4.0, -6.0], slow_spell=False,
                              host_speed_runs=["1 0.96 1.05", "0.9 -"]))  # fmt: skip
    slow = pd.DataFrame(dict(key=["c"], role="judged", status="ok", error_pct=[80.0], slow_spell=True,
                             host_speed_runs=["0.5 0.7"]))  # fmt: skip
    both = pd.concat([quiet, slow], ignore_index=True)
    s, s_quiet = stats(both), stats(quiet)
    assert (s["n"], s["mape"], s["max"], s["worst"]) == (2, 5.0, 6.0, "b")
    assert (s["n"], s["mape"], s["max"]) == (s_quiet["n"], s_quiet["mape"], s_quiet["max"])
    assert s["slow"] == 1 and s_quiet["slow"] == 0
    line = verdict(s, 10)
    assert line.startswith("**Reproduced**") and "1 judged row(s) with every run in a slow spell" in line
    # the host's measured variability: the six probed runs, two of them slower than 0.85
    said = note(both)
    assert "over 6 probed runs: median 0.93, range 0.50-1.05" in said
    assert "2 run(s) more than 15% slower set aside, 1 judged row(s)" in said
    assert "not known" in note(quiet.assign(host_speed_runs="- -"))


def test_superlinear_pair_compared_at_the_sweeps_typical_speed():
    from zerobench.artifacts.tables.superlinear import seen, table

    base = dict(source="measured", status="ok", stage=0, mem_cap_bytes=1, num_params=1, rss_growth_bytes=1)
    # N_d=1 at 1000 tokens/s on a host at half the speed of N_d=2's, which runs 2000: linear as measured;
    # at one speed N_d=1 would have run 2000, so N_d=2 is 50 % below linear. The sweep's typical:
    # geomean(0.5, 1) = 0.707
    one = dict(base, dp=1, micro_batch=2, tokens_per_s=1000.0, host_probe=[reading(0.5, 0.5)])
    two = dict(base, dp=2, micro_batch=2, tokens_per_s=2000.0, host_probe=[reading(1.0, 1.0)])
    df = table([({}, one), ({}, two)])
    best = df[df.kind == "best"].set_index("dp")
    typical = math.sqrt(0.5)
    assert best.host_speed[1] == pytest.approx(0.5 / typical) and best.host_speed[2] == pytest.approx(1 / typical)
    assert best.slow_spell[1] and not best.slow_spell[2]  # 0.707 of typical: a slow spell
    assert best.vs_linear_pct[2] == pytest.approx(0.0) and best.vs_linear_normalized_pct[2] == pytest.approx(-50.0)
    assert "0.71 at N_d=1, 1.41 at N_d=2; normalized by it, N_d=2 is 50% below linear" in seen(df)
    assert "slow spell" in seen(df)
    # without probes: the columns empty, the comparison as measured
    bare = table([({}, {**one, "host_probe": None}), ({}, {**two, "host_probe": None})])
    assert bare.host_speed.isna().all() and "not recorded" in seen(bare)


def test_a_trial_in_a_slow_spell_runs_once_more():
    """`rerun_if_slow`: a record whose probe reads more than 15 % below the reference is run again
    and the second kept, noting the first; a quick first run, a failed one, or a slow second run
    is kept as it is (a slow second run: flagged by the tables, not run a third time)."""
    ref = [reading(1.0, 1.0)]
    speeds = {"quick": [1.0], "slow then quick": [0.7, 0.95], "slow twice": [0.7, 0.6]}
    for name, seq in speeds.items():
        calls = []

        def run(spec, seq=seq, calls=calls):
            calls.append(spec)
            s = seq[len(calls) - 1]
            return {"status": "ok", "step_time_s": 1 / s, "host_probe": [reading(s, s)]}

        record = slow_spells.rerun_if_slow(run, ref, log=lambda _: None)("spec")
        assert calls == ["spec"] * len(seq), name
        assert record["step_time_s"] == pytest.approx(1 / seq[-1])
        if len(seq) > 1:
            assert record["slow_spell_rerun"] == {"first_host_speed": pytest.approx(0.7), "first_step_time_s": 1 / 0.7}
        else:
            assert "slow_spell_rerun" not in record
    failed = slow_spells.rerun_if_slow(lambda spec: {"status": "oom", "host_probe": [reading(0.5, 0.5)]}, ref)("spec")
    assert failed == {"status": "oom", "host_probe": [reading(0.5, 0.5)]}
    # no probe on the record (an older record, a failed launch): nothing to compare, no rerun
    assert "slow_spell_rerun" not in slow_spells.rerun_if_slow(lambda spec: {"status": "ok"}, ref)("spec")
