"""docs/perfmodel.md "Results against the paper" says what the committed CSVs say: its table is
REPORT's summary line per artifact (report.section) with the mean, worst and count over every row
with an error, its per-row errors are the CSVs' (rounded to 0.1 %), and its band count is REPORT's."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from zerobench.artifacts.judging import judged_bands
from zerobench.artifacts.judging.common import mape
from zerobench.artifacts.report import report

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("table2", "fig2", "fig3", "fig5", "fig6", "fig7", "fig8")


def _section() -> str:
    text = (ROOT / "docs" / "perfmodel.md").read_text()
    start = text.index("## Results against the paper\n")
    return text[start : text.index("\n## ", start + 1)]


def _csv(name: str) -> pd.DataFrame:
    return pd.read_csv(ROOT / "results" / f"{name}.csv")


@pytest.mark.parametrize("name", NAMES)
def test_the_table_row_is_the_reports(name):
    rows = [line for line in _section().splitlines() if line.startswith(f"| {name} |")]
    assert len(rows) == 1, f"{name}: one table row in the section"
    df = _csv(name)
    sheet = yaml.safe_load((ROOT / "workflows" / "config" / "sheets" / f"{name}.yaml").read_text())
    summary = [c.strip() for c in report.section(name, sheet, df)[1].strip("|").split("|")]
    mean, worst, points = mape(df)
    want = [name, *summary[2:], f"{mean:.2f}, {worst:.2f}, {points}"]
    assert [c.strip() for c in rows[0].strip("|").split("|")] == want


def _errors(bullet: str) -> dict[tuple[str, str], float]:
    """(role, key) -> error % of one 'Within the figures' bullet: 'role: key +x.x %, key −y.y %; role: ...'."""
    out = {}
    for part in bullet.split(") ", 1)[1].rstrip(".").split("; "):
        role, items = part.split(": ", 1)
        for item in items.split(", "):
            key, value = re.fullmatch(r"(.+) ([+−]\d+\.\d) %", item).groups()
            out[(role, key)] = float(value.replace("−", "-"))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_each_rows_error_is_the_csvs(name):
    bullets = [line for line in _section().splitlines() if line.startswith(f"- {name} (`results/{name}.csv`) ")]
    assert len(bullets) == 1
    df = _csv(name)
    df = df[df.error_pct.notna() & (df.role != "formula")]
    want = {(r.role, r.key): round(float(r.error_pct), 1) for r in df.itertuples()}
    assert _errors(bullets[0]) == pytest.approx(want, abs=1e-9)


def test_the_judged_count_and_the_band_count_are_the_reports():
    tables = {name: _csv(name) for name in NAMES}
    rows, _ = judged_bands.once(tables)
    inside = int(rows.inside_band.astype(str).str.lower().eq("true").sum())
    section = _section()
    per = ", ".join(f"{n} {len(report.judged(t))}" for n, t in tables.items())
    assert f"The judged points are {len(rows)}: {per}." in section
    assert f"{inside} of the {len(rows)} are inside" in section
    assert f"{inside} of {len(rows)} judged rows inside their band" in (ROOT / "results" / "REPORT.md").read_text()
