"""Judged check of the memory model against the paper's own batch sizes (AE Tables 1–6).

The paper ran every listed configuration, so each listed micro-batch must fit; and it chose
batches at or near the largest that fit, so the largest batch the model allows should not be
far above the listed one where memory was the limit. Neither is fitted: this table is judged.
The runs are the sheets' trials (workflows/config/sheets/): a ZeRO-100B size listed as C4 and
C5 counts the larger of their limits (P_a+cpu where it helps, paper §10.4).
"""

from __future__ import annotations

import pandas as pd

from zerobench.artifacts.judging.common import paper
from zerobench.artifacts.tables.paper_tables import _size
from zerobench.perfmodel.constants import DEFAULT, Calibration
from zerobench.sweeps.groups import model_trial
from zerobench.sweeps.sheets import load_sheet, sheet_trials


def _label(artifact: str, trial: dict, record: dict) -> str | None:
    """The run's name, or None for trials that are not a listed run (depth searches; Fig 7's
    170B, which probes what fits at batch 12)."""
    if trial.get("layers_policy") == "largest_fits" or (artifact == "fig7" and record["world_size"] != 128):
        return None
    kind = {"fig2": ("baseline", "ZeRO"), "fig8": ("DDP", "ZeRO")}.get(artifact)
    if artifact == "fig3":
        return f"fig3 {record['world_size']} GPUs"
    if kind:
        return f"{artifact} {kind[record['stage'] > 0]} {_size(record):g}B"
    return f"{artifact} {_size(record):g}B {trial['zero_config']}"


def batch_check(cal: Calibration = DEFAULT) -> pd.DataFrame:
    """Per listed run: the listed batch (Fig 3: the paper's pick among its sweep), the largest the
    model allows, and whether it fits."""
    runs: dict[str, list] = {}
    for artifact in ("fig2", "fig3", "fig7", "fig8", "fig6"):
        for group in sheet_trials(load_sheet(artifact)):
            for trial in group:
                record = model_trial(trial, cal)
                label = _label(artifact, trial, record)
                if label is None:
                    continue
                batch = trial["micro_batch"]
                if artifact == "fig3":
                    batch = int(paper("fig3", "throughput_per_gpu", column="batch", gpus=record["world_size"]))
                entry = runs.setdefault(label, [batch, 0])
                entry[1] = max(entry[1], record["max_micro_batch"])
    return pd.DataFrame(
        [
            dict(run=label, paper_batch=batch, max_micro_batch=b_max, fits=b_max >= batch, ratio=b_max / batch)
            for label, (batch, b_max) in runs.items()
        ]
    )
