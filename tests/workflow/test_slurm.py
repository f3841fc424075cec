"""The SLURM path: a trial's ranks as SLURM tasks, each joining from SLURM's environment; the GPU
profile's plan of measured trials at paper scale; and the CPU profile on a real one-node cluster
(scripts/slurm_cluster.sh), which runs only when asked: `make test-slurm`, or CI=true."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from test_workflow import ROOT, _copy_workflow, snakemake

from zerobench.sweeps.sheets import load_sheet, sheet_trials

CLUSTER = ROOT / "scripts/slurm_cluster.sh"
TRIAL = ["--model", "tiny", "--dp", "2", "--stage", "3", "--precision", "bf16", "--steps", "2", "--warmup", "1"]


def _zerobench_run(out, env):
    cmd = [sys.executable, "-m", "zerobench.cli", "run", *TRIAL, "--time-limit", "120", "--out", str(out)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.ci
@pytest.mark.slow
def test_two_slurm_tasks_join_one_world_as_the_launcher_does(tmp_path):
    """Two processes with the variables `srun -n 2` gives its tasks train the trial the launcher
    trains alone: same losses, same model-state bytes.

    Two real ranks joined from SLURM's variables (about 20 s); the variables' parsing is tested in
    test_slurm_env, so it runs in CI only, beside the real one-node cluster."""
    with socket.socket() as s:  # a free port for this test's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    slurm = dict(base, SLURM_JOB_ID="7", SLURM_STEP_ID="0", SLURM_NTASKS="2", SLURM_STEP_NODELIST="localhost")
    rendezvous = dict(slurm, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    tasks = [_zerobench_run(tmp_path / "slurm.json", dict(rendezvous, SLURM_PROCID=r, SLURM_LOCALID=r)) for r in "01"]
    logs = [t.communicate(timeout=300)[0] for t in tasks]
    assert [t.returncode for t in tasks] == [0, 0], logs
    for rank, log in enumerate(logs):
        assert f"rank {rank} of 2 from SLURM (job 7, rendezvous 127.0.0.1:{port})" in log
    launched = _zerobench_run(tmp_path / "launched.json", base)
    assert launched.wait(timeout=300) == 0, launched.communicate()[0]
    slurm_rec, own = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("slurm", "launched"))
    assert slurm_rec["status"] == own["status"] == "ok" and slurm_rec["world_size"] == 2
    for key in ("first_loss", "last_loss", "param_bytes", "grad_bytes", "optimizer_bytes"):
        assert slurm_rec[key] == own[key], key


def test_a_step_of_the_wrong_size_fails_naming_both_sizes(tmp_path):
    env = dict(os.environ, SLURM_JOB_ID="7", SLURM_STEP_ID="0", SLURM_NTASKS="3", SLURM_PROCID="0")
    env.update(SLURM_LOCALID="0", SLURM_STEP_NODELIST="localhost")
    out = _zerobench_run(tmp_path / "r.json", env).communicate(timeout=120)[0]
    assert "SLURM step has 3 tasks but the trial's world size (dp x mp) is 2" in out


def _run_trial_jobs(dry_run: str, rule: str = "run_trial") -> list[tuple[dict, str]]:
    """(resources, shell command) of every `rule` job in a `snakemake -n -p` listing."""
    jobs = []
    for block in dry_run.split(f"rule {rule}:")[1:]:
        resources = dict(
            item.split("=", 1) for item in re.search(r"resources: (.*)", block).group(1).split(", ") if "=" in item
        )
        jobs.append((resources, re.search(r"\n(\S.*--device cuda.*)", block).group(1)))
    return jobs


def test_slurm_gpu_profile_plans_measured_sheets_at_their_world_sizes(tmp_path):
    """Every sheet of the default target switched to `source: measured`: each trial is a job of
    world-size GPUs and tasks, whose ranks `srun` starts, one per GPU."""
    repo = _copy_workflow(tmp_path / "repo")
    for sheet in (repo / "workflows/config/sheets").glob("*.yaml"):
        data = yaml.safe_load(sheet.read_text())
        for group in data.get("trials", []):
            group["source"] = "measured"
        sheet.write_text(yaml.safe_dump(data, sort_keys=False))
    out = snakemake("-n", "-p", "--workflow-profile", "workflows/profiles/slurm", cwd=repo)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    jobs = _run_trial_jobs(out.stdout)
    worlds = set()
    for resources, shell in jobs:
        flags = dict(re.findall(r"--(gpus|dp|mp) (\d+)", shell))
        world = int(flags.get("gpus") or int(flags.get("dp", 1)) * int(flags.get("mp", 1)))
        worlds.add(world)
        assert int(resources["gpu"]) == int(resources["tasks"]) == world, (resources, shell)
        launch = f"srun -n {world}" if world > 1 else ""  # one rank: the command runs once in the job
        assert resources["mpi"] == launch and f"{launch} python -m zerobench.cli run" in shell, shell
        assert shell.count("srun") == (world > 1), shell
        assert resources["tasks_per_gpu"] == "0" and resources["cpus_per_gpu"] == "8"
    assert len(jobs) >= 20 and {1, 2, 4, 64} <= worlds, sorted(worlds)  # fig1's sizes at least
    # superlinear's interleaved group: one job holding its largest trial's GPUs, srun for each run
    (block,) = out.stdout.split("rule run_interleaved:")[1:]
    assert "gpu=2, tasks=2" in block and "--device cuda" in block and "--launcher 'srun'" in block, block


# -- a real cluster -------------------------------------------------------------------------------


def _cluster(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLUSTER), *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def slurm_cluster():
    """The one-node cluster, started here if it is not up, and stopped again if this started it."""
    if os.environ.get("CI") != "true" and os.environ.get("ZEROBENCH_SLURM_TEST") != "1":
        pytest.skip("starts SLURM daemons: runs under `make test-slurm` or CI=true")
    started = _cluster("status").returncode != 0
    if started:
        up = _cluster("up")
        assert up.returncode == 0, up.stdout + up.stderr
    yield
    if started:
        _cluster("down")


# fig1's claim at CI scale: one rank (a single task; the command runs once in the job) and two ranks
# (one SLURM step of two tasks); modelled rows stay on the submit host.
SHEET = {
    "title": "SLURM check: model-state memory per rank",
    "paper": "Fig 1 (paper §5)",
    "claim": "Model-state bytes per rank equal the formula, measured through SLURM.",
    "table": "fig1",
    "tolerance_pct": 1,
    "trials": [
        {"source": "measured", "base": {"model": "tiny", "precision": "bf16", "steps": 1, "warmup": 1},
         "grid": {"stage": [0, 3], "dp": [1, 2]}},
        {"source": "modelled", "base": {"model": "gpt-8b", "precision": "fp16", "dp": 64, "stage": 3,
         "hardware": "v100-32gb-dgx2"}},
    ],
}  # fmt: skip


# Built once in the repository, not again through SLURM: the committed CPU calibration (minutes of
# microbenchmarks; the `calibrate` rule's own test is tests/unit/test_calibrate.py) and the plans that
# REPORT reads (several minutes of plan_validation; tests/unit/test_plan.py).
PREBUILT = [
    "results/profiles/calibrated-cpu.json",
    "results/plan_validation.csv",
    *(str(p.relative_to(ROOT)) for p in sorted(ROOT.glob("results/plan/*.csv"))),
    *(str(p.relative_to(ROOT)) for p in sorted(ROOT.glob("figures/plan_*.png"))),
]


def test_slurm_gpu_profile_plans_the_emulated_paper_sheets_one_gpu_each(tmp_path):
    """The paper-scale emulated sheets (one rank of 64-400 GPUs each): every trial one job on one GPU,
    whatever its world's size, started once (no srun), on cuda under the V100's 32 GB."""
    repo = _copy_workflow(tmp_path / "repo")
    names = ["fig3_emulated", "fig6_emulated", "fig7_emulated", "fig8_emulated"]
    out = snakemake("-n", "-p", "--workflow-profile", "workflows/profiles/slurm", "--config", "device=cuda",
                    f"sheets=[{','.join(names)}]", cwd=repo)  # fmt: skip
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    jobs = _run_trial_jobs(out.stdout, "emulate_trial")
    planned = [t for n in names for g in sheet_trials(load_sheet(n)) for t in g if t["source"] == "emulated"]
    assert len(jobs) == len(planned) == 27, len(jobs)
    for resources, shell in jobs:
        assert resources["gpu"] == "1" and "srun" not in shell, (resources, shell)
        assert "python -m zerobench.cli emulate --device cuda" in shell and "--mem-cap-mb 32768" in shell, shell
    assert "rule run_trial:" not in out.stdout


def test_slurm_cpu_profile_runs_a_sheet_on_a_real_cluster(slurm_cluster, tmp_path):
    """A sheet's measured trials go through sbatch; each dp-2 trial is one SLURM step of two tasks,
    each a rank that joined from SLURM's environment; the table and report are built from the records."""
    repo = _copy_workflow(tmp_path / "repo")
    for path in PREBUILT:  # copied after the workflow, so newer than the inputs they were built from
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, repo / path)
    (repo / "workflows/config/sheets/slurm_check.yaml").write_text(yaml.safe_dump(SHEET, sort_keys=False))
    (repo / "config.yaml").write_text("sheets: [slurm_check]\ndevice: cpu\ntime_limit_s: 300\n")
    out = snakemake(
        "--workflow-profile", "workflows/profiles/slurm-cpu", "--configfile", "config.yaml",
        "--replace-workflow-config", "--slurm-init-seconds-before-status-checks", "2", cwd=repo, timeout=900,
        slurm_controller=True,
    )  # fmt: skip
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    records = {p.stem: json.loads(p.read_text()) for p in (repo / "results/runs").glob("measured_*.json")}
    assert sorted(r["world_size"] for r in records.values()) == [1, 1, 2, 2]
    for name, record in records.items():
        assert record["status"] == "ok", record.get("error")
        log = (repo / "results/logs" / f"{name}.log").read_text()
        joined = re.findall(r"rank (\d) of 2 from SLURM \(job (\d+), rendezvous ([^:]+):", log)
        if record["world_size"] == 1:
            assert not joined, log[-2000:]
            continue
        attempts = 2 if "slow_spell_rerun" in record else 1  # a slow spell runs the trial once more
        assert sorted(rank for rank, _, _ in joined) == ["0"] * attempts + ["1"] * attempts, log[-2000:]
        _, job, host = joined[0]
        assert host == socket.gethostname().split(".")[0]  # the step's first node, from scontrol
        steps = subprocess.run(
            ["sacct", "-j", job, "-n", "-P", "-o", "JobID,NTasks,State"], capture_output=True, text=True, check=True
        ).stdout.split()
        assert f"{job}.0|2|COMPLETED" in steps, steps  # SLURM's own record: one step, two tasks
    table = pd.read_csv(repo / "results/slurm_check.csv")
    assert set(table[table.source == "measured"].status) == {"ok"} and (table.source == "modelled").any()
    assert table[table.source == "measured"].error_pct.abs().max() < 1.0
    assert "**Verdict.**" in (repo / "results/REPORT.md").read_text()
