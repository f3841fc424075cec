"""The frozen holdout of the external validation (fitting/external.py, docs/perfmodel.md
"Frozen holdout"): its rows, that no fit reads them, and the recorded score."""

from __future__ import annotations

import pandas as pd
import pytest

from zerobench.engine.config import ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.fitting import external, fit
from zerobench.fitting.external import DATA, HOLDOUT_OUT, expressible, load, validate
from zerobench.perfmodel.constants import DEFAULT
from zerobench.perfmodel.predict import predict


def test_holdout_covers_the_missing_regimes_with_cited_rows():
    hold = load(("holdout",))
    assert hold.source.nunique() >= 2 and (hold.split == "holdout").all()
    assert hold.citation.str.len().min() > 60  # paper title and table or section in every row
    assert not set(hold.source) & set(load().source)  # sources the model never saw
    can = hold[expressible(hold)]
    v100 = can[can.hardware == "v100-32gb-dgx2"]
    assert len(v100) >= 5 and v100.gpus.max() >= 512  # the paper's own hardware generation
    sharded = can[(can.stage == 3) & (can.gpus > 1000)]
    assert len(sharded) >= 2 and sharded.micro_batch.max() <= 2  # fully sharded past 1000 GPUs, micro-batch 1-2
    cannot = hold[~expressible(hold)]
    assert len(cannot) and cannot.expressible.str.startswith("no: ").all()  # kept, with the reason


def test_loading_hands_out_the_holdout_only_by_name():
    seen = load()
    assert set(seen.split) == {"fit", "validation"}
    assert len(seen) + len(load(("holdout",))) == len(pd.read_csv(DATA))
    with pytest.raises(ValueError, match="splits"):
        load(("test",))
    assert set(validate().split) == {"fit", "validation"}


def test_no_fit_reads_a_holdout_row(monkeypatch):
    """Every row the fits score goes through `validate`: spy on it while fitting a GPU's constants
    and running leave-one-source-out (with the fit itself stubbed, which needs no rows)."""
    seen = []

    def spy(cal, path=DATA, rows=None):
        out = validate(cal, path, rows)
        seen.append(out)
        return out

    monkeypatch.setattr(fit, "validate", spy)
    fit.fit_hardware("a100-80gb", iters=1)
    fit.hardware_objective(DEFAULT, "h100-80gb")
    monkeypatch.setattr(fit, "fit_hardware", lambda hw, cal, sources=(): DEFAULT.per_hardware[hw])
    loso = fit.loso_rows("a100-80gb")
    rows = pd.concat(seen)
    assert len(rows) > 50 and set(rows.split) <= {"fit", "validation"}
    assert set(loso.held_out) == {"llm-foundry", "nemo-megatron", "vtrain"}  # no holdout source held out


def test_tflops_metric_is_the_flops_convention_over_the_predicted_step():
    row = load(("holdout",)).query("source == 'megatron-lm-2021' and gpus == 384 and stage == 3")
    got = validate(rows=row).iloc[0]
    pred = predict(ModelConfig(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200),
                   ParallelConfig(dp=384, mp=1, stage=3, checkpoint_activations=True),
                   PrecisionConfig("fp16", "cuda"), TrainConfig(micro_batch=4, grad_accum=1), "a100-80gb",
                   attention="materialized", implementation=external.IMPLEMENTATION["megatron-lm-2021"])  # fmt: skip
    s, h, L, V, B = 2048, 12288, 96, 51200, 4  # Narayanan et al. Eq. 3, per GPU, by hand
    flops = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    assert got.predicted == pytest.approx(flops / pred.step_time_s / 1e12, rel=1e-9)
    assert got.error_pct == pytest.approx(100 * (got.predicted - 144) / 144)


def test_a_run_the_model_cannot_express_gets_no_prediction_and_a_bad_metric_is_refused():
    opt = validate(rows=load(("holdout",)).query("source == 'opt-175b'"))
    assert opt.predicted.isna().all() and opt.error_pct.isna().all()
    bad = load().head(1).assign(metric="samples_per_day")
    with pytest.raises(ValueError, match="metric"):
        validate(rows=bad)


def test_recorded_score_is_of_the_frozen_rows_and_of_this_model():
    """results/external_holdout.csv (written by `--holdout`) holds exactly the holdout rows, and its
    predictions are the current model's: the coverage counted on them (fitting/write_bands.py) is of the
    model as shipped. A model change that moves them fails here until the holdout is scored again, a
    scoring of its own (external.SCORINGS)."""
    recorded = pd.read_csv(HOLDOUT_OUT)
    frozen = load(("holdout",))
    assert recorded[["source", "model", "gpus", "value"]].equals(frozen[["source", "model", "gpus", "value"]])
    now = validate(rows=frozen)
    shown = expressible(recorded)
    assert now.predicted[shown].to_numpy() == pytest.approx(recorded.predicted[shown].to_numpy(), rel=1e-9)
    assert set(recorded.git_rev) == {external.SCORINGS[-1][0]}
    assert recorded[expressible(recorded)].error_pct.notna().all()
    assert external.holdout_summary(recorded).expressed.iloc[-1] == expressible(frozen).sum()
