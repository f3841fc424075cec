"""The peers on one device (`zerobench peers` at world size 1, `--device cuda` on a GPU): the plain
PyTorch loop (eager and compiled), FSDP2 and ours, run here on CPU at a tiny size through the same
command; the plain loop's losses against ours; the compiled loop's wiring (with torch.compile's
"eager" backend: inductor on a CPU is too slow to compile for a unit test); the single-device table and
figure; and the GPU check script's Python commands parsing as the script gives them."""

import importlib
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.engine_cases import spec_for
from zerobench import cli
from zerobench.checks import gpu_driver
from zerobench.peers import harness, ours, plain, runner, summary
from zerobench.trial import configs


def _spec(model="awkward", **train):
    import dataclasses

    spec = spec_for(model, dp=1, steps=3, micro_batch=2)
    spec = dataclasses.replace(spec, parallel=dataclasses.replace(spec.parallel, checkpoint_activations=True))
    return dataclasses.replace(spec, train=dataclasses.replace(spec.train, **train))


@pytest.mark.ci
@pytest.mark.slow
def test_one_device_peers_run_through_the_command(tmp_path):
    """`zerobench peers` at world size 1 on CPU: no floors and no bounds, every row measured
    in its own process with TFLOPS by the step-FLOPs convention; the plain loop and FSDP2 train to
    ours' losses; ratios ours / peer at the same stage; the table and figure written.

    Each peer in a process of its own (about 13 s), so it runs in CI only."""
    csv, png = tmp_path / "peers.csv", tmp_path / "peers.png"
    argv = ["peers", "--model", "tiny", "--steps", "2", "--warmup", "1", "--checkpoint-activations",
            "--impls", "ours-0,plain,fsdp2-reshard", "--out", str(csv), "--figure", str(png)]  # fmt: skip
    assert cli.main(argv) == 0
    df = pd.read_csv(csv)
    assert list(df["impl"]) == ["ours-0", "plain", "fsdp2-reshard"]
    assert (df["status"] == "ok").all() and (df["world_size"] == 1).all() and (df["device"] == "cpu").all()
    assert (df["tflops_per_gpu"] > 0).all() and df["mfu"].isna().all() and df["peak_allocated_bytes"].isna().all()
    by = df.set_index("impl")
    m = spec_for("tiny").model
    # zerobench/flops.py's convention with recomputation, one sequence per step: 96·s·L·h²·(1 + s/6h + V/16Lh)
    flops = 96 * m.seq * m.layers * m.hidden**2 * (1 + m.seq / (6 * m.hidden) + m.vocab / (16 * m.layers * m.hidden))
    assert by.loc["plain", "tflops_per_gpu"] == pytest.approx(flops / by.loc["plain", "step_time_s"] / 1e12)
    for impl in ("plain", "fsdp2-reshard"):
        assert by.loc[impl, "loss_ref"] == "ours-0" and by.loc[impl, "loss_max_rel_diff"] < 1e-5, impl
    ratio = by.loc["ours-0", "step_time_s"] / by.loc["plain", "step_time_s"]
    assert by.loc["plain", "time_ratio_ours_over"] == pytest.approx(ratio)
    assert pd.isna(by.loc["fsdp2-reshard", "time_ratio_ours_over"])  # no ours-3 ran
    table = summary.peers_markdown(csv)
    assert "world size 1" in table and "| TFLOPS | MFU | peak RSS/rank (GiB) |" in table and "/ bound" not in table
    assert table.index("| 0 | ours-0 |") < table.index("| 0 | plain |") < table.index("| 3 | fsdp2-reshard |")
    assert png.stat().st_size > 10_000


def test_plain_loop_starts_from_ours_first_loss():
    """The plain loop (torch's checkpoint, AdamW) and our stage 0 (our checkpoint, our Adam) on the
    same seed and batches: the same first loss, and the same losses after (fp32, no weight decay:
    AdamW's update is Adam's)."""
    spec = _spec()
    theirs = plain.build("plain", spec)
    mine = ours.build("ours-0", spec)
    a = [theirs.step(s) for s in range(3)]
    b = [mine.step(s) for s in range(3)]
    assert a[0] == pytest.approx(b[0], rel=1e-6)
    assert a == pytest.approx(b, rel=1e-5)
    assert "non-reentrant checkpoint per block" in theirs.note and "AdamW(fused=True)" in theirs.note


def test_compiled_loop_compiles_each_block_and_trains_the_same():
    """`plain-compile` puts every checkpointed block under torch.compile: here with a backend that
    counts the graphs it is given and runs them as traced (inductor's kernels are for the GPU run);
    the blocks share one graph, and the losses are the eager loop's."""
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    spec = _spec()
    compiled = plain.Trainer("plain-compile", spec, backend=counting)
    assert all(isinstance(b, torch._dynamo.eval_frame.OptimizedModule) for b in compiled.model.blocks)
    eager = plain.build("plain", spec)
    assert [compiled.step(s) for s in range(2)] == pytest.approx([eager.step(s) for s in range(2)], rel=1e-5)
    assert len(graphs) == 1  # one graph serves every block: the same structure, no recompilation per block
    assert "torch.compile per block" in compiled.note


def test_what_one_device_runs_and_refuses(tmp_path):
    """One device compares ours, the plain loop and FSDP2; a world of several ranks every
    data-parallel peer but the plain loop, which is refused there (skipped row). The command refuses
    fp16 on CUDA, bf16 on CPU and more than one GPU before anything runs."""
    assert harness.default_impls(1) == list(harness.SINGLE_DEVICE)
    assert harness.default_impls(1, stage=0) == ["ours-0", "plain", "plain-compile"]
    assert not set(harness.PLAIN) & set(harness.default_impls(2))
    assert "ddp" in harness.default_impls(2) and harness.default_impls(2, stage=3)[0] == "ours-3"
    row = runner.run_one("plain", spec_for("tiny", dp=2, steps=1), log=lambda _: None)
    assert row["status"] == "skipped" and "world size 2" in row["error"]
    out = tmp_path / "p.csv"
    assert cli.main(["peers", "--device", "cuda", "--precision", "fp16", "--out", str(out)]) == 2
    assert cli.main(["peers", "--precision", "bf16", "--out", str(out)]) == 2
    assert cli.main(["peers", "--device", "cuda", "--precision", "bf16", "--dp", "2", "--out", str(out)]) == 2
    assert not out.exists()


def _cuda_row(impl, stage, t, allocated, losses, family="torch"):
    return {**dict.fromkeys(runner.COLUMNS), "impl": impl, "family": family, "stage": stage, "status": "ok",
            "step_time_s": t, "step_time_min_s": t * 0.9, "step_time_max_s": t * 1.1, "peak_rss_bytes": 2**30,
            "peak_allocated_bytes": allocated, "losses": str(losses), "model": "gpt-1.5b", "num_params": 1.6e9,
            "dp": 1, "world_size": 1, "device": "cuda", "hardware": "h200-141gb", "precision": "bf16",
            "checkpoint_activations": True, "micro_batch": 16, "global_batch": 16, "steps": 3, "warmup": 1,
            "clip_norm": 1.0, "threads_per_rank": 1, "peer_version": "x", "warmup_time_s": 2.0,
            "tflops_per_gpu": 200.0 / t, "mfu": 200.0 / t / 989.0, "loadavg_before": 1.0,
            "loadavg_after": 1.0}  # fmt: skip


def test_single_device_table_and_figure(tmp_path):
    """CUDA rows: no floor, no bound; TFLOPS, MFU and peak allocated memory in the table, the
    ratios ours / peer of time and of allocated memory, the figure's memory panel allocated."""
    gib = 2**30
    rows = runner.compare(runner.with_bounds([
        _cuda_row("ours-0", 0, 0.6, 32 * gib, [10.0, 9.0], family="zerobench"),
        _cuda_row("plain", 0, 0.5, 25 * gib, [10.0, 9.1]),
        {**_cuda_row("plain-compile", 0, 0.4, 29 * gib, [10.0, 9.1]), "warmup_time_s": 40.0},
        _cuda_row("fsdp2-reshard", 3, 0.8, 30 * gib, [10.0, 9.0]),
    ]))  # fmt: skip
    assert [r["impl"] for r in rows] == ["ours-0", "plain", "plain-compile", "fsdp2-reshard"]
    plain_row = rows[1]
    assert plain_row["time_ratio_ours_over"] == pytest.approx(1.2)
    assert plain_row["allocated_ratio_ours_over"] == pytest.approx(32 / 25)
    csv, png = tmp_path / "gpu.csv", tmp_path / "gpu.png"
    runner.write_csv(rows, csv)
    table = summary.peers_markdown(csv)
    assert "| peak allocated (GiB) |" in table and "h200-141gb datasheet" in table
    assert (
        "| 0 | plain-compile | x | 0.400 [0.360–0.440] | 40.0 | 500.0 | 0.51 | 29.00 | 1.1e-02 | 1.50 | 1.10 |" in table
    )
    assert "| 3 | fsdp2-reshard | x | 0.800 [0.720–0.880] | 2.0 | 250.0 | 0.25 | 30.00 | 0.0e+00 | — | — |" in table
    summary.plot_peers(csv, png)
    assert png.stat().st_size > 10_000


def _script_commands() -> list[list[str]]:
    """Each `python -m MODULE ...` part of scripts/gpu_check.sh's driver (checks/gpu_driver.py), as an
    argv (MODULE first), its budget given."""
    parts = gpu_driver.parts(Path("OUT"), "python")
    return [[a.replace("{budget}", "60") for a in p.argv[2:]] for p in parts if p.argv[1] == "-m"]


def test_gpu_check_script_commands_parse():
    """Every Python command the GPU check runs takes the arguments the script gives it (the peers'
    flags make a valid CUDA trial)."""
    commands = _script_commands()
    modules = {c[0] for c in commands}
    assert {"pytest", "zerobench.cli", "zerobench.checks.gpu_check", "zerobench.checks.gpu_emulated"} <= modules
    ran = set()
    for module, *argv in commands:
        if module == "zerobench.cli":
            args = cli.parser().parse_args(argv)
            ran.add(args.command)
            if args.command == "peers":
                _, parallel, precision, _ = configs(vars(args))
                assert (precision.device, precision.mode, parallel.world_size) == ("cuda", "bf16", 1)
                impls = args.impls.split(",") if args.impls else harness.default_impls(1)
                assert set(impls) <= set(harness.IMPLEMENTATIONS)
        elif module.startswith("zerobench.checks."):
            main = importlib.import_module(module).main
            with pytest.raises(SystemExit) as exc:
                main(["--help"])
            assert exc.value.code == 0
    assert {"calibrate", "peers"} <= ran
