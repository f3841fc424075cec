"""One band column on a table's rows, one prediction counted once over the artifacts, and a role on
every row of the external tables (artifacts/judging/judged_bands.py, artifacts/judging/common.py `prediction`,
fitting/external.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from zerobench.artifacts.judging import judged_bands
from zerobench.artifacts.judging.common import prediction
from zerobench.perfmodel import error_bands as eb

RESULTS = Path(__file__).resolve().parents[2] / "results"
POOLED, RUNS = eb.pooled()


def test_a_row_carries_its_regimes_band_else_the_pooled_one():
    assert eb.carried(10.1) == (10.1, eb.REGIME_BASIS)
    assert eb.carried(eb.UNVALIDATED) == (POOLED, f"pooled ({RUNS} validation runs, 90%)")
    assert eb.carried(10.1, memory=True) == (POOLED, eb.MEMORY_BASIS)
    assert eb.carried(None) == (None, None) and eb.carried(float("nan")) == (None, None)


def test_the_table_keeps_one_band_column():
    """The records' band (a number or `unvalidated`) becomes `band_pct`, a number, and is dropped; a
    row with no number of ours gets no band, and only a judged row is said inside or not."""
    df = pd.DataFrame(dict(key=["a", "b", "c", "d"], ours=[1.0, 1.0, None, 1.0], error_pct=[15.0, 15.0, None, 50.0],
                           role=["judged", "judged", "judged", "fitted"],
                           error_band_pct=[eb.UNVALIDATED, 10.0, eb.UNVALIDATED, 10.0]))  # fmt: skip
    out = judged_bands.add(df)
    assert "error_band_pct" not in out
    assert list(out.band_pct[:2]) == [POOLED, 10.0] and pd.isna(out.band_pct[2]) and out.band_pct[3] == 10.0
    assert list(out.inside_band) == [True, False, None, None]


RECORD = dict(source="modelled", model="gpt-170b", hardware="v100-32gb-dgx2", world_size=400, dp=25, mp=16, stage=2,
              micro_batch=7, partition_activations=True, offload_activations=True)  # fmt: skip


def _table(*rows) -> pd.DataFrame:
    cols = ("key", "role", "error_pct", "prediction")
    return pd.DataFrame([dict(zip(cols, r)) for r in rows]).assign(inside_band=lambda d: d.error_pct < 20)


def test_one_prediction_is_counted_once_over_the_artifacts():
    """Two judged rows of two artifacts reading the same quantity of the same record count once in
    the headline; a different batch, or another quantity of the same record, is another prediction."""
    same = prediction(RECORD, "TFLOPS/GPU")
    assert same == prediction(dict(RECORD), "TFLOPS/GPU")
    assert prediction({**RECORD, "micro_batch": 12}, "TFLOPS/GPU") != same
    assert prediction(RECORD, "memory cached") != same
    tables = {"fig2": _table(("ZeRO 170B", "judged", 4.0, same), ("ZeRO 1.5B", "judged", 30.0, "other")),
              "fig7": _table(("170B C5", "judged", 4.0, same), ("60B C1", "fitted", 5.0, "third"))}  # fmt: skip
    rows, twice = judged_bands.once(tables)
    assert len(rows) == 2 and twice == ["fig7 170B C5 = fig2 ZeRO 170B"]
    line = judged_bands.headline(tables)
    assert "1 of 2 judged rows inside their band" in line and "fig7 170B C5 = fig2 ZeRO 170B" in line


def test_the_headline_of_tables_without_a_band_reads_none():
    """A sheet of measured rows only (no modelled row, so no band column), or judged rows none of
    which carries a band, gives '0 of 0' rather than failing the report."""
    measured = pd.DataFrame({"key": ["z0 dp1"], "role": ["judged"], "error_pct": [0.5]})
    unbanded = _table(("ZeRO 1.5B", "judged", 3.0, "a")).assign(inside_band=None)
    for tables in ({"fig1": measured}, {"fig2": unbanded}, {}):
        assert "0 of 0 judged rows inside their band" in judged_bands.headline(tables), tables


def test_fig2_and_fig7_170b_read_one_prediction():
    """The committed tables name the record they read: Fig 2's ZeRO 170B and Fig 7's 170B C5 are the
    same modelled run, so `once` would count them as one were both judged."""
    fig2 = pd.read_csv(RESULTS / "fig2.csv").set_index("key")
    fig7 = pd.read_csv(RESULTS / "fig7.csv").set_index("key")
    assert fig2.prediction["ZeRO 170B"] == fig7.prediction["170B C5"]
    assert fig2.prediction["ZeRO 100B"] != fig7.prediction["170B C5"]


def test_the_report_counts_the_bands_each_prediction_once():
    report = (RESULTS / "REPORT.md").read_text()
    tables = {n: pd.read_csv(RESULTS / f"{n}.csv") for n in ("table2", "fig2", "fig3", "fig5", "fig6", "fig7", "fig8")}
    assert judged_bands.headline(tables) in report


@pytest.mark.parametrize("name", ["external_holdout_at_6a41b00", "external_sensitivity"])
def test_the_external_tables_say_what_each_row_is(name):
    """The first scoring's rows carry the role each run has now, as the current scoring does; the
    sensitivity rows are `sensitivity`, beside the role of the run they vary."""
    df = pd.read_csv(RESULTS / f"{name}.csv")
    roles = pd.read_csv(RESULTS / "external_holdout.csv").groupby("source").role.first()
    if name == "external_sensitivity":
        assert set(df.role) == {"sensitivity"}
        assert (df.run_role == df.source.map(roles)).all() and set(df.run_role) == {"validation"}
    else:
        assert list(df.role) == list(df.source.map(roles)) and set(df.role) == {"holdout", "validation"}
