"""A trial's vocabulary, the tooling's terms apart from the engine: its fields, the flags and sheet
keys every command and sheet shares (`fields`), its spec and the translation of field values into
the engine's validated configs (`spec`), the one record every source writes (`record`), and the
paper's "largest that fits" micro-batch/depth policy (`policy`). No torch import. The names below
are the package's public face: `from zerobench.trial import TrialSpec`."""

from zerobench.trial.record import (
    COLUMNS,
    TrialRecord,
    git_revision,
    global_batch,
    model_columns,
    new_record,
    short_error,
    trial_columns,
    versions,
)
from zerobench.trial.spec import TrialSpec, configs, mib

__all__ = [
    "COLUMNS",
    "TrialRecord",
    "TrialSpec",
    "configs",
    "git_revision",
    "global_batch",
    "mib",
    "model_columns",
    "new_record",
    "short_error",
    "trial_columns",
    "versions",
]
