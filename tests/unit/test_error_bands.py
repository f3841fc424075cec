"""Error bands on modelled figures (perfmodel/error_bands.py, fitting/write_bands.py): the regime of
a layout, the band of a regime from its validation runs, its coverage counted on the holdout runs
that set none, and the record and estimate that carry it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from zerobench.engine.config import ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.fitting import write_bands as writer
from zerobench.fitting.external import HOLDOUT_OUT
from zerobench.perfmodel import error_bands as eb
from zerobench.perfmodel.predict import estimate_text, model_record

GPT = ModelConfig(layers=32, hidden=4096, heads=32, seq=2048, vocab=51200, name="gpt-6.4b")


@pytest.mark.parametrize(
    "hw, gpus, mp, stage, want",
    [
        ("a100-80gb", 8, 1, 3, ("a100", "fully-sharded", "1-8")),
        ("a100-80gb", 9, 8, 3, ("a100", "fully-sharded", "9-64")),  # stage 3 is sharded whatever the MP
        ("h200-141gb", 512, 8, 2, ("h200", "tensor-parallel", "65-512")),
        ("v100-32gb-dgx2", 513, 1, 1, ("v100", "data-parallel", ">512")),
        ("v100-32gb-dgx2", 64, 1, 0, ("v100", "data-parallel", "9-64")),
        ("cpu-local", 2, 1, 2, ("cpu-local", "data-parallel", "1-8")),  # a measured host is its own generation
    ],
)
def test_regime_of_a_layout(hw, gpus, mp, stage, want):
    r = eb.regime(hw, gpus, mp, stage)
    assert (r.generation, r.kind, r.scale) == want


def test_bad_regimes_are_refused():
    with pytest.raises(ValueError, match="gpus"):
        eb.regime("a100-80gb", 0, 1, 0)
    with pytest.raises(ValueError, match="kind"):
        eb.Regime("a100", "pipeline", "1-8")


def test_interval_rank_is_the_conformal_quantile():
    assert eb.COVERAGE == 0.8 and eb.MIN_RUNS == 4
    assert [eb.interval_rank(n) for n in (1, 3, 4, 9, 14)] == [None, None, 4, 8, 12]
    assert eb.prediction_interval([-5, 1, 3, 2]) == 5  # four runs: the largest
    assert eb.prediction_interval([1, 2, 3]) is None


def test_band_is_the_prediction_interval_of_the_regimes_validation_runs(tmp_path):
    loso = pd.DataFrame(dict(source=["s1", "s1", "s2"], hardware="a100-80gb", gpus=[8, 8, 16], mp=1, stage=3,
                             error_pct=[10.0, -20.0, 4.0]))  # fmt: skip
    hold = pd.DataFrame(dict(source=["v", "v", "v", "v", "h"], hardware="a100-80gb", gpus=[2, 1, 1024, 2048, 4],
                             mp=1, stage=3, error_pct=[-3.0, 5.0, 50.0, 100.0, 30.0],
                             expressible=["yes", "yes", "yes", "no: pipeline", "yes"],
                             role=["validation"] * 4 + ["holdout"]))  # fmt: skip
    path = tmp_path / "bands.csv"
    table, check = writer.write(loso, hold, path, tmp_path / "coverage.csv")
    table = table.set_index("scale")
    small = table.loc["1-8"]  # 10, -20 (leave-one-source-out), -3 and 5 (validation); the holdout run 30 left out
    assert small.runs == 4 and small.band_pct == 20 and small.coverage == 0.8
    assert small.mean_abs_pct == pytest.approx(9.5) and small.worst_pct == 20
    assert small.bias_pct == pytest.approx(-2.0)
    assert small.evidence == "s1 (leave-one-source-out, 2); v (holdout, then validation: a choice was made on it, 2)"
    assert eb.band("a100-80gb", 4, 1, 3, path).value == pytest.approx(20.0)
    assert "80% prediction interval from 4 validation runs" in eb.band("a100-80gb", 4, 1, 3, path).text()
    few = eb.band("a100-80gb", 16, 1, 3, path)  # one run: no number
    assert few.value == eb.UNVALIDATED and few.runs == 1 and "fewer than 4" in few.text()
    none = eb.band("h100-80gb", 4, 1, 3, path)
    assert none.value == eb.UNVALIDATED and none.text().startswith("unvalidated: no validation")
    # the holdout run is judged by its regime's band (20), not counted in it: 30 lies outside
    assert list(check.band_pct) == [20.0] and list(check.inside) == [False]


def _recorded_runs() -> pd.DataFrame:
    return writer.heldout_runs(pd.read_csv(writer.LOSO_OUT), pd.read_csv(HOLDOUT_OUT))


def _coverage(runs: pd.DataFrame) -> int:
    """Counted runs inside the bands the other runs set."""
    return int(writer.counted(runs, writer.bands(runs), writer.pooled(runs)).inside.sum())


def test_the_coverage_is_counted_on_runs_that_set_no_band():
    runs = _recorded_runs()
    check = writer.counted(runs, writer.bands(runs), writer.pooled(runs))
    assert set(check.evidence) == {writer.COUNTED} and len(check) == (runs.evidence == writer.COUNTED).sum()
    setting = runs[runs.evidence.isin(writer.SETS_BAND)]
    assert int(writer.pooled(runs).runs.iloc[0]) == len(setting) and not set(setting.evidence) & {writer.COUNTED}


def test_a_wrong_model_moves_the_coverage():
    """Twice the counted runs' errors, or the errors dealt out to other runs across regimes, give another
    count: the figure depends on the errors, not only on how many runs each regime has (a leave-one-out
    count within one set of runs does not). Twice every error, band-setting runs included, would give
    the same count: a conformal band scales with its runs' errors."""
    runs = _recorded_runs()
    base = _coverage(runs)
    doubled = runs.assign(error_pct=runs.error_pct.where(runs.evidence != writer.COUNTED, 2 * runs.error_pct))
    assert _coverage(doubled) < base
    rng = np.random.default_rng(0)
    shuffled = {_coverage(runs.assign(error_pct=rng.permutation(runs.error_pct.values))) for _ in range(20)}
    assert shuffled - {base}


def test_committed_bands_follow_from_the_recorded_runs(tmp_path):
    """zerobench/data/error_bands.csv and results/external_coverage.csv are what the writer makes of
    results/external_loso.csv and results/external_holdout.csv: no band typed in by hand."""
    again, check = writer.write(pd.read_csv(writer.LOSO_OUT), pd.read_csv(HOLDOUT_OUT), tmp_path / "b.csv",
                                tmp_path / "c.csv")  # fmt: skip
    committed = pd.read_csv(eb.BANDS)
    cols = [c for c in committed.columns if c != "made_by"]
    pd.testing.assert_frame_equal(again[cols].reset_index(drop=True), committed[cols], check_dtype=False)
    kept = pd.read_csv(writer.COVERAGE_OUT)
    assert list(kept.inside) == list(check.inside) and list(kept.band_pct) == list(check.band_pct)
    assert set(committed.generation) >= {"a100"}


def test_modelled_record_and_estimate_carry_the_band():
    prec, train = PrecisionConfig("bf16", "cuda"), TrainConfig(micro_batch=1)
    sharded = ParallelConfig(dp=8, mp=1, stage=3, checkpoint_activations=True)
    rec = model_record(GPT, sharded, prec, train, "a100-80gb", attention="fused")
    committed = pd.read_csv(eb.BANDS).set_index(["generation", "kind", "scale"])
    assert rec["error_band_pct"] == pytest.approx(committed.loc[("a100", "fully-sharded", "1-8"), "band_pct"], abs=0.05)
    assert model_record(GPT, sharded, prec, train, "h100-80gb", attention="fused")["error_band_pct"] == "unvalidated"
    text = estimate_text(GPT, sharded, prec, train, "a100-80gb")
    assert "% (80% prediction interval from" in text and "implementation profile: efficient" in text
    assert "unvalidated" in estimate_text(GPT, sharded, prec, train, "h200-141gb")


def test_perfmodel_reads_the_bands_without_importing_fitting():
    code = ("import sys; from zerobench.perfmodel.predict import model_record, band; band('a100-80gb', 8, 1, 3); "
            "sys.exit(any(m.startswith('zerobench.fitting') for m in sys.modules))")  # fmt: skip
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_today_figure_draws_each_modelled_bar_with_its_band():
    """The error bar's ends, read back from the drawn figure, are the value ± its band; an
    row without a band gets none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from zerobench.artifacts.plots.paper import today

    df = pd.DataFrame(dict(experiment=["100B", "100B"], hardware=["a100-80gb", "h100-80gb"], gpu=["A100", "H100"],
                           ours=[100.0, 300.0], paper=[None, None], source="modelled", status="ok",
                           band_pct=[10.0, None]))  # fmt: skip
    fig = plt.figure()
    today(df, fig)
    ax = fig.axes[0]
    ends = [seg[:, 1] for coll in ax.collections for seg in getattr(coll, "get_segments", list)()]
    plt.close(fig)
    assert len(ends) == 1 and sorted(ends[0]) == pytest.approx([90.0, 110.0])
