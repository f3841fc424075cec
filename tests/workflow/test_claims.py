"""The claims ledger (zerobench/artifacts/claims/claims.py): each claim's ours computed from hand-made
tables and checked against hand arithmetic, verdicts that flip past the tolerance, absent tables
that read "not testable here", fitted points that cannot read reproduced, and the committed
results/claims.csv equal to the ledger built from the committed tables."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from zerobench.artifacts.claims import claims as cl
from zerobench.artifacts.claims.claims import (
    CLAIMS,
    CONSISTENT,
    PARTLY,
    REFUTED,
    REPRODUCED,
    UNTESTABLE,
    ledger,
    reference,
    verdict,
)

ROOT = Path(__file__).resolve().parents[2]


def _rows(*rows, source="modelled") -> pd.DataFrame:
    """(key, ours, paper, role[, extra columns]) -> a table as the artifacts write it."""
    out = []
    for key, ours, paper, role, *extra in rows:
        err = None if paper is None or ours is None else 100 * (ours - paper) / paper
        out.append(dict(key=key, ours=ours, paper=paper, error_pct=err, source=source, role=role,
                        **(extra[0] if extra else {})))  # fmt: skip
    return pd.DataFrame(out)


def _fig2() -> pd.DataFrame:
    """ZeRO and baseline TFLOPS by size; speed-ups derived, as artifacts/tables/paper_tables.py writes them."""
    pts = {"1.5B": (30.0, 25.0, "judged"), "8B": (40.0, 20.0, "fitted"), "40B": (36.0, 6.0, "judged"),
           "60B": (36.0, 4.0, "judged"), "80B": (38.0, 5.0, "judged"), "100B": (39.0, 3.0, "fitted")}  # fmt: skip
    rows = []
    for size, (zero, base, role) in pts.items():
        rows += [(f"ZeRO {size}", zero, 35.0, role, {"series": "ZeRO-100B"}),
                 (f"baseline {size}", base, 5.0, "judged", {"series": "Megatron baseline"}),
                 (f"speed-up {size}", zero / base, 7.0, "derived",
                  {"series": "speed-up", "derived_from": f"ZeRO {size} / baseline {size}"})]  # fmt: skip
    return _rows(*rows)


def _tables() -> dict[str, pd.DataFrame]:
    return {
        "table1": _rows(
            ("1T P_os+g+p N_d=1024", 15.625, 15.6, "judged"),
            ("7.5B P_os N_d=4", 52.5, 52.5, "judged"),
            ("7.5B P_os+g+p N_d=1024", 0.1172, 0.12, "judged"),
            ("1T P_os N_d=1", 16000, 16000, "formula"),
            source="traced",
        ),
        "table2": _rows(
            ("MP 16 P_os measured", 96.0, 100.0, "judged"), ("MP 16 baseline measured", 20.0, 20.0, "judged")
        ),
        "fig8": _rows(
            ("max model ZeRO-DP", 13.1, 13.0, "fitted"),
            ("max model DDP", 1.3, 1.4, "judged"),
            ("DDP 1.38B", 14.0, 18.1, "judged"),
            ("ZeRO 1.5B", 44.0, 40.3, "judged"),
            ("ZeRO 2.5B", 99.0, 41.9, "fitted"),
            ("ZeRO 13B", 26.0, 21.1, "judged"),
        ),
        "fig2": _fig2(),
        "fig5": _rows(("C1", 40.0, 40.0, "judged"), ("C4", 400.0, 140.0, "fitted"), ("C5", 150.0, 150.0, "judged")),
        # the cached figures are fitted (cache_headroom); the traced allocated peaks carry no choice
        "fig6": _rows(
            *(
                (f"{size}B C{c}", 20.0, 19.8, "fitted", {"traced_allocated_gib": gib})
                for size, c, gib in ((40, 4, 10.0), (40, 5, 9.0), (100, 4, 25.0), (100, 5, 20.0))
            )
        ),  # fmt: skip
        "fig3": _rows(
            ("64 GPUs", 30.0, 25.6, "judged"),
            ("400 GPUs", 36.0, 36.5, "judged"),
            ("400 GPUs total", 14400.0, 14650.0, "derived"),
        ),
        "superlinear": _rows(
            ("P_os+g+p N_d=2: largest micro-batch that fits", 1800.0, None, "judged", {"vs_linear_pct": -20.0}),
            source="measured",
        ),
        "superlinear_emulated": _rows(
            ("emulated P_os+g N_d=2", 1.03, 1.46, "judged", {"per_rank_ratio": 1.03, "per_rank_ratio_low": 1.01}),
            source="emulated",
        ),
        "comm_volume": _rows(
            ("baseline N_d=4", 2.0, 2.0, "judged"),
            ("P_os+g N_d=4", 2.0, 2.0, "judged"),
            ("P_os+g+p N_d=4", 3.0, 3.0, "judged"),
            source="measured",
        ),
    }


def _ledger(tables=None) -> pd.DataFrame:
    return ledger(_tables() if tables is None else tables).set_index("claim")


def test_each_claim_reads_ours_from_the_tables_by_hand():
    got = _ledger()
    by_hand = {
        "table1_every_cell": 0.1172,  # the judged row with the largest |error| (-2.3 %)
        "table1_1t_1024": 15.625,
        "table2_pos_mp16": 96.0,
        "fig8_13b_without_mp": 13.1,
        "fig8_ddp_1_4b": 1.3,
        "fig8_ddp_under_20tf": 14.0,
        "fig8_zero_dp_over_40tf": (44.0 + 99.0 + 26.0) / 3,  # the fitted 2.5B point in, the reading flagged
        "fig2_100b_38tf": 39.0,
        "fig2_15pf_average": (40.0 + 36.0 + 36.0 + 38.0 + 39.0) / 5 * 400 / 1000,  # fitted 8B and 100B in
        "fig2_10x_megatron": 39.0 / 3.0,  # 100B, from a fitted row
        "model_size_8x": 400.0 / 20.0,  # the fitted C4
        "fig3_superlinear": 36.0 / 30.0,
        "superlinear_doubling": 1.03,
        "superlinear_doubling_shared_host": 0.8,
        "fig6_40b_c5_no_drop": 9.0 / 10.0,  # read from fitted rows, but from their traced column: judged
        "fig6_100b_c5_drop": 20.0 / 25.0,
        "comm_stage3_1_5x": 1.5,
        "comm_stage12_1x": 1.0,
    }
    assert set(by_hand) == {c.name for c in CLAIMS}
    for name, value in by_hand.items():
        assert got.loc[name, "ours"] == pytest.approx(value), name
    assert got.loc["table1_every_cell", "paper"] == 0.12  # that row's own paper number
    assert got.loc["comm_stage3_1_5x", "source"] == "measured"
    assert got.loc["table1_1t_1024", "source"] == "traced"
    assert got.loc["fig6_100b_c5_drop", "source"] == "traced" and got.loc["fig6_100b_c5_drop", "verdict"] != UNTESTABLE


def test_paper_numbers_come_from_the_reference_with_their_bounds():
    assert reference(cl._ref("fig2", "throughput_per_gpu", model_params_b=100, kind="stated"))[:2] == (38.0, ">")
    assert reference(cl._ref("fig8", "throughput_per_gpu", model_params_b=1.4))[:2] == (20.0, "<")
    per_gpu = reference(cl._ref("fig3", "throughput_per_gpu", per=cl._fig3_per_gpu(64), gpus=400))
    assert per_gpu[0] == pytest.approx(36.5 / 25.6)
    assert reference(cl._ref("fig2", "no_such_metric")) is None
    got = _ledger()
    assert got.loc["fig8_ddp_1_4b", "paper"] == 1.4 and got.loc["comm_stage3_1_5x", "paper"] == 1.5


def _move(tables, table, key, value, column="ours"):
    df = tables[table].copy()
    df.loc[df.key == key, column] = value
    return {**tables, table: df}


def test_verdict_flips_past_the_tolerance():
    base = _tables()
    inside = _move(base, "table1", "1T P_os+g+p N_d=1024", 15.6 * 1.024)  # +2.4 %, tolerance 2.5 %
    outside = _move(base, "table1", "1T P_os+g+p N_d=1024", 15.6 * 1.026)
    assert _ledger(inside).loc["table1_1t_1024", "verdict"] == REPRODUCED
    assert _ledger(outside).loc["table1_1t_1024", "verdict"] == REFUTED
    # a bound (">40"): above it misses by nothing; below it misses, however little (no tolerance past a bound)
    judged = _move(base, "fig8", "ZeRO 2.5B", "judged", column="role")
    assert _ledger(_move(judged, "fig8", "ZeRO 13B", 60.0)).loc["fig8_zero_dp_over_40tf", "verdict"] == REPRODUCED
    # with a fitted row in it the model cannot undo, a hit shows the fit: not testable
    assert _ledger(_move(base, "fig8", "ZeRO 13B", 60.0)).loc["fig8_zero_dp_over_40tf", "verdict"] == UNTESTABLE
    assert verdict(40.1, 40.0, ">", 10)[0] == REPRODUCED
    assert verdict(39.71, 40.0, ">", 10)[0] == REFUTED
    assert verdict(39.71, 40.0, "<", 10)[0] == REPRODUCED
    low = _move(_move(base, "fig8", "ZeRO 13B", 3.0), "fig8", "ZeRO 1.5B", 3.0)  # mean 35: under 40, fitted or not
    assert _ledger(low).loc["fig8_zero_dp_over_40tf", "verdict"] == REFUTED
    # the qualitative statement: superlinear above 1 is partly; at or below 1, refuted
    assert _ledger(base).loc["fig3_superlinear", "verdict"] == PARTLY  # 1.2 against 1.43
    flat = _move(base, "fig3", "400 GPUs", 29.0)
    assert _ledger(flat).loc["fig3_superlinear", "verdict"] == REFUTED
    assert _ledger(base).loc["superlinear_doubling_shared_host", "verdict"] == REFUTED  # 0.8: sub-linear
    assert _ledger(base).loc["superlinear_doubling", "verdict"] == PARTLY  # 1.03 against 1.46: above 1 only
    # judged on its repeats: the statement holds only where every repeat's ratio is above 1
    straddling = _move(base, "superlinear_emulated", "emulated P_os+g N_d=2", 0.99, column="per_rank_ratio_low")
    assert _ledger(straddling).loc["superlinear_doubling", "verdict"] == REFUTED
    # measured in interleaved rounds, the statement holds only where it held in every round
    key = "P_os+g+p N_d=2: largest micro-batch that fits"
    above = _move(base, "superlinear", key, 5.0, column="vs_linear_pct")  # 1.05, no rounds' range
    got = _ledger(above).loc["superlinear_doubling_shared_host"]
    assert got.verdict == PARTLY and "the statement read on ours" in got.note
    straddles = _move(above, "superlinear", key, -3.0, column="vs_linear_low_pct")
    got = _ledger(straddles).loc["superlinear_doubling_shared_host"]
    assert (got.ours, got.verdict) == (pytest.approx(1.05), REFUTED) and "vs_linear_low_pct" not in got.note
    assert "the statement read on superlinear: " + key in got.note and got.note.endswith(": 0.97")
    every_round = _move(above, "superlinear", key, 2.0, column="vs_linear_low_pct")
    assert _ledger(every_round).loc["superlinear_doubling_shared_host", "verdict"] == PARTLY


def test_fitted_point_is_not_testable():
    base = _tables()
    got = _ledger(base).loc["fig8_13b_without_mp"]
    assert got.verdict == UNTESTABLE and "fitted" in got.note  # 13.1 vs 13: within tolerance, but fitted
    judged = base["fig8"].copy()
    judged.loc[judged.key == "max model ZeRO-DP", "role"] = "judged"
    assert _ledger({**base, "fig8": judged}).loc["fig8_13b_without_mp", "verdict"] == REPRODUCED
    assert verdict(13.0, 13.0, "", 10, fitted=True)[0] == UNTESTABLE
    assert verdict(13.0, 13.0, "", 10, fitted=False)[0] == REPRODUCED


def test_missing_table_row_or_role_reads_not_testable():
    base = _tables()
    got = _ledger({k: v for k, v in base.items() if k != "comm_volume"})
    for name in ("comm_stage3_1_5x", "comm_stage12_1x"):
        assert got.loc[name, "verdict"] == UNTESTABLE and "comm_volume.csv absent" in got.loc[name, "note"]
        assert pd.isna(got.loc[name, "ours"])
    gone = base["fig2"][base["fig2"].key != "ZeRO 100B"]
    assert _ledger({**base, "fig2": gone}).loc["fig2_100b_38tf", "verdict"] == UNTESTABLE
    formula = _move(base, "table1", "1T P_os+g+p N_d=1024", "formula", column="role")
    assert _ledger(formula).loc["table1_1t_1024", "verdict"] == UNTESTABLE  # theory, not ours
    oom = _move(base, "fig3", "400 GPUs", "oom", column="status")
    assert _ledger(oom).loc["fig3_superlinear", "verdict"] == UNTESTABLE
    slow = _move(base, "superlinear", "P_os+g+p N_d=2: largest micro-batch that fits", True, column="slow_spell")
    assert _ledger(slow).loc["superlinear_doubling_shared_host", "verdict"] == UNTESTABLE
    nothing = ledger({})
    assert (nothing.verdict == UNTESTABLE).all() and len(nothing) == len(CLAIMS)


def test_a_fitted_row_in_an_aggregate_can_only_sink_it():
    """An aggregate reads its fitted rows too (each claim's worst reading): a fitted row that drags it
    past the paper's number refutes it; one that lifts it to a hit leaves it not testable."""
    base = _tables()
    sunk = _move(base, "fig8", "ZeRO 2.5B", 1.0)  # (44 + 1 + 26) / 3 under 40
    assert _ledger(sunk).loc["fig8_zero_dp_over_40tf", "verdict"] == REFUTED
    assert "a miss on a fitted row stands" in _ledger(sunk).loc["fig8_zero_dp_over_40tf", "note"]


def _banded(tables, table, pct=20.0, basis="pooled (46 validation runs, 90%)"):
    """`table` with every row on a band of `pct` %."""
    return {**tables, table: tables[table].assign(band_pct=pct, band_basis=basis)}


def test_a_miss_inside_our_band_is_consistent_and_only_one_outside_it_refuted():
    """A claim is refuted only where the paper's number lies outside ours ± our band: inside it, past
    the tolerance, it reads consistent within our uncertainty, with the band named."""
    assert verdict(115.0, 100.0, "", 10, band_pct=20.0)[0] == CONSISTENT
    assert verdict(125.0, 100.0, "", 10, band_pct=20.0)[0] == REFUTED
    assert verdict(125.0, 100.0, "", 10)[0] == REFUTED  # no band (measured, traced): the tolerance alone
    assert verdict(105.0, 100.0, "", 10, band_pct=20.0)[0] == REPRODUCED  # the tolerance first
    assert verdict(33.0, 38.0, ">", 10, band_pct=20.0)[0] == CONSISTENT  # -13 % to the bound
    assert verdict(30.0, 38.0, ">", 10, band_pct=20.0)[0] == REFUTED  # -21 %
    assert verdict(1.2, 1.43, "", 10, holds_above=1.0, band_pct=20.0)[0] == CONSISTENT  # before partly
    assert verdict(1.1, 1.43, "", 10, holds_above=1.0, band_pct=20.0)[0] == PARTLY
    base = _banded(_tables(), "table2")
    inside = _move(base, "table2", "MP 16 P_os measured", 85.0)  # -15 %: past 10 %, inside 20 %
    got = _ledger(inside).loc["table2_pos_mp16"]
    assert (got.verdict, got.role, got.band_pct) == (CONSISTENT, "judged", 20.0)
    assert "inside ours ±20.0 % (pooled (46 validation runs, 90%))" in got.note
    outside = _ledger(_move(base, "table2", "MP 16 P_os measured", 75.0)).loc["table2_pos_mp16"]
    assert outside.verdict == REFUTED and "outside ours ±20.0 %" in outside.note
    # a ratio carries the sum of its two rows' bands
    ratio = _ledger(_banded(_tables(), "fig3", 10.0)).loc["fig3_superlinear"]
    assert ratio.band_pct == 20.0 and ratio.verdict == CONSISTENT  # 1.2 against 1.43: -16 %
    # a fitted row's miss inside the band stands as consistent, its role fitted
    fitted = _ledger(_banded(_move(_tables(), "fig2", "ZeRO 100B", 33.0), "fig2")).loc["fig2_100b_38tf"]
    assert (fitted.verdict, fitted.role) == (CONSISTENT, "fitted") and "a miss on a fitted row stands" in fitted.note


def test_a_stated_direction_is_a_bound():
    """'C5 does not lower the memory below C4's': C5 over C4 at least 1, no tolerance past it."""
    claim = next(c for c in CLAIMS if c.name == "fig6_40b_c5_no_drop")
    assert claim.bound == ">"
    got = _ledger().loc["fig6_40b_c5_no_drop"]  # 9 / 10: a 10 % drop
    assert (got.paper_bound, got.verdict) == (">", REFUTED)
    flat = _move(_tables(), "fig6", "40B C5", 10.0, column="traced_allocated_gib")
    assert _ledger(flat).loc["fig6_40b_c5_no_drop", "verdict"] == REPRODUCED
    with pytest.raises(ValueError, match="bound"):
        dataclasses.replace(claim, bound=">=")


def test_role_and_basis_say_judged_or_fitted():
    got = _ledger()
    assert got.loc["table1_1t_1024", "role"] == "judged" and "(judged)" in got.loc["table1_1t_1024", "basis"]
    assert got.loc["fig8_zero_dp_over_40tf", "role"] == "fitted"
    assert "rows (1 fitted, 2 judged)" in got.loc["fig8_zero_dp_over_40tf", "basis"]
    assert "derived rows (2 of a fitted row, 4 of judged rows only)" in got.loc["fig2_10x_megatron", "basis"]
    assert got.loc["fig6_40b_c5_no_drop", "role"] == "judged" and "no choice in it" in got.loc[
        "fig6_40b_c5_no_drop", "basis"]  # fmt: skip
    all_judged = _move(_tables(), "fig8", "ZeRO 2.5B", "judged", column="role")
    assert _ledger(all_judged).loc["fig8_zero_dp_over_40tf", "basis"].startswith("fig8: mean over judged rows")


def test_a_claim_needs_a_positive_tolerance():
    with pytest.raises(ValueError, match="tolerance_pct"):
        dataclasses.replace(CLAIMS[0], tolerance_pct=0)


def test_committed_ledger_is_built_from_the_committed_tables():
    results = ROOT / "results"
    committed = pd.read_csv(results / "claims.csv")
    built = cl.build(sorted(str(p) for p in results.glob("*.csv") if p.stem not in ("claims", "peers")))
    assert list(committed.claim) == list(built.claim)
    assert list(committed.verdict) == list(built.verdict) and list(committed.role) == list(built.role)
    # no claim refuted with the paper's number inside our band
    refuted = committed[(committed.verdict == REFUTED) & committed.band_pct.notna()]
    assert (refuted.error_pct.abs() > refuted.band_pct).all()
    pd.testing.assert_series_equal(committed.ours, built.ours, check_exact=False, rtol=1e-9)
