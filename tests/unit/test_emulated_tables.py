"""The paper-scale emulated sheets' tables (artifacts/tables/emulated_tables.py), from records made here
(no GPU): each row says it is emulated and is judged against the paper, whatever the ledger of model
choices says of the modelled row of the same key; Fig 3 keeps the modelled line beside it."""

from zerobench.artifacts.tables import emulated_tables
from zerobench.perfmodel.choices import fitted_rows
from zerobench.sweeps import sheets
from zerobench.sweeps.groups import model_trial
from zerobench.trial import TrialSpec, configs


def _pairs(name: str) -> list[tuple[dict, dict]]:
    """The sheet's trials, each emulated one with a record of its own (60 TFLOPS, fitting at the
    listed batch), each modelled one through the model."""
    out = []
    for trial in (t for group in sheets.sheet_trials(sheets.load_sheet(name)) for t in group):
        if trial["source"] == "modelled":
            out.append((trial, model_trial(trial)))
            continue
        spec = TrialSpec(*configs({**{k: v for k, v in trial.items() if k != "source"}, "command": "emulate"}))
        record = spec.record("emulated", tflops_per_gpu=60.0, step_time_s=1.0, param_bytes=1, grad_bytes=1,
                             optimizer_bytes=1, activation_bytes=1, peak_allocated_bytes=2**34,
                             peak_reserved_bytes=2**35)  # fmt: skip
        out.append((trial, record))
    return out


def test_fig3_emulated_is_judged_with_the_modelled_line_beside():
    df = emulated_tables.fig3(_pairs("fig3_emulated"))
    emulated, modelled = df[df.kind == "emulated"], df[df.kind == "modelled"]
    assert set(emulated.source) == {"emulated"} and set(modelled.source) == {"modelled"}
    per_gpu = emulated[emulated.series == "TFLOPS/GPU"].set_index("key")
    assert per_gpu.loc["128 GPUs", "paper"] == 37.5
    assert ("fig3", "64 GPUs") in fitted_rows() and per_gpu.loc["64 GPUs", "role"] == "judged"
    assert set(modelled.role) == {"reference"} and len(modelled) == 8


def test_fig6_fig7_fig8_emulated_rows_are_emulated_and_never_fitted():
    for name in ("fig6", "fig7", "fig8"):
        df = getattr(emulated_tables, name)(_pairs(f"{name}_emulated"))
        assert set(df.source) == {"emulated"} and "fitted" not in set(df.role), name
        assert not df.fitted_by.astype(bool).any(), name
