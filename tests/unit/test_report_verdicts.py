"""A verdict obeys its sheet: the limits the claim states beyond the mean are checked (report.py), and
the verdict without the fitted terms is given beside."""

from pathlib import Path

import pandas as pd
import pytest
import yaml

from zerobench.artifacts.report import report

SHEETS = Path(__file__).resolve().parents[2] / "workflows" / "config" / "sheets"


def _rows(step_errors, memory_errors, role="judged"):
    rows = [dict(key=f"s{i}", series="step time (s)", error_pct=e, role="judged", status="ok")
            for i, e in enumerate(step_errors)]  # fmt: skip
    rows += [dict(key=f"m{i}", series="peak memory (MiB)", error_pct=e, role=role, status="ok",
                  error_without_fitted_pct=3 * e) for i, e in enumerate(memory_errors)]  # fmt: skip
    return pd.DataFrame(rows)


@pytest.mark.parametrize("name", sorted(report.STATED_LIMITS))
def test_stated_limits_are_the_sheets_own_words(name):
    claim = " ".join(yaml.safe_load((SHEETS / f"{name}.yaml").read_text())["claim"].split())
    for words in report.STATED_LIMITS[name]["says"]:
        assert words in claim, (name, words)


def test_mean_within_but_a_stated_limit_missed_is_not_reproduced():
    limits = report.STATED_LIMITS["model_vs_measured"]
    df = _rows([2, 3, 32], [1, 2, 12])  # mean 8.7 % <= 10; step worst 32 > 25, memory worst 12 > 10
    missed = report.limits_missed(df, limits)
    assert missed == ["step time (s) worst 32.0% > 25%", "peak memory (MiB) worst 12.0% > 10%"]
    line = report.verdict(report.stats(df), 10, missed)
    assert line.startswith("**Not reproduced**") and "stated limits missed" in line
    ok = _rows([2, 3, 20], [1, 2, 9])
    assert report.verdict(report.stats(ok), 10, report.limits_missed(ok, limits)).startswith("**Mostly reproduced**")


def test_verdict_without_fitted_terms_reads_every_row():
    df = _rows([2, 3, 4], [1, 2, 3], role="fitted")  # memory rows carry a fitted term: no verdict reads them
    assert report.limits_missed(df, report.STATED_LIMITS["model_vs_measured"]) == []
    sheet = dict(tolerance_pct=10)
    line = report.without_fitted("model_vs_measured", sheet, df)
    assert line.startswith("**Without fitted terms**") and "peak memory (MiB): 3 rows, mean 6.0%, worst 9.0%" in line


RESULTS = Path(__file__).resolve().parents[2] / "results"


@pytest.mark.parametrize("name", ["fig2", "fig3", "fig5", "fig6", "fig7", "fig8", "table2", "capacity", "today"])
def test_every_projection_carries_its_band(name):
    """One band column: every modelled number has a band in % and its basis; the records' own
    `error_band_pct` (a number or `unvalidated`) is not shown beside it."""
    df = pd.read_csv(RESULTS / f"{name}.csv")
    assert "error_band_pct" not in df and "band_note" not in df
    modelled = df[df.source.astype(str).str.startswith("modelled") & df.ours.notna()]
    if "derived_from" in modelled:  # a ratio of two projections (Fig 2's speed-up) has no band of its own
        modelled = modelled[modelled.derived_from.isna()]
    assert len(modelled) and (modelled.band_pct.astype(float) > 0).all()
    assert modelled.band_basis.str.match(r"regime|pooled").all()
    if name == "today":  # no reference: a projection, never judged
        assert set(df.role) == {"projection"}


def test_the_report_counts_the_paper_runs_scored_below_their_listed_batch():
    """Each paper row run at a smaller micro-batch than the paper's, with what the listed batch needs
    by term; on the committed results, Fig 7's C3 alone (batch 32 without P_a: its checkpoints)."""
    tables = {n: pd.read_csv(RESULTS / f"{n}.csv") for n in ("table2", "fig2", "fig3", "fig5", "fig6", "fig7", "fig8")}
    line = report.capped(tables)
    assert "calls out of memory at the paper's batch**: 1 paper run(s)" in line
    assert "fig7 60B C3 (micro-batch 11; needs" in line and "activations" in line
    assert line in (RESULTS / "REPORT.md").read_text()
    none = {"fig2": pd.DataFrame({"key": ["ZeRO 1.5B"], "micro_batch": [24], "capped_by": [None]})}
    assert "**: 0 paper run(s)" in report.capped(none)
