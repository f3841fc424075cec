"""The side-by-side comparison (`zerobench peers`): our stages 0–3 train to the same losses as
DDP, ZeroRedundancyOptimizer and FSDP2 (always) and DeepSpeed 0–3 (when installed); the collective
observer agrees with our ledger and counts the peers' bytes exactly where theory is exact; the
runner, table and figure handle skipped and failed peers."""

import importlib.util
import json

import pytest
import torch
import torch.distributed as dist

from tests.engine_cases import reference_run, spec_for
from tests.worlds import spawned
from zerobench import cli
from zerobench.artifacts.report import report
from zerobench.engine.parallel.comms import Comms
from zerobench.peers import harness, runner, summary
from zerobench.peers.harness import CollectiveObserver, train_on_rank
from zerobench.peers.workload import Unavailable

TORCH_AND_OURS = ["ours-0", "ours-1", "ours-2", "ours-3", "ddp", "zero-redundancy-optimizer"]
TORCH_AND_OURS += ["fsdp2-no-reshard", "fsdp2-reshard"]
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


def _all_in_one_world(rank, spec, impls):
    """Every implementation in turn in this one world (the benchmark gives each its own; the
    losses do not care), with the observer counting their timed steps; ours then replays its
    timed steps' collectives with no compute (the bound row's), counted on a ledger of its own."""
    observer = CollectiveObserver()
    out = {}
    for impl in impls:
        observer.counts = {}
        r = train_on_rank(impl, spec, observer)
        losses = torch.tensor(r["losses"], dtype=torch.float64)
        dist.all_reduce(losses)
        ledger = r["trainer"].comms.ledger.as_dict() if impl.startswith("ours") else None
        replay = Comms()
        seconds = r["trainer"].collective_seconds(replay) if impl.startswith("ours") else None
        out[impl] = {
            "replay": replay.ledger.as_dict(),
            "replay_seconds": seconds,
            "losses": (losses / dist.get_world_size()).tolist(),
            "comm": harness.timed_collectives(r["trainer"], observer),
            "observed": dict(observer.counts),
            "ledger": ledger,
        }
    return out


@pytest.fixture(scope="module")
def tiny_world():
    spec = spec_for("awkward", dp=2, steps=3, micro_batch=2)
    spec = runner_spec(spec, warmup=1)
    return spec, spawned(2, _all_in_one_world, spec, TORCH_AND_OURS)


def runner_spec(spec, **train):
    import dataclasses

    return dataclasses.replace(spec, train=dataclasses.replace(spec.train, **train))


@pytest.mark.ci
@pytest.mark.slow
def test_torch_peers_and_our_stages_agree_on_every_loss(tiny_world):
    """The peers (DDP, ZeroRedundancyOptimizer, FSDP2) in one spawned world (about 20 s); our
    stages' parity with a single process is tested in test_zero_stages, so it runs in CI only."""
    spec, out = tiny_world
    ours = out[0]["ours-0"]["losses"]
    # anchored to plain single-process training over the whole global batch
    single = reference_run(runner_spec(spec, steps=spec.train.warmup + spec.train.steps))["losses"]
    assert ours == pytest.approx(single, rel=1e-5)
    for impl in TORCH_AND_OURS:
        for a, b in zip(out[0][impl]["losses"], ours):
            assert abs(a - b) / abs(b) < 1e-5, impl


@pytest.mark.ci
def test_observer_agrees_with_our_ledger(tiny_world):
    """The observer sees at torch.distributed's Python API what our Comms ledger records: the
    all-reduces as they are, and reduce-scatters and all-gathers (a pairwise exchange on gloo) as
    point-to-point sends of exactly the ring volume (n−1)/n of their message bytes.

    Reads the peers' spawned world (about 20 s, shared with the loss check); our ledger's bytes are
    tested exactly in test_comms and test_stage_rules, so it runs in CI only."""
    _, out = tiny_world
    for impl in ("ours-0", "ours-1", "ours-2", "ours-3"):
        seen, ledger = out[0][impl]["observed"], out[0][impl]["ledger"]
        expected = {}
        for key, e in ledger.items():
            op = key.split("/")[0]
            op, size = ("send", e["volume_bytes"]) if op in ("reduce_scatter", "all_gather") else (op, e["bytes"])
            expected[op] = expected.get(op, 0) + size
        assert {op: v["bytes"] for op, v in seen.items()} == expected, impl


@pytest.mark.ci
def test_the_bound_replays_our_collectives_without_compute(tiny_world):
    """Each of our stages issues its timed steps' collectives again after them — the same ops,
    groups, calls and bytes, one step's worth as a warm-up and then every timed step's — and
    times each step: nothing else is on that ledger, and every step took time.

    Reads the peers' spawned world (about 18 s to build), so it runs in CI only."""
    spec, out = tiny_world
    steps = spec.train.steps
    for impl in ("ours-0", "ours-1", "ours-2", "ours-3"):
        ledger, replay, seconds = (out[0][impl][k] for k in ("ledger", "replay", "replay_seconds"))
        assert set(replay) == set(ledger), impl
        for key, e in ledger.items():
            for field in ("calls", "bytes", "volume_bytes"):
                assert replay[key][field] == pytest.approx(e[field] * (steps + 1) / steps), (impl, key, field)
        assert len(seconds) == steps and min(seconds) > 0, impl


@pytest.mark.ci
def test_peer_bytes_are_exact_where_theory_is(tiny_world):
    """Per step: DDP all-reduces every gradient once (4Ψ bytes in fp32); ZeroRedundancyOptimizer
    adds one broadcast of every parameter from its owner (4Ψ); FSDP2 reduce-scatters 4Ψ (plus its
    padding) and all-gathers it once without resharding, twice with.

    Reads the peers' spawned world (about 18 s to build), so it runs in CI only."""
    spec, out = tiny_world
    psi4, steps = 4 * spec.model.num_params, spec.train.steps
    comm = {impl: {op: v["bytes"] / steps for op, v in out[0][impl]["comm"].items()} for impl in TORCH_AND_OURS}
    assert comm["ddp"] == {"all_reduce": psi4}
    assert comm["zero-redundancy-optimizer"] == {"all_reduce": psi4, "broadcast": psi4}
    rs = comm["fsdp2-no-reshard"]["reduce_scatter"]
    assert psi4 <= rs < psi4 * 1.01
    assert comm["fsdp2-no-reshard"]["all_gather"] == rs
    assert comm["fsdp2-reshard"]["all_gather"] == 2 * rs


def test_unknown_and_unavailable_implementations(monkeypatch, tmp_path):
    spec = spec_for("tiny", dp=2, steps=1)
    with pytest.raises(ValueError, match="impl='megatron'"):
        runner.run_peers(spec, ["megatron"])

    def unavailable(impl, spec):
        raise Unavailable("not on this machine")

    monkeypatch.setattr(harness.family("deepspeed-2"), "check", unavailable)
    row = runner.run_one("deepspeed-2", spec, log=lambda _: None)
    assert (row["status"], row["error"]) == ("skipped", "not on this machine")
    assert row["peer_version"].startswith("deepspeed") and json.loads(row["versions"])["torch"]
    # the CLI refuses what the peers cannot compare, naming the field
    assert cli.main(["peers", "--precision", "bf16", "--out", str(tmp_path / "p.csv")]) == 2
    assert cli.main(["peers", "--impls", "ddp,megatron", "--out", str(tmp_path / "p.csv")]) == 2
    assert not (tmp_path / "p.csv").exists()


def _row(impl, stage, t, rss, losses, family="torch"):
    return {**dict.fromkeys(runner.COLUMNS), "impl": impl, "family": family, "stage": stage, "status": "ok",
            "step_time_s": t, "step_time_min_s": t * 0.9, "step_time_max_s": t * 1.1, "peak_rss_bytes": rss,
            "losses": json.dumps(losses), "model": "tiny", "num_params": 1e6, "dp": 2, "precision": "fp32",
            "global_batch": 2, "threads_per_rank": 1, "steps": 5, "warmup": 1, "peer_version": "x",
            "comm_bytes_per_step": 8e6, "loadavg_before": 1.0, "loadavg_after": 2.0, "clip_norm": 0.0}  # fmt: skip


# host probe readings (runtime/probe.py), before and after a row: GEMM n, copy bytes, FLOP/s, bytes/s
PROBE = json.dumps([[512, 2**25, 50e9, 4e9], [512, 2**25, 50e9, 4e9]])
SLOWER = json.dumps([[512, 2**25, 40e9, 3.2e9], [512, 2**25, 40e9, 3.2e9]])  # both rates 0.8x the floor's


def test_ratios_table_and_figure(tmp_path):
    rows = runner.compare(
        runner.with_bounds(
            [
                {
                    **_row("floor", None, 1.6, 80, [9.0, 9.0], family="floor"),
                    "dp": 1,
                    "host_probe": PROBE,
                },  # no loss check
                {**_row("floor-concurrent", None, 1.8, 80, [9.0, 9.0], family="floor-concurrent"), "dp": 1},
                {**_row("ours-0", 0, 2.0, 100, [1.0, 0.5], family="zerobench"), "collective_s_per_step": 0.25},
                {**_row("ddp", 0, 4.0, 200, [1.0, 0.5001]), "host_probe": SLOWER},
                _row("fsdp2-reshard", 3, 3.0, 50, [1.0, 0.5]),  # no ours-3: loss against ours-0, no ratio, no bound
                {**_row("deepspeed-1", 1, 1.0, 1, [], family="deepspeed"), "status": "error", "error": "boom"},
            ]
        )
    )
    floor, concurrent, bound, ours, ddp, fsdp = rows[:6]
    # stage 0's bound: the floor plus ours-0's collectives with no compute, before ours-0
    assert (bound["impl"], bound["stage"], bound["step_time_s"], bound["loss_ref"]) == ("bound", 0, 1.85, None)
    assert bound["step_time_min_s"] == pytest.approx(1.44 + 0.25) and bound["comm_bytes_per_step"] == 8e6
    assert bound["time_over_bound"] == 1.0 and ours["time_over_bound"] == pytest.approx(2.0 / 1.85)
    assert ddp["time_over_bound"] == pytest.approx(4.0 / 1.85) and fsdp["time_over_bound"] is None
    assert (floor["time_over_floor"], floor["loss_ref"], floor["time_ratio_ours_over"]) == (1.0, None, None)
    assert (concurrent["time_over_floor_concurrent"], concurrent["loss_ref"]) == (1.0, None)
    assert concurrent["time_over_floor"] == pytest.approx(1.125)
    assert ddp["time_over_floor"] == 2.5 and ours["time_over_floor"] == 1.25
    assert ours["time_over_floor_concurrent"] == pytest.approx(2.0 / 1.8)
    assert ddp["time_ratio_ours_over"] == 0.5 and ddp["rss_ratio_ours_over"] == 0.5
    assert ddp["loss_max_rel_diff"] == pytest.approx(2e-4) and ddp["loss_ref"] == "ours-0"
    assert fsdp["time_ratio_ours_over"] is None and fsdp["loss_ref"] == "ours-0"
    assert (floor["host_speed"], fsdp["host_speed"]) == (1.0, None) and ddp["host_speed"] == pytest.approx(0.8)
    csv, png = tmp_path / "peers.csv", tmp_path / "peers.png"
    runner.write_csv(rows, csv)
    table = summary.peers_markdown(csv)
    assert "| 0 | ddp | x | 4.000 [3.600–4.400] | 2.50 | 2.22 | 2.16 |" in table and "| 0.50 | 0.50 |" in table
    assert "| 0 | bound | x | 1.850 [1.690–2.010] | 1.16 | 1.03 | 1.00 | — | 8.0 | — | — | — |" in table
    assert table.index("| 0 | bound |") < table.index("| 0 | ours-0 |")
    # the floors first, the one-rank floor before the concurrent one
    assert table.index("| — | floor | x | 1.600") < table.index("| — | floor-concurrent | x | 1.800")
    assert table.index("| — | floor-concurrent |") < table.index("| 0 | ours-0 |")
    assert "dp = 2" in table  # the heading describes the compared world, not the floor's
    assert "error: boom" in table and "no gradient clipping" in table
    assert "against the floor's (GEMM and copy probe): 0.80–1.00." in table
    section = report.peers_section(str(csv))
    assert section.startswith("## Side by side") and table in section
    summary.plot_peers(csv, png)
    assert png.stat().st_size > 10_000
    assert set(summary.losses_of(csv)) == {"floor", "floor-concurrent", "ours-0", "ddp", "fsdp2-reshard"}


@pytest.mark.ci
def test_concurrent_floor_trains_the_floor_on_every_rank_at_once():
    """dp processes, each training the one-rank floor alone: the floor's losses, no collective.

    Spawns dp processes for the peers comparison's floor (about 9 s), so it runs in CI only."""
    spec = runner_spec(spec_for("tiny", dp=2, steps=2), warmup=1)
    floor = runner.run_floor(spec, log=lambda _: None)
    concurrent = runner.run_floor_concurrent(spec, log=lambda _: None)
    assert concurrent["status"] == "ok", concurrent["error"]
    assert (concurrent["impl"], concurrent["dp"], concurrent["world_size"]) == ("floor-concurrent", 1, 2)
    assert concurrent["losses"] == floor["losses"] and concurrent["comm_bytes_per_step"] == 0
    assert len(json.loads(concurrent["peak_rss_bytes_per_rank"])) == 2


@pytest.mark.slow
@pytest.mark.skipif(not HAS_DEEPSPEED, reason="DeepSpeed not installed (optional `peers` extra)")
def test_deepspeed_smoke_comparison(tmp_path):
    """The real runner, each implementation in its own world: DeepSpeed stage 3 against ours,
    same losses, the row carrying versions, memory, bytes and the ratios."""
    spec = runner_spec(spec_for("tiny", dp=2, steps=2, micro_batch=2), warmup=1)
    rows = runner.run_peers(spec, ["ours-3", "deepspeed-3"], log=lambda _: None)
    assert [r["impl"] for r in rows] == ["floor", "floor-concurrent", "bound", "ours-3", "deepspeed-3"]
    assert [r["status"] for r in rows] == ["ok"] * 5, [r["error"] for r in rows]
    floor, bound, ours, ds = rows[0], rows[2], rows[3], rows[4]
    assert ours["collective_s_per_step"] > 0 and floor["collective_s_per_step"] == 0  # dp 1 issues nothing
    assert bound["step_time_s"] == floor["step_time_s"] + ours["collective_s_per_step"]
    assert ds["time_over_bound"] == ds["step_time_s"] / bound["step_time_s"]
    assert ds["loss_max_rel_diff"] < 1e-5 and ds["loss_ref"] == "ours-3"
    assert ds["peer_version"].startswith("deepspeed 0.") and ds["peak_rss_bytes"] > ds["base_rss_bytes"] > 0
    assert ds["comm_bytes_per_step"] >= 4 * spec.model.num_params  # at least one reduce-scatter of Ψ
    assert ds["time_ratio_ours_over"] > 0 and ds["rss_ratio_ours_over"] > 0
    runner.write_csv(rows, tmp_path / "peers.csv")
    assert "deepspeed-3" in summary.peers_markdown(tmp_path / "peers.csv")


def test_rounds_interleave_every_row_and_take_each_ratio_within_its_round(monkeypatch):
    """Three rounds, the order reversed in the second. The floor reads 1.0, 2.0, 1.0 s and ours-0
    1.2, 2.6, 1.5 s: ours over the floor is 1.2, 1.3, 1.5 within the rounds, median 1.3 (the ratio
    of the medians would say 1.5). A row failed in any round is that failed row."""
    times = {"floor": [1.0, 2.0, 1.0], "floor-concurrent": [1.1, 2.2, 1.1], "ours-0": [1.2, 2.6, 1.5],
             "ddp": [2.0, 4.0, 2.0]}  # fmt: skip
    calls = []

    def fake(name, family="torch", stage=0, collective=None):
        n = sum(c == name for c in calls)
        calls.append(name)
        row = {**_row(name, stage, times[name][n], 100 + n, [1.0, 0.5], family=family),
               "collective_s_per_step": collective}  # fmt: skip
        return {**row, "status": "error", "error": "boom"} if name == "ddp" and n == 1 else row

    monkeypatch.setattr(runner, "run_floor", lambda spec, log, stage: fake("floor", "floor", stage))
    monkeypatch.setattr(
        runner, "run_floor_concurrent", lambda spec, log: fake("floor-concurrent", "floor-concurrent", None)
    )
    monkeypatch.setattr(
        runner, "run_one", lambda impl, spec, log: fake(impl, *(("zerobench", 0, 0.1) if impl == "ours-0" else ()))
    )
    rows = runner.run_peers(spec_for("awkward", dp=2), ["ours-0", "ddp"], log=lambda _: None, rounds=3)
    forward = ["floor", "floor-concurrent", "ours-0", "ddp"]
    assert calls == forward + forward[::-1] + forward
    by = {r["impl"]: r for r in rows}
    assert [r["impl"] for r in rows] == ["floor", "floor-concurrent", "bound", "ours-0", "ddp"]
    ours = by["ours-0"]
    assert ours["rounds"] == 3 and ours["step_time_s"] == 1.5 and ours["time_over_floor"] == pytest.approx(1.3)
    assert json.loads(ours["time_over_floor_rounds"]) == pytest.approx([1.2, 1.3, 1.5])
    # each round's bound is that round's floor plus ours' collectives: 1.1, 2.1, 1.1
    assert json.loads(ours["time_over_bound_rounds"]) == pytest.approx([1.2 / 1.1, 2.6 / 2.1, 1.5 / 1.1])
    assert ours["step_time_min_s"] == pytest.approx(1.2 * 0.9) and ours["peak_rss_bytes"] == 102
    assert (by["ddp"]["status"], by["ddp"]["error"]) == ("error", "boom")
    with pytest.raises(ValueError, match="rounds=0"):
        runner.run_peers(spec_for("awkward", dp=2), ["ddp"], rounds=0)


def test_each_stage_is_compared_with_a_floor_measured_beside_it(monkeypatch):
    """Per stage its floor, then its implementations (the concurrent floor after the first floor):
    stage 0's rows over the floor read 1.0 s before them, stage 3's over the 2.0 s one, and each
    bound is its own stage's floor plus ours' collectives."""
    times = {("floor", 0): 1.0, ("floor", 3): 2.0, ("floor-concurrent", None): 1.1, ("ours-0", 0): 1.5,
             ("ddp", 0): 3.0, ("ours-3", 3): 2.6, ("fsdp2-reshard", 3): 5.2}  # fmt: skip
    calls = []

    def fake(name, family, stage, collective=None):
        calls.append((name, stage))
        return {**_row(name, stage, times[name, stage], 100, [1.0, 0.5], family=family),
                "collective_s_per_step": collective}  # fmt: skip

    monkeypatch.setattr(runner, "run_floor", lambda spec, log, stage: fake("floor", "floor", stage))
    monkeypatch.setattr(
        runner, "run_floor_concurrent", lambda spec, log: fake("floor-concurrent", "floor-concurrent", None)
    )
    ours = {"ours-0": ("zerobench", 0, 0.2), "ours-3": ("zerobench", 3, 0.4)}
    monkeypatch.setattr(
        runner,
        "run_one",
        lambda impl, spec, log: fake(impl, *ours.get(impl, ("torch", runner.IMPLEMENTATIONS[impl][1]))),
    )
    rows = runner.run_peers(spec_for("awkward", dp=2), ["ours-3", "fsdp2-reshard", "ddp", "ours-0"], log=lambda _: None)
    assert calls == [("floor", 0), ("floor-concurrent", None), ("ddp", 0), ("ours-0", 0),
                     ("floor", 3), ("ours-3", 3), ("fsdp2-reshard", 3)]  # fmt: skip
    by = {(r["impl"], r["stage"]): r for r in rows}
    assert by["ours-0", 0]["time_over_floor"] == 1.5 and by["ddp", 0]["time_over_floor"] == 3.0
    assert by["ours-3", 3]["time_over_floor"] == pytest.approx(1.3) and by["fsdp2-reshard", 3]["time_over_floor"] == 2.6
    assert by["floor", 3]["time_over_floor"] == 1.0
    assert by["floor-concurrent", None]["time_over_floor"] == pytest.approx(1.1)  # beside stage 0's floor
    assert by["bound", 0]["step_time_s"] == pytest.approx(1.2) and by["bound", 3]["step_time_s"] == pytest.approx(2.4)
    assert by["ours-3", 3]["time_over_bound"] == pytest.approx(2.6 / 2.4)
