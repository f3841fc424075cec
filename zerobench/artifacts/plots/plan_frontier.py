"""A plan's figure (`zerobench plan --figure`): every layout that fits, tokens per second against its
memory per GPU, coloured by ZeRO-DP stage; the frontier (no layout faster with no more memory) as a
line, the usable bytes of the card as a vertical line, the checked top layouts ringed, the tied
group (the offered layouts inside the fastest offered one's band) crossed with that band shaded,
and the top pick (the tied group's most headroom) named. Reads the plan's rows
(zerobench/plan/answer.py COLUMNS); matplotlib's Agg backend; no torch import."""

from __future__ import annotations

import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from zerobench.artifacts.plots.bands import errorbar  # noqa: E402
from zerobench.artifacts.plots.style import COLORS  # noqa: E402
from zerobench.stages import STAGE_LABELS  # noqa: E402


def plot_plan(rows: list[dict] | pd.DataFrame, out, title: str = "") -> None:
    df = pd.DataFrame(rows)
    df = df[df["rank"].notna()]  # a layout a verify dropped has no rank
    fig, ax = plt.subplots(figsize=(9, 5.5))
    gb = df.memory_bytes / 1e9
    for stage, sub in df.groupby("stage"):
        ax.scatter(
            sub.memory_bytes / 1e9,
            sub.tokens_per_s,
            s=14,
            alpha=0.6,
            color=COLORS[int(stage)],
            label=f"stage {int(stage)}: {STAGE_LABELS[int(stage)]}",
        )
    front = df[df.frontier.astype(bool)].sort_values("memory_bytes")
    ax.step(front.memory_bytes / 1e9, front.tokens_per_s, where="post", color="black", lw=1, label="frontier")
    checked = df[df.checked != "modelled"]
    if len(checked):
        ax.scatter(
            checked.memory_bytes / 1e9,
            checked.tokens_per_s,
            s=90,
            facecolors="none",
            edgecolors="red",
            label=f"top, {checked.checked.iloc[0]}",
        )
    tied = df[df.tied.astype(str).str.lower() == "true"]
    if len(tied):
        fastest = tied.loc[tied.tokens_per_s.idxmax()]
        low = fastest.tokens_per_s * (1 - fastest.band_pct / 100)
        ax.axhspan(low, fastest.tokens_per_s, color="gold", alpha=0.15, lw=0)
        label = f"tied with the top: {len(tied)} inside ±{fastest.band_pct:g}% (the model's band)"
        ax.scatter(tied.memory_bytes / 1e9, tied.tokens_per_s, s=22, marker="x", color="black", lw=0.8, label=label)
        errorbar(ax, fastest.memory_bytes / 1e9, fastest.tokens_per_s, fastest.band_pct)
    best = df.iloc[0]
    ax.annotate(
        f"pick: {best.layout}",
        (best.memory_bytes / 1e9, best.tokens_per_s),
        fontsize=7,
        xytext=(4, 6),
        textcoords="offset points",
    )
    ax.axvline(df.usable_bytes.max() / 1e9, color="gray", ls="--", lw=0.8, label="usable per GPU")
    ax.set_xlim(left=min(0.0, gb.min()))
    ax.set_xlabel("memory per GPU (GB; training or construction peak, the higher)")
    ax.set_ylabel("tokens / s (modelled unless ringed)")
    ax.set_title("\n".join(textwrap.wrap(title, 125)), fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
