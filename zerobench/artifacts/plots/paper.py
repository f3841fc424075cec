"""The paper-scale artifacts drawn in the paper's form: Fig 2 (ZeRO beside the baseline per model
size, with the speed-up), Figs 5-7 (bars for C1-C5), Fig 8 (throughput per size and the largest
model), Table 1 (a log-scale heatmap of its cells), Table 2 and `today` (one series per GPU).

Ours are bars hatched by source (solid measured, dots traced, slashes modelled, backslashes
emulated, crosses formula),
the paper's numbers hollow black circles, a row with no number its status written in its place.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.patches import Patch

from zerobench.artifacts.plots.bands import errorbar
from zerobench.artifacts.plots.style import COLORS as STAGE_COLORS
from zerobench.artifacts.plots.style import PAPER
from zerobench.stages import STAGE_LABELS

HATCH = {"measured": "", "traced": "..", "modelled": "//", "emulated": "\\\\", "formula": "xx"}
SERIES_COLORS = ["tab:blue", "tab:gray", "tab:orange", "tab:green", "tab:red", "tab:purple"]
CONFIGS = ["C1", "C2", "C3", "C4", "C5"]


def _size_b(key: str) -> float:
    """The model size in billions named in a row key ("ZeRO 1.5B", "40B C1")."""
    m = re.search(r"([\d.]+)B\b", key)
    return float(m.group(1)) if m else float("nan")


def bars(
    ax,
    df: pd.DataFrame,
    group: str,
    member: str,
    members: list | None = None,
    value: str = "ours",
    colors: dict | None = None,
    **legend,
) -> None:
    """Bars of `value` grouped by the column `group`, one colour per value of `member`, the paper's
    number over each bar, the status where we have none, and the sources in the legend."""
    groups = list(dict.fromkeys(df[group]))
    members = members or list(dict.fromkeys(df[member]))
    width = 0.8 / len(members)
    # Members are placed side by side among those present in the group, so a group with one bar
    # has it centred rather than at its member's slot.
    present = {g: [m for m in members if ((df[group] == g) & (df[member] == m)).any()] for g in groups}
    for j, name in enumerate(members):
        sub = df[df[member] == name].set_index(group).reindex(groups)
        x = np.array([
            i + (present[g].index(name) - (len(present[g]) - 1) / 2) * width if name in present[g] else np.nan
            for i, g in enumerate(groups)
        ])  # fmt: skip
        color = (colors or {}).get(name, SERIES_COLORS[j % len(SERIES_COLORS)])
        for xi, (_, r) in zip(x, sub.iterrows()):
            if pd.isna(xi) or pd.isna(r.get("source")):
                continue
            if pd.notna(r[value]):
                ax.bar(xi, r[value], width, color=color, hatch=HATCH.get(r.source, ""), edgecolor="white", lw=0)
                if value == "ours":
                    errorbar(ax, xi, r[value], r.get("band_pct"))
            else:
                ax.text(xi, 0, f" {r.get('status', 'n/a')}", rotation=90, ha="center", va="bottom", fontsize=7)
        ax.bar(0, 0, 0, color=color, label=str(name))  # legend entry only
        if value == "ours" and "paper" in sub and sub.paper.notna().any():
            ax.scatter(x, sub.paper, **PAPER)
    if value == "ours" and "paper" in df and df.paper.notna().any():
        ax.scatter([], [], label="paper", **PAPER)
    ax.set_xticks(range(len(groups)), [str(g) for g in groups], fontsize=8)
    _source_legend(ax, df, **legend)


def _source_legend(ax, df: pd.DataFrame, **kw) -> None:
    handles, labels = ax.get_legend_handles_labels()
    for src in sorted(df.source.dropna().unique()):
        handles.append(Patch(facecolor="lightgray", hatch=HATCH.get(src, ""), edgecolor="black", lw=0))
        labels.append(f"ours: {src}")
    ax.legend(handles, labels, fontsize=7, **kw)


def fig2(df: pd.DataFrame, fig) -> None:
    ax = fig.subplots()
    df = df.assign(size=df.size_b.map(lambda s: f"{s:g}B"))
    tput = df[df.series != "speed-up"]
    # the legend beside the axes: inside, it covers the speed-up labels above the largest sizes
    bars(ax, tput, "size", "series", loc="upper left", bbox_to_anchor=(1.005, 1.0))
    ax.set(xlabel="model size (400 GPUs)", ylabel="TFLOPS per GPU")
    top = np.nanmax(np.r_[tput.ours.to_numpy(float), tput.paper.to_numpy(float)])
    for i, (_, r) in enumerate(df[df.series == "speed-up"].iterrows()):
        paper = f"\npaper {r.paper:.1f}x" if pd.notna(r.paper) else ""
        ax.text(i, top * 1.04, f"{r.ours:.1f}x{paper}", ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, top * 1.25)
    ax.text(0.01, 0.99, "speed-up ZeRO / baseline above each size", transform=ax.transAxes, va="top", fontsize=7)


def fig5(df: pd.DataFrame, fig) -> None:
    ax = fig.subplots()
    df = df.assign(config=df.key.str.extract(r"(C\d)")[0], all="")
    bars(ax, df, "config", "all")
    ax.set(xlabel="ZeRO configuration (400 GPUs, MP 16)", ylabel="largest trainable model (B parameters)")


def _with_size_and_config(df: pd.DataFrame) -> pd.DataFrame:
    return df.assign(config=df.key.str.extract(r"(C\d)")[0], size=df.key.map(lambda k: f"{_size_b(k):g}B"))


def fig6(df: pd.DataFrame, fig) -> None:
    """The model's cached bytes beside the paper's (left) and the engine's traced allocated peak
    (right, where the sheet traced it), on one scale."""
    df = _with_size_and_config(df)
    traced = "traced_allocated_gib" in df and df.traced_allocated_gib.notna().any()
    axes = fig.subplots(1, 2, sharey=True) if traced else [fig.subplots()]
    bars(axes[0], df, "size", "config", CONFIGS)
    axes[0].set(xlabel="model size", ylabel="memory per GPU (GiB)", title="cached: modelled vs paper")
    if traced:
        bars(axes[1], df, "size", "config", CONFIGS, value="traced_allocated_gib")
        axes[1].set(xlabel="model size", title="allocated: the engine, traced")


def fig7(df: pd.DataFrame, fig) -> None:
    ax = fig.subplots()
    bars(ax, _with_size_and_config(df), "size", "config", CONFIGS)
    ax.set(xlabel="model size (60B on 128 GPUs, 170B on 400 GPUs)", ylabel="TFLOPS per GPU")


def fig8(df: pd.DataFrame, fig) -> None:
    ax, ax2 = fig.subplots(1, 2, width_ratios=[3, 1])
    runs = df[df.series != "max model (B)"]
    runs = runs.assign(size_b=runs.key.map(_size_b)).sort_values("size_b")
    bars(ax, runs.assign(size=runs.size_b.map(lambda s: f"{s:g}B")), "size", "series", ["ZeRO-DP", "DDP"])
    ax.set(xlabel="model size (128 GPUs, no MP)", ylabel="TFLOPS per GPU")
    largest = df[df.series == "max model (B)"]
    largest = largest.assign(system=largest.key.str.replace("max model ", ""))
    bars(ax2, largest, "system", "system", ["ZeRO-DP", "DDP"])
    ax2.set(ylabel="largest model without MP (B parameters)")


def table1(df: pd.DataFrame, fig) -> None:
    """Rows model x stage, columns N_d; colour log10 GB, each cell ours over the paper's print."""
    ax = fig.subplots()
    df = df.assign(row=df.model + " " + df.stage.map(STAGE_LABELS))
    rows = list(dict.fromkeys(df.sort_values(["num_params", "stage"]).row))
    grid = df.pivot(index="row", columns="nd", values="ours").reindex(rows)
    im = ax.imshow(grid.to_numpy(float), norm=LogNorm(), cmap="viridis_r", aspect="auto")
    fig.colorbar(im, ax=ax, label="GB per device (log scale)")
    letter = {"traced": "T", "formula": "F", "measured": "M", "modelled": "P"}
    for _, r in df.iterrows():
        i, j = rows.index(r.row), list(grid.columns).index(r.nd)
        text = f"{r.ours:.3g}\npaper {r.paper:g} · {letter.get(r.source, r.source)}"
        ax.text(
            j,
            i,
            text,
            ha="center",
            va="center",
            fontsize=6.5,
            color="black",
            bbox=dict(boxstyle="round,pad=0.15", fc="white", alpha=0.7, lw=0),
        )
    ax.set_xticks(range(len(grid.columns)), [str(c) for c in grid.columns])
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlabel("DP degree N_d   (cell: ours GB, paper's print; T traced by this engine, F the formula)")


def table2(df: pd.DataFrame, fig) -> None:
    """Per MP degree, each stage's theory (formula) beside its limit with residual memory (modelled),
    one colour per stage."""
    ax = fig.subplots()
    theory = df.key.str.endswith("theory")
    df = df.assign(column=df.stage.map(STAGE_LABELS) + np.where(theory, " theory", " with residual memory"))
    columns = [f"{STAGE_LABELS[s]}{k}" for s in sorted(df.stage.unique()) for k in (" theory", " with residual memory")]
    colors = {c: STAGE_COLORS[s] for s in STAGE_LABELS for c in columns if c.startswith(STAGE_LABELS[s] + " ")}
    bars(ax, df.assign(mp=df.mp.map(lambda m: f"MP {m}")), "mp", "column", columns, colors=colors, ncol=2)
    ax.set(yscale="log", ylabel="largest model (B parameters)", xlabel="MP degree (N_d = 64, 32 GB)")
    ax.set_ylim(None, ax.get_ylim()[1] * 30)  # room for the legend


def today(df: pd.DataFrame, fig) -> None:
    ax = fig.subplots()
    hw = list(dict.fromkeys(df.hardware))
    bars(
        ax,
        df.assign(label=df.hardware + " (" + df.gpu + ")"),
        "experiment",
        "label",
        [f"{h} ({df[df.hardware == h].gpu.iloc[0]})" for h in hw],
        loc="upper center",
        ncol=3,
    )
    ax.set(yscale="log", ylabel="TFLOPS per GPU")
    ax.set_ylim(None, ax.get_ylim()[1] * 4)  # room for the legend
    ax.tick_params(axis="x", labelrotation=30)
    for t in ax.get_xticklabels():
        t.set_ha("right")
