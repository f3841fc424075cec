"""The paper-scale emulated sheets' tables (`<artifact>_emulated`: one rank of the paper's world on
one GPU, `source: emulated`, runtime/emulate.py): each built by its paper artifact's builder
(artifacts/tables/paper_tables.py) from the emulated records, each row then marked as what it is — its
memory and compute measured on this GPU, its collectives priced by the model — and judged against
the paper, whatever the ledger of model choices says of the modelled row of the same key: no model
choice produced an emulated number. Fig 3 keeps the modelled line of the same trials beside it
(`kind` modelled, role `reference`: shown, not judged). No torch import."""

from __future__ import annotations

import pandas as pd

from zerobench.artifacts.judging.common import JUDGED
from zerobench.artifacts.tables import paper_tables

Pairs = list[tuple[dict, dict]]


def _of(pairs: Pairs, source: str) -> Pairs:
    return [(t, r) for t, r in pairs if r["source"] == source]


def _emulated(build, pairs: Pairs) -> pd.DataFrame:
    df = build(_of(pairs, "emulated"))
    df["source"], df["kind"] = "emulated", "emulated"
    df["role"] = df.role.replace("fitted", JUDGED)
    df["fitted_by"] = ""
    return df


def fig3(pairs: Pairs) -> pd.DataFrame:
    """Fig 3 emulated, and the modelled Fig 3 of the sheet's modelled trials beside it."""
    modelled = paper_tables.fig3(_of(pairs, "modelled")) if _of(pairs, "modelled") else pd.DataFrame()
    if len(modelled):
        modelled = modelled.assign(kind="modelled", role="reference", fitted_by="", key="modelled " + modelled.key)
    return pd.concat([_emulated(paper_tables.fig3, pairs), modelled], ignore_index=True)


def fig6(pairs: Pairs) -> pd.DataFrame:
    return _emulated(paper_tables.fig6, pairs)


def fig7(pairs: Pairs) -> pd.DataFrame:
    return _emulated(paper_tables.fig7, pairs)


def fig8(pairs: Pairs) -> pd.DataFrame:
    return _emulated(paper_tables.fig8, pairs)
