"""Error bars for modelled figures: ±`band_pct` % of each modelled value, the band its row carries
(its regime's, else the pooled one: perfmodel/error_bands.py, docs/perfmodel.md "Error bands"). A
value with no band (not modelled) gets no bar."""

from __future__ import annotations

import math

LABEL = "error band (its regime's, else pooled)"
STYLE = dict(fmt="none", ecolor="black", elinewidth=0.8, capsize=2, zorder=5)


def _pct(band) -> float | None:
    try:
        pct = float(band)
    except (TypeError, ValueError):  # None
        return None
    return None if math.isnan(pct) else pct


def errorbar(ax, x: float, y: float, band, horizontal: bool = False) -> bool:
    """±band % around the value `y` at position `x` (a horizontal bar chart's value is on x);
    nothing where the band is not a number. Labels the first bar of an axes. True if drawn."""
    pct = _pct(band)
    if pct is None or y is None or (isinstance(y, float) and math.isnan(y)):
        return False
    err = abs(y) * pct / 100.0
    label = None if getattr(ax, "_band_labelled", False) else LABEL
    ax._band_labelled = True
    if horizontal:
        ax.errorbar(y, x, xerr=err, label=label, **STYLE)
    else:
        ax.errorbar(x, y, yerr=err, label=label, **STYLE)
    return True
