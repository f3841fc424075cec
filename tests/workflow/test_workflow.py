"""The Snakemake workflow: lint, format, dry runs of the default and SLURM configurations, schema
validation that names a mistyped key, and a real smoke run into a temporary directory (tiny
models, dp <= 2, stages 0-3, paper-scale modelled rows) whose tables, figures and report parse,
whose `snakemake --report` HTML holds every figure with its sheet's claim, and whose CI smoke
benchmark (`snakemake smoke`) matches the committed baseline and fails on a changed number."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")
SMOKE = ["--configfile", "workflows/config/smoke.yaml", "--replace-workflow-config"]


def snakemake(
    *args: str, cwd: Path = ROOT, timeout: float = 120, slurm_controller: bool = False
) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")  # `python` in rules = this venv
    if not slurm_controller:
        # Snakemake loads the SLURM executor plugin at every start, and the plugin asks `scontrol show
        # config` for its help text. Where slurm's client is installed but no controller runs (after
        # `make test-slurm` has stopped its cluster) scontrol retries until its timeout, on every call.
        # An empty config makes it fail at once; only the real-cluster test asks SLURM anything.
        env["SLURM_CONF"] = os.devnull
    return subprocess.run([SNAKEMAKE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_lint_and_format_are_clean():
    lint = snakemake("--lint")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = subprocess.run([str(BIN / "snakefmt"), "--check", "Snakefile", "workflows/"], cwd=ROOT, capture_output=True)
    assert fmt.returncode == 0, fmt.stderr.decode()
    for ruff in (["check"], ["format", "--check"]):  # the Python side: `make lint`
        out = subprocess.run([str(BIN / "ruff"), *ruff, "zerobench", "tests"], cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr


def test_default_target_dry_run_plans_every_artifact(tmp_path):
    out = snakemake("-n", "--directory", str(tmp_path), "--workflow-profile", "workflows/profiles/local")
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    for rule in ("run_trial", "trace_trial", "model_group", "table", "plot", "report"):
        assert f"rule {rule}:" in text or f"\n{rule} " in text, rule
    for artifact in ("fig1", "fig2", "fig9_loss", "capacity", "table1", "comm_volume", "today", "superlinear"):
        assert f"figures/{artifact}.png" in text


def test_slurm_profile_dry_run_holds_world_size_gpus(tmp_path):
    out = snakemake(
        "-n", "--directory", str(tmp_path), "--workflow-profile", "workflows/profiles/slurm", "-p", "--verbose"
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    # fig1's dp 4 trial asks for 4 GPUs, runs on cuda, and keeps dp from the sheet
    assert "--dp 4" in text and "--device cuda" in text
    assert "gpu=4" in text.replace(" ", "")


HEAVY = ("run_trial", "trace_trial", "emulate_trial", "model_group", "run_interleaved", "peers", "calibrate", "plan",
         "plan_validation")  # fmt: skip


def _jobs(out: subprocess.CompletedProcess) -> dict[str, int]:
    """A dry run's job counts by rule ({} when there is nothing to be done)."""
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    if "Nothing to be done" in text:
        return {}
    table = text[text.index("Job stats:") : text.index("\ntotal")].splitlines()[3:]
    return {rule: int(count) for rule, count in (line.split() for line in table)}


def test_a_fresh_clone_redoes_nothing_and_an_edit_reruns_what_reads_it(tmp_path):
    """A clone dates its files by when git wrote them; the Snakefile dates them as their commit
    (sweeps/checkout_times.py), so a fresh clone's reproduction runs nothing, and an edited input
    reruns only the rules that read it. The clone holds the working tree as `git stash create` sees
    it (HEAD in CI, a developer's edits included)."""
    repo = tmp_path / "clone"
    snapshot = subprocess.run(["git", "stash", "create"], cwd=ROOT, capture_output=True, text=True, check=True)
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(ROOT), str(repo)], check=True)
    rev = snapshot.stdout.strip() or "HEAD"
    subprocess.run(["git", "checkout", "-q", rev], cwd=repo, check=True)
    dry = ("-n", "--workflow-profile", "workflows/profiles/local")
    assert _jobs(snakemake(*dry, cwd=repo)) == {}
    plans, runs = repo / "workflows/config/plans.yaml", repo / "zerobench/data/external_runs.csv"
    for edited in (plans, runs):
        edited.write_text(edited.read_text() + "\n")
    jobs = _jobs(snakemake(*dry, cwd=repo))
    requests = yaml.safe_load(plans.read_text())["requests"]
    assert {rule: n for rule, n in jobs.items() if rule in HEAVY} == {"plan": len(requests), "plan_validation": 1}
    subprocess.run(["git", "checkout", "-q", "--", "."], cwd=repo, check=True)  # the edits undone
    assert _jobs(snakemake(*dry, cwd=repo)) == {}


def _copy_workflow(dst: Path) -> Path:
    dst.mkdir()
    for name in ("Snakefile", "workflows"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst / name)
    return dst


def test_mistyped_sheet_key_fails_before_any_trial(tmp_path):
    repo = _copy_workflow(tmp_path / "repo")
    sheet = repo / "workflows/config/sheets/fig1.yaml"
    sheet.write_text(sheet.read_text().replace("grid: {stage: [0, 1, 2, 3], dp: [1, 2, 4]}", "grid: {stgae: [0, 1]}"))
    out = snakemake("-n", cwd=repo)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "stgae" in text and "fig1.yaml" in text, text[-2000:]
    assert not (repo / "results").exists()


def test_mistyped_smoke_benchmark_key_fails_naming_it(tmp_path):
    repo = _copy_workflow(tmp_path / "repo")
    spec = repo / "workflows/config/smoke_benchmark.yaml"
    spec.write_text(spec.read_text().replace("micro_batch: 2", "micro_bach: 2"))
    out = snakemake("-n", "smoke", cwd=repo)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "micro_bach" in text and "smoke_benchmark.yaml" in text, text[-2000:]


def test_mistyped_config_key_fails(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sheets: [fig8]\ntime_limt_s: 5\n")
    out = snakemake("-n", "--directory", str(tmp_path), "--configfile", str(bad), "--replace-workflow-config")
    assert out.returncode != 0 and "time_limt_s" in out.stdout + out.stderr


def _check_html_report(tmp_path: Path) -> None:
    """`snakemake --report`: one self-contained HTML with every figure, captioned by its sheet's claim."""
    html = tmp_path / "report.html"
    out = snakemake("--directory", str(tmp_path), *SMOKE, "--report", str(html))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "WARNING" not in out.stderr, out.stderr[-3000:]  # e.g. a caption docutils cannot parse
    text = html.read_text()
    smoke = yaml.safe_load((ROOT / "workflows/config/smoke.yaml").read_text())
    for name in smoke["sheets"]:
        claim = yaml.safe_load((ROOT / f"workflows/config/sheets/{name}.yaml").read_text())["claim"]
        assert f"{name}.png" in text and f"{name}.csv" in text, name
        assert " ".join(claim.split()[:6]) in text, name  # the caption: the sheet's claim


def _check_smoke_benchmark(tmp_path: Path) -> None:
    """`snakemake smoke` matched the committed baseline; a changed byte count or loss fails it."""
    result = json.loads((tmp_path / "results/smoke.json").read_text())
    assert result["ok"] and not result["differences"]
    assert len(result["timing_ratios_not_gated"]) == 4  # stages 0-3, reported as ratios only
    baseline = json.loads((ROOT / "workflows/config/smoke_baseline.json").read_text())
    records = [str(tmp_path / f"results/runs/{name}.json") for name in baseline]
    z3 = next(name for name in baseline if "z3" in name and name.startswith("measured"))
    baseline[z3]["param_bytes"] += 2  # as if the engine kept one more bf16 element per rank
    baseline[z3]["losses"][-1] *= 1 + 1e-4
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(baseline))
    cmd = [sys.executable, "-m", "zerobench.checks.smoke", *records, "--baseline", str(tampered), "--out", "/dev/null"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 1
    assert f"/{z3}/param_bytes" in out.stderr and f"/{z3}/losses[2]" in out.stderr, out.stderr
    assert out.stderr.count("CHANGED") == 2


@pytest.mark.ci
@pytest.mark.slow
def test_smoke_run_writes_parseable_results(tmp_path):
    """The whole smoke workflow end to end (about 100 s on two cores): its tables, claims, report
    and gate have fast tests of their own (test_tables, test_claims, test_report_verdicts,
    test_smoke_gate), so it runs in CI only."""
    # The committed calibrated profile stands in for a calibration (minutes of microbenchmarks, the
    # `calibrate` rule's own test is tests/unit/test_calibrate.py): the run plans no calibrate job.
    profile = tmp_path / "results/profiles/calibrated-cpu.json"
    profile.parent.mkdir(parents=True)
    shutil.copy(ROOT / "results/profiles/calibrated-cpu.json", profile)
    out = snakemake(
        "--cores", "2", "--directory", str(tmp_path), *SMOKE, "--workflow-profile", "workflows/profiles/local",
        "all", "smoke", timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    _check_html_report(tmp_path)
    _check_smoke_benchmark(tmp_path)
    runs = sorted((tmp_path / "results/runs").rglob("*.json"))  # modelled groups: one directory each
    assert {json.loads(p.read_text())["source"] for p in runs} == {"measured", "modelled", "traced"}
    records = [json.loads(p.read_text()) for p in runs]
    capacity = [r for r in records if r.get("mem_cap_bytes")]
    assert {r["status"] for r in capacity} == {"ok", "oom"}  # the budget stops the 16-layer baseline
    assert all(r["status"] in ("ok", "oom") for r in records), [(r["status"], r["error"]) for r in records]
    for name in ("fig1", "comm_volume", "fig9_loss", "capacity", "fig8"):
        df = pd.read_csv(tmp_path / f"results/{name}.csv")
        assert len(df) and {"key", "ours", "error_pct"} <= set(df.columns), name
        assert (tmp_path / f"figures/{name}.png").read_bytes()[:4] == b"\x89PNG"
    comm = pd.read_csv(tmp_path / "results/comm_volume.csv")
    assert comm.error_pct.abs().max() < 1.0  # 2Ψ / 2Ψ / 2Ψ / 3Ψ from the ledger
    report = (tmp_path / "results/REPORT.md").read_text()
    assert report.count("**Verdict.**") == 5
    # committed results/ untouched: the smoke run wrote only under tmp_path
    assert not any(p.name.startswith("measured_tiny-dp2") for p in (ROOT / "results/runs").glob("*.json"))
    # a sweep interrupted before one trial and what depends on it redoes exactly those
    trial = tmp_path / "results/runs/measured_tiny-dp2-z0-bf16-b2-n3-w0-seed0.json"  # fig1, comm_volume, smoke
    for path in (
        trial,
        tmp_path / "results/fig1.csv",
        tmp_path / "results/comm_volume.csv",
        tmp_path / "results/REPORT.md",
    ):
        path.unlink()
    again = snakemake("-n", "--directory", str(tmp_path), *SMOKE, "--workflow-profile", "workflows/profiles/local")
    assert again.returncode == 0, again.stderr
    block = again.stdout.split("Job stats:")[1].split("Reasons:")[0]
    stats = dict(
        row.split()
        for row in block.splitlines()
        if len(row.split()) == 2 and row.split()[0].isidentifier() and row.split()[1].isdigit()
    )
    assert stats == {"run_trial": "1", "table": "2", "plot": "2", "claims": "1", "report": "1", "all": "1",
                     "total": "8"}, stats  # fmt: skip
    assert trial.name in again.stdout
