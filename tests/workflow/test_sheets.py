"""Sheets of trials (zerobench/sweeps/sheets.py), the largest-that-fits policy (zerobench/trial/policy.py),
modelled groups in one process (zerobench/sweeps/groups.py) and a paper sheet planned on SLURM as
measured trials."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_workflow import snakemake

from zerobench import cli
from zerobench.artifacts.tables.build import build
from zerobench.engine.config import PRESETS, ConfigError, PrecisionConfig
from zerobench.perfmodel import get_profile
from zerobench.perfmodel.constants import DEFAULT
from zerobench.perfmodel.feasibility import max_micro_batch
from zerobench.perfmodel.paper_setups import zero_parallel
from zerobench.sweeps import groups as sweep
from zerobench.sweeps import sheets
from zerobench.trial.errors import InputError
from zerobench.trial.policy import largest_that_fits

ROOT = Path(__file__).resolve().parents[2]


def _sheet(tmp_path: Path, trials: list[dict], table: str = "sweep") -> Path:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(dict(title="t", paper="p", claim="c", table=table, tolerance_pct=1, trials=trials)))
    return path


def test_cases_over_base_times_grid_in_sheet_order():
    group = dict(source="modelled", base=dict(mp=1, micro_batch=4), cases=[dict(model="a"), dict(model="b", mp=2)],
                 grid=dict(stage=[0, 3]))  # fmt: skip
    trials = sheets.expand_group(group)
    assert [(t["model"], t["mp"], t["stage"]) for t in trials] == [("a", 1, 0), ("a", 1, 3), ("b", 2, 0), ("b", 2, 3)]
    assert len({sheets.trial_id(t) for t in trials}) == 4


def test_unknown_field_fails_before_anything_runs_naming_it(tmp_path):
    path = _sheet(tmp_path, [dict(source="modelled", cases=[dict(model="gpt-8b", micro_bach=2)])])
    with pytest.raises(InputError, match="case 0: unknown field 'micro_bach'"):
        sheets.load_sheet(path)
    out = tmp_path / "out"
    assert cli.main(["sweep", str(path), "--outdir", str(out)]) == 2
    assert not out.exists()


def test_engine_flags_drop_model_only_fields():
    trial = dict(source="measured", model="gpt-8b", gpus=400, mp=4, hardware="v100-32gb-dgx2", zero_os=True,
                 zero_config="C5", micro_batch=64, micro_batch_policy="largest_fits", attention="fused",
                 label="x")  # fmt: skip
    flags = " ".join(sheets.trial_flags(trial))
    assert "--gpus 400 --mp 4" in flags and "--zero-config C5" in flags
    assert "--micro-batch-policy largest_fits" in flags
    assert not any(f in flags for f in ("--hardware", "--zero-os", "--attention", "x"))
    modelled = " ".join(sheets.trial_flags({**trial, "source": "modelled"}))
    assert "--gpus 400" in modelled and "--zero-os" in modelled and "--attention fused" in modelled
    traced = sheets.trial_flags({**trial, "source": "traced"})
    assert "--micro-batch-policy" not in traced


def test_a_repeat_is_a_trial_of_its_own_with_the_same_flags():
    trial = dict(source="measured", model="cpu-10m", dp=2, steps=30, allocator="system")
    again = {**trial, "repeat": 2}
    assert sheets.trial_flags(again) == sheets.trial_flags(trial)  # the engine runs the same trial
    assert sheets.trial_id(again) == sheets.trial_id(trial) + "-rep2"  # ... into a record of its own


def test_largest_that_fits_bisects_to_the_exact_boundary():
    for limit in (0, 1, 5, 7, 16, 40):
        for upper in (1, 7, 16):
            record, attempts = largest_that_fits(lambda b, n=limit: dict(status="ok" if b <= n else "oom", b=b), upper)
            assert record["b"] == (min(limit, upper) or 1) and record["status"] == ("ok" if limit else "oom")
            assert attempts[0] == [upper, record["status"] if limit >= upper else "oom"]
    # a status other than ok / oom ends the search with that record
    record, attempts = largest_that_fits(lambda b: dict(status="oom" if b > 4 else "error", b=b), 16)
    assert record["status"] == "error" and attempts == [[16, "oom"], [8, "oom"], [4, "error"]]


def test_modelled_policy_runs_the_listed_batch_capped_at_what_fits():
    # Fig 7's 60B C3 (P_os+g, no P_a) at AE Table 5's batch 32: 40 GB of checkpoints on a V100
    model, hw = dataclasses.replace(PRESETS["gpt-60b-scaling"], heads=64), get_profile("v100-32gb-dgx2")
    par = zero_parallel(128, 16, "C3")  # C_B and M_D with it
    fits = max_micro_batch(model, par, PrecisionConfig(mode="fp16", device="cuda"), hw, DEFAULT)
    assert 1 < fits < 32  # the paper's listed 32 does not fit: a real step-down
    trial = dict(source="modelled", model="gpt-60b-scaling", heads=64, gpus=128, mp=16, zero_config="C3",
                 checkpoint_activations=True, bucket_mb=700_000_000 / 2**20, precision="fp16", micro_batch=32,
                 micro_batch_policy="largest_fits")  # fmt: skip
    record = sweep.model_trial(trial)
    assert record["status"] == "ok" and record["micro_batch"] == fits and record["listed_micro_batch"] == 32
    assert record["attempts"][0] == [32, "oom"] and [fits, "ok"] in record["attempts"]
    assert "needs" in record["capped_by"] and "activations" in record["capped_by"]  # what did not fit, by term


def test_measured_run_steps_down_on_oom_and_records_what_ran(tmp_path, monkeypatch):
    """The measured source's loop around the trial runner: each attempt a run; here a stand-in
    runner whose budget holds 5 sequences (a real measured step-down is the engine's oom status)."""
    from zerobench.record_files import read_record
    from zerobench.sources import measured
    from zerobench.trial import new_record

    ran = []

    def run_once(values, argv, spec, listed):
        batch = spec.train.micro_batch
        ran.append(batch)
        return new_record("measured", status="ok" if batch <= 5 else "oom", micro_batch=batch)

    monkeypatch.setattr(measured, "_run_once", run_once)
    out = tmp_path / "r.json"
    assert cli.main(["run", "--micro-batch", "16", "--micro-batch-policy", "largest_fits", "--out", str(out)]) == 0
    record = read_record(out)
    assert record["micro_batch"] == 5 and record["listed_micro_batch"] == 16 and ran[0] == 16
    assert record["attempts"] == [[b, "ok" if b <= 5 else "oom"] for b in ran]


def test_a_run_at_its_listed_size_never_enters_the_search(monkeypatch):
    """`micro_batch_policy: listed` (the default): one attempt at the listed micro-batch, straight
    from the flag to the runner, the search not called."""
    from zerobench.sources import measured
    from zerobench.trial import new_record, policy

    def no_search(*_):
        raise AssertionError("the search ran for a listed trial")

    ran = []

    def run_once(values, argv, spec, listed):
        ran.append(spec.train.micro_batch)
        return new_record("measured", micro_batch=spec.train.micro_batch)

    monkeypatch.setattr(policy, "search", no_search)
    monkeypatch.setattr(measured, "_run_once", run_once)
    assert cli.main(["run", "--micro-batch", "7"]) == 0 and ran == [7]


def test_the_paper_bucket_is_named_once_and_resolved_before_the_trial_id():
    """`bucket_mb: paper` is the paper's C_B (engine/config.py PAPER_BUCKET), in MiB, before the
    trial's id and flags are made; a word the field does not know is refused, naming it."""
    from zerobench.engine.config import PAPER_BUCKET

    group = dict(source="modelled", base=dict(model="gpt-8b", gpus=64, bucket_mb="paper"))
    (trial,) = sheets.expand_group(group)
    assert trial["bucket_mb"] * 2**20 == PAPER_BUCKET == 700_000_000
    assert "-cb667.572021484375" in sheets.trial_id(trial)
    flags = sheets.trial_flags(trial)
    assert flags[flags.index("--bucket-mb") + 1] == "667.572021484375"
    with pytest.raises(InputError, match="bucket_mb='papr'"):
        sheets.expand_group(dict(group, base=dict(group["base"], bucket_mb="papr")))


def test_sweep_goes_on_past_infeasible_and_oom_trials(tmp_path):
    base = dict(hardware="h100-80gb", precision="fp16", checkpoint_activations=True, micro_batch=4)
    path = _sheet(tmp_path, [
        dict(source="modelled", base=base, cases=[dict(model="gpt-8b", gpus=64, mp=8),  # fits
                                                  dict(model="gpt-8b", gpus=100, mp=8),  # dp x mp != gpus
                                                  dict(model="gpt-170b", gpus=64, mp=1, stage=0)]),  # too big
    ])  # fmt: skip
    out = tmp_path / "runs"
    assert cli.main(["sweep", str(path), "--outdir", str(out)]) == 0
    df = build("sweep", [str(out)], str(path))
    assert df.status.tolist() == ["ok", "infeasible", "oom"]
    assert "gpus=100" in df.error.iloc[1] and "GB usable" in df.error.iloc[2]
    assert df.ours.iloc[0] > 0 and df.ours.iloc[1:].isna().all()


def test_paper_sheet_switched_to_measured_plans_engine_trials_on_slurm(tmp_path):
    """Fig 2's sheet with `source: measured` and the SLURM profile: engine trials of the paper's
    world sizes (400 GPUs as dp x mp), each holding its world size in GPUs, no code change."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("Snakefile", "workflows"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, repo / name)
    sheet = repo / "workflows/config/sheets/fig2.yaml"
    sheet.write_text(sheet.read_text().replace("source: modelled", "source: measured"))
    out = snakemake("-n", "-p", "--verbose", "--workflow-profile", "workflows/profiles/slurm", "results/fig2.csv",
                    cwd=repo)  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "rule run_trial:" in text and "model_group" not in text
    jobs = [block for block in text.split("rule run_trial:")[1:]]
    assert len(jobs) == 27  # 9 sizes x (C4, C5) for ZeRO, 9 baselines
    assert "--model gpt-170b --gpus 400 --mp 16" in text and "--zero-config C5" in text and "--device cuda" in text
    assert "--model gpt-170b --heads 256 --gpus 256 --mp 256" in text
    assert "--micro-batch-policy largest_fits" in text and "--hardware" not in text
    gpus = sorted({int(line.split("gpu=")[1].split(",")[0]) for line in text.replace(" ", "").splitlines()
                   if "gpu=" in line})  # fmt: skip
    assert gpus == [256, 384, 400]


@pytest.mark.ci
def test_committed_paper_records_join_their_sheets():
    """Every committed modelled record of a paper sheet is one of its trials, and rebuilding the
    table from them gives the committed CSV's numbers.

    Rebuilds two paper tables from their committed records (about 25 s: each row predicted again),
    so it runs in CI only, where it holds the committed results on every landing."""
    for name in ("fig7", "table2"):
        dirs = sorted(str(p) for p in (ROOT / "results/runs").glob(f"{name}.g*"))
        df = build(name, dirs, name)
        import pandas as pd

        committed = pd.read_csv(ROOT / f"results/{name}.csv")
        assert df.key.tolist() == committed.key.tolist()
        assert df.ours.fillna(-1).tolist() == pytest.approx(committed.ours.fillna(-1).tolist(), rel=1e-12)
        assert json.loads(Path(next(iter(Path(dirs[0]).glob("*.json")))).read_text())["source"] == "modelled"


def test_a_time_limited_attempt_runs_its_own_size_without_a_search():
    """Under --time-limit each attempt is a child process: its flags pin the attempt's size."""
    from zerobench.sources import measured
    from zerobench.trial.policy import at_size, listed_flags

    argv = ["run", "--micro-batch", "16", "--micro-batch-policy", "largest_fits", "--layers", "8"]
    listed = measured.spec(vars(cli.parser().parse_args(argv)))
    child = cli.parser().parse_args([*argv, *listed_flags(at_size(listed, "micro_batch", 5), listed)])
    assert (child.micro_batch, child.micro_batch_policy) == (5, "listed")
    assert (child.layers, child.layers_policy) == (8, "listed")


def test_measured_layout_that_cannot_exist_is_an_infeasible_row(tmp_path):
    """dp x mp != gpus on the engine: a record saying so, before any rank starts."""
    from zerobench.record_files import read_record

    trial = dict(source="measured", model="tiny", gpus=3, mp=2, steps=1)
    out = tmp_path / "r.json"
    assert cli.main(["run", *sheets.trial_flags(trial), "--out", str(out)]) == 0
    record = read_record(out)
    assert record["status"] == "infeasible" and "gpus=3" in record["error"]


def test_a_thousand_trial_modelled_sweep_is_one_job(tmp_path):
    """Sweeps that scale: a modelled group is one job however many trials it has (README "Sweep
    your own" has the measured cost per trial)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("Snakefile", "workflows"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, repo / name)
    grid = dict(model=["gpt-1.5b", "gpt-8b", "gpt-20b", "gpt-40b", "gpt-60b", "gpt-80b", "gpt-100b", "gpt-120b",
                       "gpt-140b", "gpt-170b"], gpus=[64, 128, 256, 512, 1024], stage=[0, 1, 2, 3],
                micro_batch=[1, 2, 4, 8, 16])  # fmt: skip
    _sheet(repo / "workflows/config/sheets", [dict(source="modelled", base=dict(mp=8), grid=grid)])
    assert len(sheets.sheet_trials(sheets.load_sheet(repo / "workflows/config/sheets/mine.yaml"))[0]) == 1000
    out = snakemake("-n", "--config", "sheets=[mine]", "--", "results/mine.csv", cwd=repo)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    stats = out.stdout.split("Job stats:")[1].split("\n\n")[0]
    assert [line.split() for line in stats.splitlines()[3:]] == [["model_group", "1"], ["table", "1"], ["total", "2"]]


def test_the_sheet_schema_is_the_field_table():
    """workflows/schemas/sheet.schema.yaml's trial fields are made from zerobench/trial/fields.py
    (`python -m zerobench.sweeps.sheets` rewrites them after a field is added)."""
    with open(sheets.SCHEMA) as f:
        schema = yaml.safe_load(f)
    made = sheets.schema_fields()
    assert schema["$defs"]["fields"]["properties"] == made["properties"]
    assert schema["$defs"]["fieldnames"]["enum"] == made["names"]
    assert made["properties"]["stage"] == {"type": "integer", "enum": [0, 1, 2, 3],
                                           "description": "ZeRO-DP stage 0-3 (0 = plain DP)"}  # fmt: skip
    # the workflow's config sets the device for every trial; a sheet's trial may set its own (the
    # paper-scale emulated sheets: cuda), named in its id and given as its flag
    cuda = {"source": "emulated", "model": "gpt-60b", "dp": 4, "device": "cuda"}
    assert sheets.trial_id(cuda).endswith("-cuda") and sheets.trial_flags(cuda)[-2:] == ["--device", "cuda"]
    assert "cuda" not in sheets.trial_id({**cuda, "device": None})


def test_a_field_added_to_the_table_reaches_flags_sheets_ids_and_configs():
    """weight_decay, a TrainConfig field that had no flag, is one row of zerobench/trial/fields.py: from it
    the `run` flag, the sheet field, the trial-id tag and the value in the configs."""
    from zerobench.trial import configs
    from zerobench.trial.fields import FIELDS

    assert FIELDS["weight_decay"].default == 0.0  # TrainConfig's own default
    args = cli.parser().parse_args(["run", "--weight-decay", "0.1"])
    assert configs(vars(args))[3].weight_decay == 0.1
    trial = dict(source="measured", model="tiny", dp=2, weight_decay=0.1)
    sheets.check_sheet({"trials": [dict(source="measured", base=dict(weight_decay=0.1))]}, "t")  # a sheet field
    assert sheets.trial_id(trial) == "measured_tiny-dp2-wd0.1"
    assert sheets.trial_flags(trial) == ["--model", "tiny", "--dp", "2", "--weight-decay", "0.1"]
    assert configs({**trial, "command": "run"})[3].weight_decay == 0.1
    with pytest.raises(ConfigError, match="^weight_decay="):
        configs({"weight_decay": -1.0})


def test_every_sheet_names_its_own_registry_entry():
    """An artifact is found from its sheet's name: the sheet's `table` is its name (a sheet of
    your own borrows `sweep`), the schema allows exactly the registry's entries, and each has its
    figure (plots/draw.py), keyed the same."""
    from zerobench.artifacts.plots.draw import FIGURES
    from zerobench.artifacts.tables.registry import REGISTRY

    with open(sheets.SCHEMA) as f:
        assert yaml.safe_load(f)["properties"]["table"]["enum"] == list(REGISTRY)
    for path in sorted(sheets.SHEET_DIR.glob("*.yaml")):
        assert sheets.load_sheet(path)["table"] in (path.stem, "sweep"), path.name
    assert list(FIGURES) == list(REGISTRY)


def test_an_interleaved_group_runs_round_by_round_forward_then_back():
    group = dict(source="measured", base=dict(model="tiny"), grid=dict(dp=[1, 2]), interleave=3)
    trials = sheets.expand_group(group)
    assert [(t["repeat"], t["dp"]) for t in trials] == [(1, 1), (1, 2), (2, 2), (2, 1), (3, 1), (3, 2)]
    assert len({sheets.trial_id(t) for t in trials}) == 6 and all("-rep" in sheets.trial_id(t) for t in trials)


@pytest.mark.parametrize(
    ("group", "says"),
    [
        (dict(source="modelled", interleave=2), "times measured trials; this group is modelled"),
        (dict(source="measured", interleave=1), "interleave=1; give the number of rounds, 2 or more"),
        (dict(source="measured", interleave=True), "interleave=True; give the number of rounds"),
        (dict(source="measured", interleave=2, cases=[dict(repeat=1)]), "drop the repeat field"),
    ],
)
def test_a_bad_interleave_fails_naming_it(tmp_path, group, says):
    with pytest.raises(InputError, match=says):
        sheets.load_sheet(_sheet(tmp_path, [dict(base=dict(model="tiny"), **group)]))


def test_an_interleaved_group_starts_each_run_as_run_trial_does(tmp_path, monkeypatch):
    """One `zerobench run` per trial in the group's order, one intra-op thread per rank, the
    launcher before a multi-rank trial only; a run that writes no record stops the job."""
    from zerobench.sweeps import interleave

    calls = []

    def fake_run(cmd, env):
        calls.append((cmd, env))
        Path(cmd[cmd.index("--out") + 1]).write_text("{}")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(interleave.subprocess, "run", fake_run)
    trials = sheets.expand_group(dict(source="measured", base=dict(model="tiny"), grid=dict(dp=[1, 2]), interleave=2))
    paths = interleave.run_group(trials, tmp_path, "cpu", 300, "srun")
    assert [p.stem for p in paths] == [sheets.trial_id(t) for t in trials]
    # dp 1, 2 in round 1; 2, 1 in round 2; srun starts the two ranks of a dp-2 trial
    one, two = [sys.executable, "-m", "zerobench.cli"], ["srun", "-n", "2"]
    assert [c[:3] for c, _ in calls] == [one, two, two, one]
    assert all(env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1" for _, env in calls)
    assert all("--time-limit 300 --out" in " ".join(c) and "--dp" in c for c, _ in calls)
    monkeypatch.setattr(interleave.subprocess, "run", lambda cmd, env: subprocess.CompletedProcess(cmd, 1))
    with pytest.raises(RuntimeError, match="exited 1, record written: False"):
        interleave.run_group(trials, tmp_path / "none", "cpu", 0, "")
    with pytest.raises(ValueError, match="interleaved group's measured trials"):
        interleave.run_group([dict(source="measured", model="tiny")], tmp_path, "cpu", 0, "")


@pytest.mark.ci
@pytest.mark.slow
def test_an_interleaved_sheet_runs_and_compares_each_round(tmp_path):
    """`zerobench sweep` on an interleaved group trains each trial once per round, then the
    superlinear table pairs N_d 1 and 2 within each round.

    Four real measured trials in rounds (about 25 s): the interleaving's order and pairing have fast
    tests above, so it runs in CI only."""
    base = dict(model="tiny", precision="bf16", steps=1, warmup=1)
    path = _sheet(tmp_path, [dict(source="measured", base=base, grid=dict(dp=[1, 2]), interleave=2)], "superlinear")
    out = tmp_path / "runs"
    assert cli.main(["sweep", str(path), "--group", "0", "--outdir", str(out), "--time-limit", "300"]) == 0
    records = sorted(out.glob("*.json"))
    assert len(records) == 4 and all(json.loads(p.read_text())["status"] == "ok" for p in records)
    df = build("superlinear", [str(out)], str(path))
    best = df[df.kind == "best"].set_index("dp")
    assert best.rounds[2] == 2 and best.vs_linear_low_pct[2] <= best.vs_linear_pct[2] <= best.vs_linear_high_pct[2]
