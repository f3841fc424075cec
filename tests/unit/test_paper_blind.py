"""Every paper row judged under the paper-blind reading (fitting/paper_blind.py, results/paper_blind.csv),
each priced as the code that ran it, and REPORT's headline from it (artifacts/report/blind_section.py)."""

from pathlib import Path

import pandas as pd
import pytest

from zerobench.artifacts.report.blind_section import blind_section
from zerobench.fitting.paper_blind import ARTIFACTS, COLUMNS, blind_table, code_of
from zerobench.perfmodel.implementation import PAPER_CODES

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_each_paper_trial_names_the_code_that_ran_it():
    assert code_of("fig2", {"stage": 0}) == "megatron-lm-2019"
    assert code_of("table2", {"stage": 0, "zero_os": True}) == "megatron-lm-2019"
    assert code_of("fig8", {"stage": 0}) == "pytorch-ddp-2019"
    assert code_of("fig2", {"zero_config": "C4"}) == "deepspeed-zero-2020"
    assert code_of("table2", {"stage": 1, "zero_os": True}) == "deepspeed-zero-os-2020"
    assert code_of("fig7", {"zero_config": "C1"}) == "deepspeed-zero-2020"  # C1 is P_os of May 2020, not ZeRO-OS


def test_the_committed_blind_table_judges_every_paper_row_of_every_figure():
    df = pd.read_csv(RESULTS / "paper_blind.csv")
    assert list(df.columns) == COLUMNS
    assert len(df) >= 55 and df.paper.notna().all() and df.ours.notna().all()
    assert set(df.artifact) == set(ARTIFACTS)
    assert (df.role == "judged").all() and df.inside_band.notna().all()
    assert set(df.implementation) <= set(PAPER_CODES)
    inside = df.error_pct.abs() <= df.band_pct
    assert (inside == df.inside_band.astype(bool)).all()


def test_fig2_is_priced_as_its_codes_and_the_committed_rows_are_current():
    table, codes = blind_table("fig2")
    rows = table[table.paper.notna() & (table.role != "derived")].set_index("key")
    base = rows.loc["baseline 40B"]
    assert codes[str(base.prediction).rpartition("#")[2]] == "megatron-lm-2019"
    # the largest micro-batch Megatron's own memory admits, the listed 4 at most
    assert base.micro_batch == min(4, base.max_micro_batch) and base.status == "ok"
    committed = pd.read_csv(RESULTS / "paper_blind.csv").query("artifact == 'fig2'").set_index("key")
    assert committed.ours.to_dict() == pytest.approx(rows.ours.loc[committed.index].to_dict())


def test_the_headline_gives_each_figure_blind_beside_tuned(tmp_path):
    rows = [dict(artifact="fig2", key="ZeRO 8B", implementation="deepspeed-zero-2020", ours=46.0, paper=36.9,
                 error_pct=24.7, band_pct=29.7, inside_band=True),
            dict(artifact="fig2", key="baseline 40B", implementation="megatron-lm-2019", ours=12.7, paper=5.0,
                 error_pct=154.0, band_pct=29.7, inside_band=False)]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "paper_blind.csv", index=False)
    tuned = {"fig2": pd.DataFrame(dict(key=["ZeRO 8B"], role=["fitted"], error_pct=[10.0]))}
    text = blind_section(tmp_path, tuned)
    assert "| fig2 | 2 | 89.3 | 154.0 | 1/2 | 0 |" in text and "baseline 40B (megatron-lm-2019) +154.0 %" in text
    assert blind_section(tmp_path / "none", tuned) is None
