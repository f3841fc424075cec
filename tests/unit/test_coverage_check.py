"""The coverage check with power (perfmodel/coverage_check.py, fitting/coverage_power.py,
artifacts/report/coverage_section.py): a constant predictor and a model with a term left out fail it where
the runs exercise what they miss; where the runs cannot fail one, REPORT says so."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from zerobench.artifacts.report.coverage_section import count_text, power_text
from zerobench.fitting import coverage_power as cp
from zerobench.fitting import external
from zerobench.perfmodel import coverage_check as cc
from zerobench.perfmodel.error_bands import REGIME_BASIS, pooled_basis


@pytest.fixture(scope="module")
def runs() -> pd.DataFrame:
    """The 13 runs the coverage is counted on, with their bands (the committed records)."""
    return cp.counted_runs(pd.read_csv(external.HOLDOUT_OUT), pd.read_csv(cp.COVERAGE_OUT))


def _check(predicted, published, runs):
    return cc.check(predicted, published, runs.band_pct, runs.band_basis)


def test_a_constant_predictor_fails_the_check_though_its_count_passes(runs):
    """31.98 TFLOPS for every run (the runs' median) lands 11 of 13 inside the pooled band, a count
    consistent with the declared 90 %: the count alone cannot fail it. The skill criterion does."""
    const = np.full(len(runs), runs.value.median())
    assert runs.value.median() == pytest.approx(31.98)
    got = _check(const, runs.value, runs)
    assert got.inside == 11 and got.coverage_p > cc.ALPHA  # the count passes
    assert got.failed == ("skill",) and not got.passes and got.tau == 0 and got.skill_p == 1


def test_a_model_without_dp_communication_fails_where_the_runs_exercise_it(runs):
    """Published values made from the model itself (±3 %, alternating) at the counted runs' shapes spread
    over 64 DP groups across nodes: the model passes, the model without DP communication fails (its runs
    lean fast). At the runs' own layouts its term moves 3 of 13 runs and it passes: REPORT says so."""
    cols = [c for c in runs.columns if c not in ("predicted", "error_pct")]
    wide = runs[cols].assign(gpus=runs.mp.astype(int) * 64)
    truth = external.validate(rows=wide).predicted
    published = truth * (1 + 0.03 * (-1) ** np.arange(len(runs)))
    assert _check(truth, published, runs).passes
    no_dp = external.validate(rows=wide, without=("dp_comm_s",)).predicted
    got = _check(no_dp, published, runs)
    assert not got.passes and "centred" in got.failed and got.above >= 11
    table = pd.read_csv(cp.POWER_OUT).set_index("predictor")
    here = table.loc[cp.TERMS["dp_comm_s"]]
    assert here.passes and here.moved == 3
    assert "too few, and the runs too alike, to fail every wrong model" in power_text(table.reset_index())


def test_each_criterion_can_fail_only_from_its_fewest_runs():
    assert cc.FEWEST_TO_FAIL == {"coverage": 2, "skill": 4, "centred": 6}
    few = cc.check([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [20.0] * 3, [REGIME_BASIS] * 3)
    assert not few.failed and set(few.cannot_fail) == {"skill", "centred"} and not few.passes


def test_the_statistics_by_hand():
    assert cc.at_most_p(0, 2) == pytest.approx(0.04)  # two runs at 80 %, none inside
    assert cc.at_most_p(0, [0.9, 0.9]) == pytest.approx(0.01)  # at the pooled band's 90 %
    binomial = sum(math.comb(13, k) * 0.8**k * 0.2 ** (13 - k) for k in range(11))
    assert cc.at_most_p(10, 13) == pytest.approx(binomial) and cc.at_most_p(13, 13) == pytest.approx(1.0)
    assert cc.declared(REGIME_BASIS) == 0.8 and cc.declared(pooled_basis()) == 0.9
    assert cc.sign_p([-1] * 11 + [1, 1, 0])[2] == pytest.approx(2 * (1 + 13 + 78) / 2**13)
    tau, p = cc.skill_p([1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
    assert tau == 1 and p == pytest.approx(1 / 120, abs=0.003)  # one order of 5! as concordant
    assert cc.skill_p([5, 4, 3, 2, 1], [10, 20, 30, 40, 50])[0] == -1
    assert cc.kendall_tau([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / math.sqrt(5 * 6))  # tau-b with a tie


def test_the_model_leaning_one_way_fails_centred():
    published = np.arange(10, 23, dtype=float)
    low = cc.check(published * 0.9, published, [22.3] * 13, [pooled_basis()] * 13)
    assert low.inside == 13 and low.failed == ("centred",)
    even = cc.check(published * (1 + 0.1 * (-1) ** np.arange(13)), published, [22.3] * 13, [pooled_basis()] * 13)
    assert even.passes


def test_committed_power_table_is_the_writers(runs, tmp_path):
    again = cp.write(pd.read_csv(external.HOLDOUT_OUT), pd.read_csv(cp.COVERAGE_OUT), tmp_path / "p.csv")
    kept = pd.read_csv(cp.POWER_OUT)
    assert list(kept.predictor) == list(again.predictor) and list(kept.passes) == list(again.passes)
    np.testing.assert_allclose(kept.mean_abs_pct, again.mean_abs_pct, rtol=1e-9)


def test_the_count_sentence_tests_the_declared_coverage_or_says_too_few():
    check = pd.DataFrame(dict(source="h", inside=[True] * 6 + [False] * 7, band_basis=REGIME_BASIS))
    assert "6 of 13" in count_text(check) and "so the count fails the declared" in count_text(check)
    assert "is consistent with" in count_text(check.assign(inside=True))
    few = count_text(check.head(1))
    assert "too few runs to check" in few and "of 1" not in few
