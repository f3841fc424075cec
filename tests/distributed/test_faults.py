"""Faults: a rank that dies or hangs ends the trial with a record and no orphan processes; an fp16
overflow on one rank skips the step everywhere and leaves the model untouched."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.engine_cases import spec_for
from tests.worlds import threaded
from zerobench.engine.config import ConfigError, PrecisionConfig
from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms
from zerobench.engine.step import shifted
from zerobench.runtime import faults
from zerobench.runtime.trace import rank_slice
from zerobench.runtime.train import build_engine, train_steps


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and proc.name != str(os.getpid()):
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                found.append(f"{proc.name}: {cmd}")
    return found


def _run_with_fault(tmp_path, fault: str, timeout_s: float):
    out = tmp_path / "record.json"
    cmd = [sys.executable, "-m", "zerobench.cli", "run", "--model", "tiny", "--dp", "2", "--steps", "4"]
    cmd += ["--warmup", "0", "--timeout", str(timeout_s), "--out", str(out)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env={**os.environ, faults.ENV: fault}, capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - t0
    time.sleep(0.5)  # the launcher has reaped its children; give /proc a moment
    return json.loads(out.read_text()), proc, elapsed, _processes_mentioning(str(tmp_path))


@pytest.mark.slow
def test_dead_rank_ends_the_trial_with_an_error_record(tmp_path):
    record, proc, _, orphans = _run_with_fault(tmp_path, "rank=1,step=2,kind=exit", timeout_s=60)
    assert record["status"] == "error", proc.stderr[-2000:]
    assert "rank 1" in record["error"] and str(faults.FAULT_EXIT) in record["error"]
    assert (record["dp"], record["stage"]) == (2, 0)
    assert proc.returncode == 1  # `zerobench run` says the trial failed
    assert orphans == []


@pytest.mark.ci
@pytest.mark.slow
def test_hung_rank_ends_the_trial_within_the_timeout(tmp_path):
    """Rank 1 stops at step 2; rank 0 waits in its collective until the trial ends `timeout`
    seconds later, writes `timeout`, and the launcher stops rank 1. At mp 1 the DP group is WORLD,
    whose collectives time out after `timeout` themselves (init_process_group's): whichever of
    that and the watchdog (`timeout` after the step began) comes first ends it.

    Waits out a hung rank's timeout (about 16 s); the dead rank's test runs everywhere, so it runs
    in CI only."""
    record, proc, elapsed, orphans = _run_with_fault(tmp_path, "rank=1,step=2,kind=hang", timeout_s=5)
    assert record["status"] == "timeout", proc.stderr[-2000:]
    watchdog, collective = "no progress for 5 s at step 2", "Timed out waiting 5000ms"
    assert watchdog in record["error"] or collective in record["error"], record["error"]
    assert orphans == []
    assert elapsed < 120  # start-up (slow here) + 5 s, far from the 30 min default of a subgroup


@pytest.mark.parametrize(
    "text, message",
    [
        ("rank=1,step=x,kind=exit", "step='x'"),
        ("rank=1,step=2,kind=explode", "kind='explode'"),
        ("rank=1,step=2,now", "expected rank=R,step=S,kind=K"),
        ("rank=1;step=2", "rank='1;step=2'"),
        ("step=2,kind=exit", "rank=None"),
    ],
)
def test_bad_fault_spec_names_the_field(text, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        faults.parse(text)
    assert faults.parse("") is None
    assert faults.parse("rank=1, step=2, kind=hang") == faults.Fault(1, 2, "hang")


def _overflow_on_rank1(rank, spec):
    """One clean step, then one whose gradient on rank 1 (only) holds an inf, then a clean one."""
    ctx = topology.build(spec.parallel.dp, spec.parallel.mp)
    engine = build_engine(spec, ctx, Comms(), torch.device("cpu"))
    train_steps(engine, spec, ctx, 1)
    opt = engine.optimizer
    states = lambda: [t.clone() for t in (opt.master_flat, opt.exp_avg_flat, opt.exp_avg_sq_flat)]  # noqa: E731
    before = (engine.full_parameters(), states(), float(opt.steps[0]), engine.scaler.scale)
    wte = engine.model.wte  # element 0 sits in rank 0's chunk: only a cross-rank flag tells rank 0

    def poison(g):
        g = g.clone()
        g.view(-1)[0] = float("inf")
        return g

    hook = wte.register_hook(poison) if rank == 1 else None
    x, y = shifted(rank_slice(spec, ctx.dp.rank, step=1)[0])
    engine.backward(engine.model(x, y))
    stepped = engine.step()
    after = (engine.full_parameters(), states(), float(opt.steps[0]), engine.scaler.scale)
    if hook:
        hook.remove()
    engine.backward(engine.model(x, y))
    recovered = engine.step()
    return {"stepped": stepped, "before": before, "after": after, "recovered": recovered}


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_fp16_overflow_on_one_rank_skips_the_step_everywhere(stage):
    spec = spec_for("tiny", "fp16", dp=2, stage=stage, steps=1)
    spec = dataclasses.replace(spec, precision=PrecisionConfig(mode="fp16", initial_loss_scale=1024.0))
    for r in threaded(2, _overflow_on_rank1, spec):
        assert r["stepped"] is False
        (p0, s0, n0, scale0), (p1, s1, n1, scale1) = r["before"], r["after"]
        assert scale1 == scale0 / 2
        assert n1 == n0 == 1.0  # Adam's step count did not advance
        for name in p0:
            assert torch.equal(p0[name], p1[name]), name
        for a, b in zip(s0, s1):
            assert torch.equal(a, b)
        assert r["recovered"] is True  # the gradients were cleared: the next step is clean
