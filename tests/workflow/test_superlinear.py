"""zerobench.artifacts.tables.superlinear on hand-made records: the largest micro-batch that fits per stage and N_d,
the perfect-linear reference, the report's words for either outcome, and the figure."""

from __future__ import annotations

import pandas as pd
import pytest

from zerobench.artifacts.plots.draw import plot
from zerobench.artifacts.report import report
from zerobench.artifacts.tables import superlinear

MIB = 2**20


def rec(stage: int, dp: int, b: int, tps: float | None, status: str = "ok") -> dict:
    states = 16e6 / (dp if stage == 3 else 1)  # bytes per rank: 1M parameters at 2 + 2 + 12
    return dict(source="measured", status=status, error=None if status == "ok" else "over the cap", stage=stage,
                dp=dp, micro_batch=b, tokens_per_s=tps if status == "ok" else None, step_time_s=1.0,
                rss_growth_bytes=100 * MIB, mem_cap_bytes=200 * MIB, num_params=10**6, param_bytes=states / 8,
                grad_bytes=states / 8, optimizer_bytes=states * 3 / 4)  # fmt: skip


def sweep(z3_dp2_tokens: float) -> list[tuple[dict, dict]]:
    """(trial, record) pairs of a sheet run without rounds."""
    return [({}, r) for r in [
        rec(0, 1, 2, 100.0), rec(0, 1, 4, None, "oom"), rec(0, 2, 2, 180.0), rec(0, 2, 4, None, "oom"),
        rec(3, 1, 2, 90.0), rec(3, 1, 4, None, "oom"), rec(3, 2, 2, 150.0), rec(3, 2, 4, z3_dp2_tokens),
    ]]  # fmt: skip


def test_best_is_the_largest_micro_batch_that_fits_and_linear_is_from_one_rank():
    df = superlinear.table(sweep(230.0))
    best = df[df.kind == "best"].set_index(["stage", "dp"])
    assert best.loc[(3, 2)].micro_batch == 4 and best.loc[(0, 2)].micro_batch == 2
    assert best.loc[(3, 2)].expected == 180.0  # 2 x stage 3's one-rank 90 tokens/s
    assert best.loc[(3, 2)].vs_linear_pct == pytest.approx(100 * (230 - 180) / 180)
    assert best.loc[(0, 2)].vs_linear_pct == pytest.approx(-10.0)
    assert (df[df.kind == "trial"].status == "oom").sum() == 3  # oom rows kept in the table
    assert df.error_pct.isna().all()  # no paper number at this scale to be an error against


@pytest.mark.parametrize(("tokens", "words"), [(230.0, "28% above"), (160.0, "11% below")])
def test_report_says_what_was_seen_either_way(tokens, words):
    df = superlinear.table(sweep(tokens))
    sheet = dict(title="superlinear", paper="Fig 3", claim="c", table="superlinear", tolerance_pct=10)
    text, _ = report.section("superlinear", sheet, df)
    seen = text.split("**Seen.**")[1]
    assert words in seen and "micro-batch 4 against 2" in seen
    assert f"{tokens / 180:.2f}x stage 0's tokens/s ({'faster' if tokens > 180 else 'slower'})" in seen
    assert f"{abs(100 * (tokens / 200 - 1)):.0f}% {'above' if tokens > 200 else 'below'} linear" in seen
    assert "Caution" not in seen  # the one-rank points, 100 and 90 tokens/s, agree within NOISE


def test_one_rank_points_far_apart_are_called_noise():
    records = [(t, r if (r["stage"], r["dp"], r["micro_batch"]) != (3, 1, 2) else rec(3, 1, 2, 40.0))
               for t, r in sweep(230)]  # fmt: skip
    assert "differ 2.5x: this run's timings are noisy" in superlinear.seen(superlinear.table(records))


def test_a_stage_with_nothing_that_fits_is_said(tmp_path):
    records = [(t, r) for t, r in sweep(230.0) if not (r["stage"] == 0 and r["dp"] == 2)]
    df = superlinear.table(records)
    assert "baseline: no pair of points" in superlinear.seen(df)
    csv = tmp_path / "superlinear.csv"
    df.to_csv(csv, index=False)
    plot("superlinear", str(csv), str(tmp_path / "s.png"), "t")
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    assert pd.read_csv(csv).kind.tolist().count("best") == 3


def test_rounds_compare_each_pair_within_its_round():
    """Three interleaved rounds of stage 0: the host at 100 %, 60 % and 50 % of its speed. Each round's
    N_d = 2 against twice the same round's N_d = 1: +10 %, -10 %, +10 %; the median is +10 %, where
    the rounds' medians taken apart (110 against 2 x 60) would read -8 %. A micro-batch that fitted in
    one round only is not a point."""
    timed = {1: (100.0, 220.0), 2: (60.0, 108.0), 3: (50.0, 110.0)}
    pairs = []
    for rnd, (one, two) in timed.items():
        fits4 = "ok" if rnd == 2 else "oom"
        pairs += [({"repeat": rnd}, rec(0, 1, 2, one)), ({"repeat": rnd}, rec(0, 2, 2, two)),
                  ({"repeat": rnd}, rec(0, 2, 4, 500.0 if rnd == 2 else None, fits4))]  # fmt: skip
    df = superlinear.table(pairs)
    best = df[df.kind == "best"].set_index("dp")
    assert best.micro_batch[2] == 2 and best.rounds[2] == 3
    assert best.vs_linear_pct[2] == pytest.approx(10.0)
    assert (best.vs_linear_low_pct[2], best.vs_linear_high_pct[2]) == pytest.approx((-10.0, 10.0))
    assert best.ours[2] == 110.0 and best.expected[2] == 120.0  # the medians, as measured
    assert (best.tokens_per_s_low[2], best.tokens_per_s_high[2]) == (108.0, 220.0)  # the point's own range
    said = superlinear.seen(df)
    assert "Over 3 rounds, each pair timed back to back: from -10% to +10% against linear, median +10%" in said
    assert "rounds on both sides of linear, so not told apart from it" in said
    for low, high, words in ((-12.0, -2.0, "below linear in every round"), (1.0, 5.0, "above linear in every round")):
        point = pd.Series(dict(vs_linear_low_pct=low, vs_linear_high_pct=high))
        assert superlinear._side(point) == words
    trials = df[df.kind == "trial"]
    assert len(trials) == 9 and "baseline N_d=2 b=4 round 2" in trials.key.tolist()


def test_a_one_rank_gap_seen_in_every_round_is_a_cost_not_noise():
    """Stage 3 at one rank 1.5x and 1.6x slower than stage 0 in both rounds: said as its own cost;
    one round apart the other way: noise, as a single round is."""
    pairs = []
    for rnd, z0 in ((1, 150.0), (2, 160.0)):
        pairs += [({"repeat": rnd}, rec(0, 1, 2, z0)), ({"repeat": rnd}, rec(3, 1, 2, 100.0)),
                  ({"repeat": rnd}, rec(0, 2, 2, 250.0)),
                  ({"repeat": rnd}, rec(3, 2, 2, 180.0))]  # fmt: skip
    said = superlinear.seen(superlinear.table(pairs))
    assert "stage 3 ran 1.50-1.60x slower than the other in every one of 2 rounds" in said and "Caution" not in said
    flipped = [(t, r if (r["stage"], r["dp"], t["repeat"]) != (3, 1, 2) else rec(3, 1, 2, 300.0)) for t, r in pairs]
    assert "Caution: the one-rank points" in superlinear.seen(superlinear.table(flipped))
