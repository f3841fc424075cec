"""The figures in the paper's form, drawn from the committed tables: Fig 3's perfect-linear line,
Table 1's log colour scale, bars that say `oom` where there is no number, sources in the legend."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.colors import LogNorm

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


@pytest.mark.parametrize("name", ["fig2", "fig3", "fig5", "fig6", "fig7", "fig8", "table1", "table2", "today"])
def test_every_paper_artifact_draws_from_its_table(tmp_path, name):
    plot(name, str(ROOT / f"results/{name}.csv"), str(tmp_path / "f.png"), name)
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
