"""The figures in the paper's form, drawn from the committed tables: Fig 3's perfect-linear line,
Table 1's log colour scale, bars that say `oom` where there is no number, sources in the legend."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection
from matplotlib.colors import LogNorm
from matplotlib.patches import Rectangle

from zerobench.artifacts.plots import draw as draw_module
from zerobench.artifacts.plots import paper as plot_paper
from zerobench.artifacts.plots import scaling as plot_scaling
from zerobench.artifacts.plots.draw import plot

ROOT = Path(__file__).resolve().parents[2]


def draw(fn, name: str):
    fig = plt.figure()
    fn(pd.read_csv(ROOT / f"results/{name}.csv"), fig)
    return fig


def test_fig3_linear_line_starts_at_the_first_point_on_log2_axes():
    df = pd.read_csv(ROOT / "results/fig3.csv")
    total = df[df.series == "total TFLOPS"].sort_values("gpus")
    ax = draw(plot_scaling.fig3, "fig3").axes[0]
    line = next(ln for ln in ax.lines if ln.get_label() == "perfect linear from ours' first point")
    x0, y0 = total.gpus.iloc[0], total.ours.iloc[0]
    assert list(line.get_ydata()) == pytest.approx([y0 * x / x0 for x in total.gpus])
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    plt.close("all")


def test_table1_is_a_log_heatmap_with_every_cell_written():
    fig = draw(plot_paper.table1, "table1")
    image = fig.axes[0].images[0]
    assert isinstance(image.norm, LogNorm)
    assert len(fig.axes[0].texts) == len(pd.read_csv(ROOT / "results/table1.csv"))
    plt.close("all")


def test_bars_write_the_status_where_there_is_no_number_and_name_the_source():
    ax = draw(plot_paper.fig7, "fig7").axes[0]
    assert sum(t.get_text().strip() == "oom" for t in ax.texts) == 4  # 170B C1-C4 do not fit
    labels = ax.get_legend_handles_labels()[1] + [t.get_text() for t in ax.get_legend().get_texts()]
    assert "paper" in labels and "ours: modelled" in labels and {"C1", "C5"} <= set(labels)
    plt.close("all")


def _drawn(fig) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """What a figure shows, read back from its artists: the coordinates of its lines and markers,
    its bars' widths and heights and its images' cells; and each number written in its texts with
    half a unit of its last printed digit (a text shows a value at the precision it prints)."""
    drawn = []
    for ax in fig.axes:
        for line in ax.lines:
            drawn += [*np.asarray(line.get_xdata(), float), *np.asarray(line.get_ydata(), float)]
        for markers in (c for c in ax.collections if isinstance(c, PathCollection)):
            drawn += list(np.asarray(markers.get_offsets(), float).ravel())
        for bar in (p for p in ax.patches if isinstance(p, Rectangle)):
            drawn += [bar.get_width(), bar.get_height()]
        for image in ax.images:
            drawn += list(np.asarray(image.get_array(), float).ravel())
    written = [(float(m[0]), 0.5 * 10.0 ** -len(m[1])) for ax in fig.axes for t in ax.texts
               for m in re.findall(r"(-?\d+\.?(\d*))(?![\d.e])", t.get_text())]  # fmt: skip
    return np.array([v for v in drawn if np.isfinite(v)]), written


def _not_shown(df: pd.DataFrame, fig) -> list[str]:
    """The numbers of ours and of the paper in `df` that `fig` neither draws nor writes at the
    precision it prints them (Fig 2's speed-ups, Table 1's cells)."""
    drawn, written = _drawn(fig)
    missing = []
    for column in ("ours", "paper"):
        for value in df[column].dropna().astype(float):
            if not np.isclose(drawn, value, rtol=1e-9, atol=0).any() and not any(
                abs(value - w) <= half * (1 + 1e-9) for w, half in written
            ):
                missing.append(f"{column} {value:g}")
    return missing


def _figure(monkeypatch, tmp_path, name: str):
    """The figure `plot()` draws of results/<name>.csv, kept open."""
    figures = []
    monkeypatch.setattr(draw_module.plt, "close", figures.append)
    plot(name, str(ROOT / f"results/{name}.csv"), str(tmp_path / "f.png"), name)
    assert (tmp_path / "f.png").stat().st_size > 10_000
    return figures[-1]


@pytest.mark.parametrize("name", ["fig2", "fig3", "fig5", "fig6", "fig7", "fig8", "table1", "table2", "today"])
def test_every_paper_artifact_draws_its_tables_numbers(tmp_path, monkeypatch, name):
    fig = _figure(monkeypatch, tmp_path, name)
    assert _not_shown(pd.read_csv(ROOT / f"results/{name}.csv"), fig) == []
    plt.close("all")


def test_a_number_the_figure_does_not_show_is_caught(tmp_path, monkeypatch):
    # the figures of the committed tables, checked against tables that differ by one number: a
    # bar (Fig 5's C5, 0.9B more) and a written speed-up (Fig 2's 8B, 0.2 more; printed as 0.1)
    fig5 = pd.read_csv(ROOT / "results/fig5.csv")
    changed = fig5.assign(ours=fig5.ours.where(fig5.key != "C5", fig5.ours + 0.9))
    assert _not_shown(changed, _figure(monkeypatch, tmp_path, "fig5")) == [f"ours {changed.ours.iloc[-1]:g}"]
    fig2 = pd.read_csv(ROOT / "results/fig2.csv")
    changed = fig2.assign(ours=fig2.ours.where(fig2.key != "speed-up 8B", fig2.ours + 0.2))
    assert len(_not_shown(changed, _figure(monkeypatch, tmp_path, "fig2"))) == 1
    plt.close("all")


def test_a_name_with_no_figure_is_refused(tmp_path):
    with pytest.raises(ValueError, match="plot 'fig4': choose one of"):
        plot("fig4", tmp_path / "fig4.csv", tmp_path / "fig4.png")
