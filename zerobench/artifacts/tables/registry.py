"""Every artifact, one entry each, keyed by its sheet's name (workflows/config/sheets/<name>.yaml):
its table builder, its plot, its figure size, and whether its table predicts from this machine's
calibrated profile, which it is then handed (`zerobench table --profile`, a declared input of the
workflow's table rule), never found by a path. A sheet of your own names the entry it borrows in
`table:` (`sweep`). Builders and plots are named `module:function` and imported when used, so
the workflow reads the registry at parse time without pandas or matplotlib. The table of an
entry is made by artifacts/tables.py `build`, its figure by artifacts/plots/draw.py `plot`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Artifact:
    """`table` builds the artifact's table from its records, or from (trial, record) pairs where
    `joins_trials`; then, where `needs_profile`, with the calibrated profile as its second argument.
    `plot` draws the table into a figure of `size` inches (None: ours beside the paper's per row,
    its height by the rows). `emulated`: its judged rows are emulated ranks (artifacts/emulated_tables.py),
    so the model's in-process artifacts (artifacts/in_process.py) leave it out."""

    table: str
    plot: str | None
    size: tuple[float, float] | None = (13, 5)
    joins_trials: bool = False
    needs_profile: bool = False
    emulated: bool = False  # its judged rows are emulated ranks, not the performance model's


_T, _PT = "zerobench.artifacts.tables.tables:", "zerobench.artifacts.tables.paper_tables:"
_E = "zerobench.artifacts.tables.emulated_tables:"
_D, _P, _S = "zerobench.artifacts.plots.draw:", "zerobench.artifacts.plots.paper:", "zerobench.artifacts.plots.scaling:"
REGISTRY: dict[str, Artifact] = {
    "table1": Artifact(_T + "table1", _P + "table1", (13, 8)),
    "fig1": Artifact(_T + "memory", _D + "memory"),
    "comm_volume": Artifact(_T + "comm", _D + "comm", (8, 5)),
    "fig9_loss": Artifact(_T + "loss", _D + "loss"),
    "capacity": Artifact("zerobench.artifacts.tables.capacity:capacity", _D + "capacity", needs_profile=True),
    "model_vs_measured": Artifact(
        "zerobench.artifacts.tables.vs_measured:model_vs_measured", None, None, needs_profile=True
    ),
    "table2": Artifact(_PT + "table2", _P + "table2", joins_trials=True),
    "fig2": Artifact(_PT + "fig2", _P + "fig2", joins_trials=True),
    "fig3": Artifact(_PT + "fig3", _S + "fig3", joins_trials=True),
    "superlinear": Artifact("zerobench.artifacts.tables.superlinear:table", _S + "superlinear", joins_trials=True),
    "superlinear_emulated": Artifact(
        "zerobench.artifacts.tables.superlinear_emulated:table",
        _S + "superlinear_emulated",
        joins_trials=True,
        needs_profile=True,
    ),
    "fig3_emulated": Artifact(_E + "fig3", _S + "fig3_emulated", joins_trials=True, emulated=True),
    "fig6_emulated": Artifact(_E + "fig6", _P + "fig6", (8, 5), joins_trials=True, emulated=True),
    "fig7_emulated": Artifact(_E + "fig7", _P + "fig7", (8, 5), joins_trials=True, emulated=True),
    "fig8_emulated": Artifact(_E + "fig8", _P + "fig8", joins_trials=True, emulated=True),
    "fig5": Artifact(_PT + "fig5", _P + "fig5", (8, 5), joins_trials=True),
    "fig6": Artifact(_PT + "fig6", _P + "fig6", (8, 5), joins_trials=True),
    "fig7": Artifact(_PT + "fig7", _P + "fig7", (8, 5), joins_trials=True),
    "fig8": Artifact(_PT + "fig8", _P + "fig8", joins_trials=True),
    "today": Artifact(_PT + "today", _P + "today", (13, 6.5), joins_trials=True),
    "sweep": Artifact(_T + "sweep", None, None),
}


def resolve(name: str) -> Callable:
    """The function `module:function` names."""
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


def entry(name: str) -> Artifact:
    if name not in REGISTRY:
        raise ValueError(f"artifact {name!r}: choose one of {sorted(REGISTRY)}")
    return REGISTRY[name]
