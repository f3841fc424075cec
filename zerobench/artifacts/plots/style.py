"""The style every figure shares: a colour per ZeRO-DP stage, a marker per source of numbers, and
the paper's points as hollow black circles."""

COLORS = {0: "tab:gray", 1: "tab:blue", 2: "tab:orange", 3: "tab:green"}  # by ZeRO-DP stage
MARKERS = {"measured": "o", "traced": "s", "modelled": "D", "emulated": "P", "formula": "^"}  # by source
PAPER = dict(marker="o", facecolors="none", edgecolors="black", s=90, linewidths=1.3, zorder=5)
