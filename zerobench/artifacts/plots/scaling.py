"""Scaling figures on log-2 axes with the perfect-linear line from the first point, so that
superlinear means above the line: Fig 3 (60B, 64-400 GPUs, paper §10.3), modelled and emulated
(`fig3_emulated`, one rank on one GPU, the modelled line beside), and its CPU analogs: measured
(`superlinear`: a fixed model under a fixed per-rank budget, dp 1 -> 2, stage 0 beside 3) and
emulated (`superlinear_emulated`: one rank of N_d 1-8, per-rank throughput over the one-rank point)."""

from __future__ import annotations

import pandas as pd
from matplotlib.ticker import FuncFormatter

from zerobench.artifacts.plots.style import COLORS, MARKERS, PAPER
from zerobench.stages import STAGE_LABELS


def _log2_axis(ax, ticks) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ticks), [str(int(t)) for t in ticks])
    ax.minorticks_off()


def _linear(ax, x, y, color, label) -> None:
    """Perfect scaling from the first point: y0 * x / x0."""
    x = sorted(x)
    ax.plot(x, [y[0] * v / x[0] for v in x], ":", color=color, lw=1.2, label=label)


def fig3(df: pd.DataFrame, fig) -> None:
    ax, ax2 = fig.subplots(1, 2)
    total = df[df.series == "total TFLOPS"].sort_values("gpus")
    per = df[df.series == "TFLOPS/GPU"].sort_values("gpus")
    src = per.source.iloc[0]
    for a, sub, unit in ((ax, total, "aggregate TFLOPS"), (ax2, per, "TFLOPS per GPU")):
        a.plot(sub.gpus, sub.ours, "-", marker=MARKERS.get(src, "o"), color="tab:blue", label=f"ours ({src})")
        a.scatter(sub.gpus, sub.paper, label="paper", **PAPER)
        a.set(xlabel="GPUs (60B, MP 16)", ylabel=unit)
        _log2_axis(a, sub.gpus)
    _linear(ax, total.gpus.tolist(), total.ours.tolist(), "tab:blue", "perfect linear from ours' first point")
    _linear(ax, total.gpus.tolist(), total.paper.tolist(), "black", "perfect linear from the paper's first point")
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax2.axhline(per.ours.iloc[0], ls=":", color="tab:blue", lw=1.2, label="linear scaling (flat per GPU)")
    ax2.axhline(per.paper.iloc[0], ls=":", color="black", lw=1.2)
    for _, r in per.iterrows():  # the batch per GPU that the freed memory holds: the why of the rise
        ax2.text(r.gpus, 1, f"batch {r.micro_batch:g}/GPU", ha="center", fontsize=7)
    ax2.set_ylim(0, None)
    for a in (ax, ax2):
        a.legend(fontsize=7)
    ax.set_title("above the dotted line = superlinear", fontsize=8, loc="left")


def superlinear(df: pd.DataFrame, fig) -> None:
    """Left: aggregate tokens/s against ranks per stage, the largest micro-batch that fits at each
    point (whiskers: its range over the interleaved rounds), linear lines from each stage's one-rank
    point. Right: that micro-batch."""
    ax, ax2 = fig.subplots(1, 2)
    best = df[df.kind == "best"].sort_values("dp")
    for stage, sub in best.groupby("stage"):
        c = COLORS[stage]
        ax.plot(sub.dp, sub.ours, "-", marker=MARKERS["measured"], color=c, label=f"{STAGE_LABELS[stage]} measured")
        spread = [sub.ours - sub.tokens_per_s_low, sub.tokens_per_s_high - sub.ours]  # over the rounds
        ax.errorbar(sub.dp, sub.ours, yerr=spread, fmt="none", ecolor=c, capsize=3)
        _linear(ax, sub.dp.tolist(), sub.ours.tolist(), c, f"{STAGE_LABELS[stage]} perfect linear")
        for _, r in sub.iterrows():
            ax.annotate(
                f"b={r.micro_batch:g}", (r.dp, r.ours), textcoords="offset points", xytext=(6, -10), fontsize=7, color=c
            )
        ax2.plot(sub.dp, sub.micro_batch, "-", marker="o", color=c, label=STAGE_LABELS[stage])
    cap = df.mem_cap_bytes.dropna()
    ax.set(xlabel="ranks (DP degree N_d)", ylabel="aggregate tokens/s (measured, CPU, gloo)")
    ax.set_title(f"budget {cap.iloc[0] / 2**20:.0f} MiB per rank" if len(cap) else "", fontsize=8, loc="left")
    ax2.set(xlabel="ranks (DP degree N_d)", ylabel="largest micro-batch that fits the budget", yscale="log")
    ax2.set_yscale("log", base=2)
    batches = sorted(df.micro_batch.unique())
    ax2.set_yticks(batches, [str(int(b)) for b in batches])
    for a in (ax, ax2):
        _log2_axis(a, sorted(best.dp.unique()))
        a.margins(x=0.12)
        a.legend(fontsize=7)


def superlinear_emulated(df: pd.DataFrame, fig) -> None:
    """Left: per-rank throughput over the one-rank point against ranks (1 = linear), emulated,
    modelled at the same micro-batches, the paper's Fig 3 per GPU (64 GPUs = 1), and a real
    two-rank run on this host (its ranks share it). Right: each emulated step, measured compute
    and modelled exposed collectives, with the micro-batch that fitted."""
    ax, ax2 = fig.subplots(1, 2)
    emu = df[(df.kind == "emulated") & (df.status == "ok")].sort_values("dp")
    for kind, style, label in (
        ("emulated", dict(color="tab:green", marker="D"), "emulated (one rank, this CPU)"),
        ("modelled", dict(color="tab:blue", marker="s", ls="--"), "modelled (calibrated CPU)"),
        ("paper", dict(color="black", marker="o", mfc="none"), "paper Fig 3 (64 GPUs = 1)"),
    ):
        sub = df[df.kind == kind].sort_values("dp")
        if len(sub):
            ax.plot(sub.dp, sub.per_rank_ratio, label=label, **style)
    host = df[df.kind == "host"].set_index("dp")
    if 1 in host.index and 2 in host.index:  # the same micro-batch: per-rank speed is the steps' ratio
        ratio = host.step_time_s[1] / host.step_time_s[2]
        ax.scatter(
            [2],
            [ratio],
            marker="x",
            color="tab:red",
            s=60,
            zorder=5,
            label=f"measured, 2 ranks sharing this host (b={host.micro_batch[2]:g})",
        )
    ax.axhline(1.0, ls=":", color="grey", lw=1.2, label="linear (flat per rank)")
    for r in emu.itertuples():
        ax.annotate(
            f"b={r.micro_batch:g}",
            (r.dp, r.per_rank_ratio),
            textcoords="offset points",
            xytext=(5, 6),
            fontsize=7,
            color="tab:green",
        )
    ax.set(xlabel="ranks (N_d; paper: GPUs / 64)", ylabel="per-rank throughput / one-rank point")
    cap = emu.mem_cap_bytes.dropna()
    ax.set_title(
        f"budget {cap.iloc[0] / 2**20:.0f} MiB of tensors per rank" if len(cap) else "", fontsize=8, loc="left"
    )
    ticks = sorted(set(emu.dp) | {1, 2, 4, 8})
    _log2_axis(ax, ticks)
    ax.legend(fontsize=7)
    x = range(len(emu))
    ax2.bar(x, emu.compute_s, color="tab:green", label="compute (measured)")
    ax2.bar(x, emu.collective_stall_s, bottom=emu.compute_s, color="tab:orange", label="collectives exposed (modelled)")
    ax2.set_xticks(list(x), [f"N_d={d:g}\nb={b:g}" for d, b in zip(emu.dp, emu.micro_batch, strict=True)])
    ax2.set(ylabel="seconds per step (one rank)")
    ax2.legend(fontsize=7)


def fig3_emulated(df: pd.DataFrame, fig) -> None:
    """Fig 3's form (`fig3`) for the emulated ranks, with the modelled line of the same trials."""
    fig3(df[df.kind == "emulated"], fig)
    ax, ax2 = fig.axes
    modelled = df[df.kind == "modelled"]
    for a, series in ((ax, "total TFLOPS"), (ax2, "TFLOPS/GPU")):
        sub = modelled[modelled.series == series].sort_values("gpus")
        if len(sub):
            a.plot(sub.gpus, sub.ours, "--", marker=MARKERS["modelled"], color="tab:gray", label="modelled")
            a.legend(fontsize=7)
