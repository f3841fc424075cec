"""An artifact's table (results/<artifact>.csv) -> its figure (figures/<artifact>.png).

Ours are filled markers labelled with their source (measured / traced / modelled), the paper's
numbers hollow black markers labelled "paper", and the paper's formula a line where there is one.
This module draws the measured CPU experiments, the generic comparison, and saves every figure;
the paper-scale artifacts are drawn in their paper's form (artifacts/plots/paper.py), the scaling
plots on log-2 axes (artifacts/plots/scaling.py), each artifact's by its entry in FIGURES, keyed
as the table registry (tables/registry.py). matplotlib's Agg backend; no torch import.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from zerobench.artifacts.plots import paper, scaling  # noqa: E402
from zerobench.artifacts.plots.bands import errorbar  # noqa: E402
from zerobench.artifacts.plots.style import COLORS, MARKERS, PAPER  # noqa: E402
from zerobench.stages import STAGE_LABELS  # noqa: E402


def _paper_points(ax, x, y, label="paper") -> None:
    mask = y.notna()
    if mask.any():
        ax.scatter(x[mask], y[mask], label=label, **PAPER)


def memory(df: pd.DataFrame, fig) -> None:
    ax, ax2 = fig.subplots(1, 2)
    for stage, sub in df.groupby("stage"):
        c = COLORS[stage]
        line = sub.drop_duplicates("dp").sort_values("dp")
        ax.plot(line.dp, line.expected, "-", color=c, alpha=0.5, label=f"{STAGE_LABELS[stage]} formula")
        for source, s in sub.groupby("source"):
            ax.scatter(
                s.dp,
                s.ours,
                color=c,
                marker=MARKERS[source],
                s=40,
                zorder=4,
                label=f"{STAGE_LABELS[stage]} {source} ({s.model.iloc[0]})",
            )
        _paper_points(ax, sub.dp, sub.paper, "paper (Table 1, 7.5B)" if stage == 3 else None)
        meas = sub[(sub.source == "measured") & sub.rss_growth_bytes.notna()].sort_values("dp")
        if len(meas):
            ax2.plot(meas.dp, meas.model_state_bytes / 2**20, "--", color=c, alpha=0.6)
            ax2.plot(
                meas.dp,
                meas.rss_growth_bytes / 2**20,
                "o-",
                color=c,
                label=f"{STAGE_LABELS[stage]} measured peak (model states dashed)",
            )
    ax.set(xscale="log", yscale="log", xlabel="DP degree N_d", ylabel="model-state bytes per parameter per rank")
    ax.legend(fontsize=6, ncol=2)
    ax2.set(xscale="log", xlabel="DP degree N_d", ylabel="MiB per rank (CPU, peak RSS growth)")
    ax2.legend(fontsize=6)
    for a, dps in ((ax, df.dp), (ax2, df[df.source == "measured"].dp)):
        ticks = sorted(dps.unique())
        a.set_xticks(ticks, [str(int(t)) for t in ticks])
        a.minorticks_off()


def comm(df: pd.DataFrame, fig) -> None:
    ax = fig.subplots()
    dps = sorted(df.dp.unique())
    width = 0.8 / len(dps)
    for i, dp in enumerate(dps):
        sub = df[df.dp == dp].sort_values("stage")
        ax.bar(sub.stage + (i - (len(dps) - 1) / 2) * width, sub.ours, width, label=f"measured, N_d={dp}")
    paper = df.drop_duplicates("stage").sort_values("stage")
    _paper_points(ax, paper.stage, paper.paper, "paper §7: 2Ψ, 2Ψ, 2Ψ, 3Ψ")
    ax.set_xticks(paper.stage, [STAGE_LABELS[s] for s in paper.stage])
    ax.set(ylabel="DP volume per rank per step / (Ψ (N_d-1)/N_d)", ylim=(0, 3.6))
    ax.legend(fontsize=8)


def loss(df: pd.DataFrame, fig) -> None:
    ax, ax2 = fig.subplots(1, 2)
    for layout, sub in df[df.ours.notna()].groupby("layout", sort=False):
        ax.plot(sub.step, sub.ours, lw=1, label=f"{layout} (measured)")
        ax2.plot(sub.step, (sub.ours - sub.expected).abs(), lw=1, label=layout)
    ax.set(xlabel="step", ylabel=f"training loss, nats per byte ({df.data.dropna().iloc[0]})")
    ax.legend(fontsize=7)
    ax2.set(xlabel="step", ylabel="|loss - single-process loss|", yscale="symlog", ylim=(0, None))
    ax2.axhline(0, color="black", lw=0.5)
    ax2.set_yscale("symlog", linthresh=1e-7)
    ax2.legend(fontsize=7)


def capacity(df: pd.DataFrame, fig) -> None:
    """Left: each stage's trials by size (trained or over budget) with the largest model measured,
    modelled and by the bare formula. Right: each trial's predicted peak memory against measured."""
    ax, ax2 = fig.subplots(1, 2)
    trials, largest = df[df.kind == "trial"], df[df.kind == "largest"]
    for stage, sub in trials.groupby("stage"):
        ok, oom = sub[sub.status == "ok"], sub[sub.status != "ok"]
        ax.scatter(ok.num_params / 1e6, [stage] * len(ok), color=COLORS[stage], label=f"{STAGE_LABELS[stage]} trains")
        ax.scatter(
            oom.num_params / 1e6,
            [stage] * len(oom),
            color=COLORS[stage],
            marker="x",
            s=60,
            label=f"{STAGE_LABELS[stage]} over budget (oom)",
        )
        ax2.scatter(sub.expected, sub.ours, color=COLORS[stage], label=STAGE_LABELS[stage])
    ax.scatter(largest.expected, largest.stage, marker="|", s=500, color="black", label="largest, measured (crossing)")
    ax.scatter(
        largest.ours,
        largest.stage,
        marker="D",
        facecolors="none",
        edgecolors="red",
        s=70,
        label="largest, calibrated model",
    )
    ax.scatter(largest.formula, largest.stage, marker="|", s=500, color="gray", label="formula: model states only")
    cap = df.mem_cap_bytes.dropna().iloc[0] / 2**20
    ax.set_yticks(list(STAGE_LABELS), list(STAGE_LABELS.values()))
    ax.set(xlabel="parameters (M)", title=f"budget {cap:.0f} MiB per rank")
    ax.legend(fontsize=6)
    both = pd.concat([trials.expected, trials.ours])
    lim = [both.min() * 0.95, both.max() * 1.05]
    ax2.plot(lim, lim, color="black", lw=0.6, label="predicted = measured")
    ax2.axvline(cap, color="red", lw=0.6, ls="--", label=f"budget ({cap:.0f} MiB)")
    ax2.axhline(cap, color="red", lw=0.6, ls="--")
    ax2.set(xlabel="measured peak RSS growth (MiB)", ylabel="calibrated model's peak (MiB)", xlim=lim, ylim=lim)
    ax2.legend(fontsize=7)


def compare(df: pd.DataFrame, fig, source_label: str = "modelled") -> None:
    """Any artifact with key / ours / paper: ours and the paper's number side by side per point,
    one panel per `series` where the artifact has them (each series is one unit: TFLOPS,
    speed-up, billions of parameters), and the status written where we have no number."""
    df = df[df.ours.notna() | df.paper.notna()].reset_index(drop=True)
    groups = list(df.groupby("series", sort=False)) if "series" in df else [("", df)]
    axes = fig.subplots(len(groups), 1, squeeze=False, height_ratios=[len(g) for _, g in groups])[:, 0]
    for ax, (series, sub) in zip(axes, groups):
        y = list(range(len(sub)))
        src = sub.source.iloc[0] if "source" in sub and len(sub) else source_label
        ax.barh([v + 0.2 for v in y], sub.ours.fillna(0), 0.4, label=f"ours ({src})")
        for v, (ours, band) in enumerate(zip(sub.ours, sub.get("band_pct", [None] * len(sub)))):
            errorbar(ax, v + 0.2, ours, band, horizontal=True)
        if sub.paper.notna().any():
            ax.barh([v - 0.2 for v in y], sub.paper.fillna(0), 0.4, color="none", edgecolor="black", label="paper")
        for v, (ours, status) in enumerate(zip(sub.ours, sub.get("status", [None] * len(sub)))):
            if pd.isna(ours):
                ax.text(0, v + 0.2, f" {status if isinstance(status, str) else 'n/a'}", va="center", fontsize=6)
        ax.set_yticks(y, sub.key, fontsize=6)
        ax.invert_yaxis()
        ax.set_title(str(series), fontsize=8, loc="left")
        ax.legend(fontsize=7)


def render(df: pd.DataFrame, draw, size: tuple[float, float], out, title: str = "") -> None:
    """`draw(df, fig)` on a figure of `size` inches, titled, saved as the PNG `out`."""
    fig = plt.figure(figsize=size)
    draw(df, fig)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


@dataclass(frozen=True)
class Figure:
    """`draw(df, fig)` draws an artifact's table into a figure of `size` inches (None: ours beside
    the paper's per row, its height by the rows)."""

    draw: Callable
    size: tuple[float, float] | None = (13, 5)


FIGURES: dict[str, Figure] = {
    "table1": Figure(paper.table1, (13, 8)),
    "fig1": Figure(memory),
    "comm_volume": Figure(comm, (8, 5)),
    "fig9_loss": Figure(loss),
    "capacity": Figure(capacity),
    "model_vs_measured": Figure(compare, None),
    "table2": Figure(paper.table2),
    "fig2": Figure(paper.fig2),
    "fig3": Figure(scaling.fig3),
    "superlinear": Figure(scaling.superlinear),
    "superlinear_emulated": Figure(scaling.superlinear_emulated),
    "fig3_emulated": Figure(scaling.fig3_emulated),
    "fig6_emulated": Figure(paper.fig6, (8, 5)),
    "fig7_emulated": Figure(paper.fig7, (8, 5)),
    "fig8_emulated": Figure(paper.fig8),
    "fig5": Figure(paper.fig5, (8, 5)),
    "fig6": Figure(paper.fig6, (8, 5)),
    "fig7": Figure(paper.fig7, (8, 5)),
    "fig8": Figure(paper.fig8),
    "today": Figure(paper.today, (13, 6.5)),
    "sweep": Figure(compare, None),
}


def plot(name: str, table, out, title: str = "") -> None:
    """Draw artifact `name`'s figure (its entry in FIGURES) from its CSV `table` into the PNG `out`."""
    if name not in FIGURES:
        raise ValueError(f"plot {name!r}: choose one of {sorted(FIGURES)}")
    figure = FIGURES[name]
    df = pd.read_csv(table)
    size = figure.size or (8, max(4.5, 0.17 * len(df) + 1.5))  # the comparison: a bar per row
    render(df, figure.draw, size, out, title)
