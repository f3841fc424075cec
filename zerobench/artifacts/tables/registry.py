"""Every artifact's table, one entry each, keyed by its sheet's name (workflows/config/sheets/<name>.yaml):
its builder, whether it joins the records to their trials, and whether it predicts from this
machine's calibrated profile, which it is then handed (`zerobench table --profile`, a declared
input of the workflow's table rule), never found by a path. A sheet of your own names the entry it
borrows in `table:` (`sweep`). The table of an entry is made by tables/build.py `build`; its figure
is plots/draw.py's entry of the same name. The workflow reads the registry at parse time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from zerobench.artifacts.tables import (
    capacity,
    emulated_tables,
    engine_tables,
    paper_tables,
    superlinear,
    superlinear_emulated,
    vs_measured,
)


@dataclass(frozen=True)
class Artifact:
    """`table` builds the artifact's table from its records, or from (trial, record) pairs where
    `joins_trials`; then, where `needs_profile`, with the calibrated profile as its second argument.
    `emulated`: its judged rows are emulated ranks (tables/emulated_tables.py), so the model's
    in-process artifacts (tables/in_process.py) leave it out."""

    table: Callable
    joins_trials: bool = False
    needs_profile: bool = False
    emulated: bool = False  # its judged rows are emulated ranks, not the performance model's


REGISTRY: dict[str, Artifact] = {
    "table1": Artifact(engine_tables.table1),
    "fig1": Artifact(engine_tables.memory),
    "comm_volume": Artifact(engine_tables.comm),
    "fig9_loss": Artifact(engine_tables.loss),
    "capacity": Artifact(capacity.capacity, needs_profile=True),
    "model_vs_measured": Artifact(vs_measured.model_vs_measured, needs_profile=True),
    "table2": Artifact(paper_tables.table2, joins_trials=True),
    "fig2": Artifact(paper_tables.fig2, joins_trials=True),
    "fig3": Artifact(paper_tables.fig3, joins_trials=True),
    "superlinear": Artifact(superlinear.table, joins_trials=True),
    "superlinear_emulated": Artifact(superlinear_emulated.table, joins_trials=True, needs_profile=True),
    "fig3_emulated": Artifact(emulated_tables.fig3, joins_trials=True, emulated=True),
    "fig6_emulated": Artifact(emulated_tables.fig6, joins_trials=True, emulated=True),
    "fig7_emulated": Artifact(emulated_tables.fig7, joins_trials=True, emulated=True),
    "fig8_emulated": Artifact(emulated_tables.fig8, joins_trials=True, emulated=True),
    "fig5": Artifact(paper_tables.fig5, joins_trials=True),
    "fig6": Artifact(paper_tables.fig6, joins_trials=True),
    "fig7": Artifact(paper_tables.fig7, joins_trials=True),
    "fig8": Artifact(paper_tables.fig8, joins_trials=True),
    "today": Artifact(paper_tables.today, joins_trials=True),
    "sweep": Artifact(engine_tables.sweep),
}


def entry(name: str) -> Artifact:
    if name not in REGISTRY:
        raise ValueError(f"artifact {name!r}: choose one of {sorted(REGISTRY)}")
    return REGISTRY[name]
