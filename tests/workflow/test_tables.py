"""zerobench.artifacts.tables.engine_tables and zerobench.artifacts.report.report on hand-made records: the
references, the errors and the verdicts the report prints (no processes, no torch)."""

from __future__ import annotations

import pandas as pd
import pytest

from zerobench.artifacts.report import report
from zerobench.artifacts.tables import engine_tables
from zerobench.artifacts.tables.capacity import capacity
from zerobench.memory import BYTES_PER_PARAM

PSI = 1000


def record(stage: int, dp: int, precision: str = "bf16", **fields) -> dict:
    p, g, k = BYTES_PER_PARAM[precision]
    r = dict(
        source="measured", status="ok", model="toy", num_params=PSI, dp=dp, mp=1, stage=stage, layers=2,
        precision=precision, param_bytes=p * PSI / (dp if stage >= 3 else 1),
        grad_bytes=g * PSI / (dp if stage >= 2 else 1), optimizer_bytes=k * PSI / (dp if stage >= 1 else 1),
    )  # fmt: skip
    return {**r, **fields}


def test_memory_rows_compare_with_table1_and_formula():
    df = engine_tables.memory([record(s, dp) for s in range(4) for dp in (1, 4)])
    # bytes per parameter at N_d = 4, by hand: 2 + 2 + 12, 2 + 2 + 12/4, 2 + 2/4 + 12/4, 16/4
    at4 = df[df.dp == 4].set_index("stage")
    assert at4.expected.tolist() == [16, 7, 5.5, 4] and at4.ours.tolist() == [16, 7, 5.5, 4]
    # Table 1's 7.5B row at N_d = 4 as printed (GB): 120, 52.5, 41.3, 30
    assert at4.paper.tolist() == pytest.approx([120 / 7.5, 52.5 / 7.5, 41.3 / 7.5, 30 / 7.5])
    assert at4.error_pct.tolist() == pytest.approx([0, 0, 100 * (5.5 - 41.3 / 7.5) / (41.3 / 7.5), 0])
    row = df[(df.stage == 2) & (df.dp == 4)].iloc[0]
    assert row.ours == 5.5 and row.expected == 5.5  # 2 + 14/4 bytes per parameter
    assert row.paper == pytest.approx(41.3 / 7.5)  # Table 1's 7.5B cell, per parameter
    assert df[(df.stage == 1) & (df.dp == 1)].iloc[0].paper == 16  # no sharding at N_d = 1


def test_memory_error_shows_a_wrong_engine():
    bad = record(1, 4, optimizer_bytes=12 * PSI / 2)  # optimizer shards over 2 ranks instead of 4
    assert engine_tables.memory([bad]).error_pct.iloc[0] == pytest.approx(100 * (4 + 6 - 7) / 7)


def test_comm_in_units_of_the_ring_factor():
    unit = PSI * 3 / 4  # Ψ (N_d - 1)/N_d at N_d = 4
    stage2 = record(2, 4, comm={"reduce_scatter/dp": {"per_step_volume_elements": unit},
                                "all_gather/dp": {"per_step_volume_elements": unit},
                                "all_reduce/mp": {"per_step_volume_elements": 9 * unit}})  # fmt: skip
    stage3 = record(3, 4, comm={"all_gather/dp": {"per_step_volume_elements": 2 * unit},
                                "reduce_scatter/dp": {"per_step_volume_elements": 1.5 * unit}})  # fmt: skip
    df = engine_tables.comm([stage2, stage3]).set_index("stage")
    assert df.loc[2, "ours"] == 2 and df.loc[2, "error_pct"] == 0  # the mp group is not DP traffic
    assert df.loc[3, "ours"] == 3.5 and df.loc[3, "error_pct"] == pytest.approx(100 * 0.5 / 3)


def test_loss_errors_against_the_single_process_run():
    recs = [record(0, 1, losses=[5.0, 4.0]), record(2, 2, losses=[5.0, 4.4]), record(1, 2, status="oom", losses=None)]
    df = engine_tables.loss(recs)
    assert df[df.layout.str.contains("P_os\\+g ")].error_pct.tolist() == [0.0, pytest.approx(10.0)]
    assert df[df.status == "oom"].ours.isna().all()


def test_capacity_reads_the_budget_crossing_between_the_trials_either_side():
    cap = 100 * 2**20

    def trial(stage, layers, mib, status="ok"):  # 10 Ψ of parameters per layer
        return record(stage, 4, num_params=10 * PSI * layers, layers=layers, mem_cap_bytes=cap, status=status,
                      rss_growth_bytes=None if mib is None else mib * 2**20)  # fmt: skip

    recs = [
        trial(0, 4, 80),
        trial(0, 6, 110, "oom"),  # 100 MiB crossed halfway from 80 to 110 at 2/3: 5.33 layers
        trial(1, 4, 60),
        trial(1, 8, 90),  # nothing ran over: the crossing is above the grid
        trial(2, 4, 120, "oom"),  # not even the shallowest trained
        trial(3, 4, 40),
        trial(3, 8, None, "oom"),
        trial(3, 6, 70),  # the deeper oom stopped before training
    ]
    df = capacity(recs)
    largest = df[df.kind == "largest"].set_index("stage")
    assert largest.loc[0, "measured_params"] == pytest.approx(10 * PSI * (4 + 2 * 2 / 3))
    assert largest.loc[0, "expected"] == pytest.approx(10 * PSI * (4 + 2 * 2 / 3) / 1e6)
    assert largest.status.tolist() == ["ok", "unbracketed", "oom", "unbracketed"]
    assert largest.loc[0, "formula"] == pytest.approx(cap / 16 / 1e6)  # 2 + 2 + 12 bytes per parameter
    assert largest.loc[3, "formula"] == pytest.approx(cap / 4 / 1e6)  # all of it over N_d = 4
    assert largest.ours.isna().all() and largest.error_pct.isna().all()  # nothing modelled to judge
    trials = df[df.kind == "trial"]
    assert trials.expected.tolist()[:2] == [80, 110] and trials.ours.isna().all()


def test_capacity_judges_the_calibrated_model_against_the_measured_crossing():
    shape = dict(
        model="tiny", hidden=256, heads=8, seq=128, vocab=256, mp=1, bucket_bytes=2**21, micro_batch=1,
        grad_accum=1, checkpoint_activations=False, partition_activations=False, offload_activations=False,
        contiguous_buffers=False, device="cpu", mem_cap_bytes=192 * 2**20,
    )  # fmt: skip
    recs = [record(1, 4, **shape, layers=n, num_params=789_760 * n + 99_072, rss_growth_bytes=mib * 2**20,
                   status="ok" if mib <= 192 else "oom") for n, mib in ((14, 167), (16, 188), (18, 209))]  # fmt: skip
    df = capacity(recs, calibrated=(lambda r: (10 * r["layers"] + 20) * 2**20, lambda r: 16.5e6))
    row = df[df.kind == "largest"].iloc[0]
    # measured: 192 MiB is 4/21 of the way from 16 layers (188 MiB) to 18 (209 MiB)
    measured = 789_760 * (16 + 2 * 4 / 21) + 99_072
    assert row.expected == pytest.approx(measured / 1e6) and row.ours == 16.5
    assert row.error_pct == pytest.approx(100 * (16.5e6 - measured) / measured)
    trials = df[df.kind == "trial"]
    assert trials.ours.tolist() == [160, 180, 200] and trials.expected.tolist() == [167, 188, 209]
    assert trials.error_pct.iloc[0] == pytest.approx(100 * (160 - 167) / 167)


def _judged(errors: list[float]) -> pd.DataFrame:
    n = len(errors)
    return pd.DataFrame(dict(key=[f"p{i}" for i in range(n)], ours=1.0, paper=1.0, error_pct=errors, status="ok",
                             role="judged"))  # fmt: skip


def test_verdicts():
    df = _judged([0.0, -20.0])
    assert report.verdict(report.stats(df), 25).startswith("**Reproduced**")
    assert report.verdict(report.stats(df), 15).startswith("**Mostly reproduced**")
    assert report.verdict(report.stats(df), 5).startswith("**Not reproduced**")
    assert "ours only" in report.verdict(report.stats(df.assign(error_pct=None)), 5)
    assert "2 judged points, mean |error| 10.00%, worst 20.00% (p1)" in report.verdict(report.stats(df), 25)


@pytest.mark.parametrize("role", ["fitted", "formula", "reference", "derived"])
@pytest.mark.parametrize("errors", [[0.0, 0.0, 0.0], [500.0, -900.0, 1e4]])
def test_rows_not_judged_cannot_change_a_verdict(role, errors):
    # Fig 5's case: a fitted point at -0.2 % pulls the mean of four judged points at 11.2 % under
    # a 10 % tolerance; rows of any other role, near zero or far off, leave every verdict as it was
    base = _judged([7.8, 24.2, 8.5, 4.4])
    others = pd.DataFrame(dict(key=[f"x{i}" for i in range(3)], ours=1.0, paper=1.0, error_pct=errors, status="ok",
                               role=role))  # fmt: skip
    mixed = pd.concat([base.iloc[:2], others, base.iloc[2:]], ignore_index=True)
    for tolerance in (5, 10, 11.25, 25):
        alone = report.verdict(report.stats(base), tolerance)
        # the same words and numbers; the others named after them
        assert report.verdict(report.stats(mixed), tolerance).startswith(alone.rstrip("."))
    s = report.stats(mixed)
    assert (s["n"], s["mape"], s["max"], s["worst"]) == (4, pytest.approx(11.225), 24.2, "p1")
    assert s["apart"] == {role: (3, pytest.approx(sum(map(abs, errors)) / 3))}
    assert report.verdict(s, 10).startswith("**Not reproduced**")
    assert f"not judged: 3 {role}" in report.verdict(s, 10)
    assert report.stats(others)["n"] == 0 and report.verdict(report.stats(others), 10).startswith("No judged")


def test_a_table_without_roles_or_with_an_unknown_role_is_refused():
    df = _judged([1.0])
    with pytest.raises(ValueError, match="fig5.csv: no `role` column"):
        report.stats(df.drop(columns="role"), "fig5.csv")
    with pytest.raises(ValueError, match=r"role must be one of .*got \['calibration'\]"):
        report.stats(df.assign(role="calibration"), "fig5.csv")
    with pytest.raises(ValueError, match="empty"):
        report.stats(df.assign(role=None), "fig5.csv")


def test_roles_of_the_paper_tables():
    from zerobench.artifacts.tables import paper_tables

    def largest(layers, **fields):
        return dict(status="ok", num_params=layers * 1e9, layers=layers, hidden=8192, **fields)

    fig5 = paper_tables.fig5([({"zero_config": c}, largest(40 + i)) for i, c in enumerate(("C1", "C4"))])
    assert fig5.set_index("key").role.to_dict() == {"C1": "judged", "C4": "fitted"}  # perfmodel/choices.py
    t2 = paper_tables.table2([({}, largest(6, mp=1, stage=1, dp=64)), ({}, largest(7, mp=2, stage=2, dp=64))])
    assert t2.set_index("key").role.to_dict() == {
        "MP 1 P_os theory": "formula", "MP 1 P_os measured": "fitted",  # fragmentation's fit point
        # it carries fragmentation and the NCCL allowance (perfmodel/choices.py carriers)
        "MP 2 P_os+g theory": "formula", "MP 2 P_os+g modelled": "fitted",
    }  # fmt: skip
    runs = [({"zero_config": "C5"}, dict(status="ok", world_size=g, micro_batch=16, tflops_per_gpu=30.0))
            for g in (64, 128)]  # fmt: skip
    fig3 = paper_tables.fig3(runs).set_index("key")
    assert fig3.loc["64 GPUs", "role"] == "fitted"  # its batch rule was chosen on it
    # overlap_grad_reduce was chosen with it in view (perfmodel/choices.py)
    assert fig3.loc["128 GPUs", "role"] == "fitted" and fig3.loc["128 GPUs total", "role"] == "derived"
    assert fig3.loc["128 GPUs total", "derived_from"] == "128 GPUs x 128" and fig3.loc["128 GPUs total", "ours"] == 3840


def test_roles_of_the_record_tables():
    recs = [record(0, 1, losses=[5.0, 4.0]), record(2, 2, losses=[5.0, 4.4])]
    loss = engine_tables.loss(recs)
    assert loss[loss.dp == 1].role.tolist() == ["reference"] * 2  # the single-process run beside itself
    assert loss[loss.dp == 2].role.tolist() == ["judged"] * 2
    mem = engine_tables.memory([record(1, 4), record(1, 4, source="modelled"), record(1, 4, source="traced")])
    assert mem.set_index("source").role.to_dict() == {"measured": "judged", "modelled": "formula", "traced": "judged"}


def test_model_vs_measured_marks_the_rows_a_fitted_term_changes():
    # the committed records of two trials and the committed profile: the MP all-reduce's cost in a
    # step beyond its curve (mp_sync_table) is fitted on the engine's MP steps, and reaches only MP rows
    from pathlib import Path

    from zerobench.artifacts.tables.vs_measured import model_vs_measured
    from zerobench.perfmodel.hardware import get_profile
    from zerobench.record_files import read_record

    root = Path(__file__).resolve().parents[2]
    hw = get_profile(str(root / "results/profiles/calibrated-cpu.json"))
    assert hw.mp_sync_table  # the profile has the fitted term
    runs = [read_record(root / f"results/runs/measured_cpu-10m-{t}-fp32-b4-n30-w3-system-rep1.json")
            for t in ("mp2-z0", "dp2-z0")]  # fmt: skip
    df = model_vs_measured(runs, hw).set_index("mp")
    mp2, dp2 = df.loc[2], df.loc[1]
    assert mp2.role == "fitted" and mp2.fitted_terms == "mp_sync_table"
    assert mp2.ours_without_fitted < mp2.ours  # without it an MP all-reduce waits the matmul benchmark's wait
    assert mp2.error_without_fitted_pct == pytest.approx(100 * (mp2.ours_without_fitted / mp2.expected - 1))
    assert dp2.role == "judged" and dp2.ours_without_fitted == dp2.ours
    assert report.stats(df.reset_index())["n"] == 1  # the verdict reads the dp 2 row alone
