"""External validation: the model against published training runs on hardware other than the
paper's cluster (zerobench/data/external_runs.csv, each row with its citation and a split
committed before any fitting; docs/perfmodel.md).

Splits: `fit` rows give the per-GPU constants, `validation` rows were looked at while the model was
built, and `holdout` rows were entered in a commit of their own before any model change (`load`
hands them out only when asked by name, so no fit reads them). They were scored three times
(SCORINGS): before any model change, after the collective schedule and the implementation profiles,
and after the model's memory became the engine's (each earlier record kept, `kept_scoring`). A
holdout row some choice of the model was made on (perfmodel/choices.py: `deepspeed-0.3` for
megatron-lm-2021, designed after its first score) is validation since (`role`, `history`).
A published run the model cannot express (pipeline stages, an unstated layout) keeps its row, with
the reason in its `expressible` column, and gets no prediction.

Each row is predicted from its own layout (GPUs, MP, ZeRO stage, micro-batch, accumulation,
checkpointing, attention kernel) on the datasheet profile of its GPU, and compared in the
metric the source printed (tokens/s per GPU, step time, or TFLOPS per GPU by zerobench.flops'
convention). `python -m zerobench.fitting.external` prints MAPE per source and hardware, per split,
and the worst rows; `--holdout` scores the holdout rows and writes results/external_holdout.csv;
`--label` labels that record (role, history) and the first scoring's (role) without predicting
again; `--sensitivity` writes results/external_sensitivity.csv: each recorded row of a profile with a
SENSITIVITY range at it, role `sensitivity` (a variant's prediction, read by no band or verdict) beside
the recorded run's own role (`run_role`).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pandas as pd

from zerobench.engine.config import ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.perfmodel.choices import fitted_rows
from zerobench.perfmodel.constants import DEFAULT, Calibration
from zerobench.perfmodel.implementation import DEFAULT_IMPLEMENTATION, variants
from zerobench.perfmodel.predict import predict
from zerobench.trial import git_revision

DATA = Path(__file__).resolve().parents[1] / "data" / "external_runs.csv"
HOLDOUT_OUT = Path(__file__).resolve().parents[2] / "results" / "external_holdout.csv"
SPLITS = ("fit", "validation", "holdout")
SEEN = ("fit", "validation")  # what model building may read
SENSITIVITY_OUT = HOLDOUT_OUT.with_name("external_sensitivity.csv")

# Memory behaviour of each source's training code (constants.py; read from the code, docs/perfmodel.md
# "External validation"). llm-foundry 061f2c7: PyTorch FSDP FULL_SHARD, mixed_precision PURE (fp32 flat
# parameters, bf16 compute and reduction, gradients cast back to fp32 shards: torch 2.1
# `_runtime_utils._cast_grad_to_param_dtype`), loss `fused_crossentropy` (flash-attn's xentropy).
# NeMo 22.05 (launcher b20f85d `conf/training/gpt3/5b.yaml`: bf16, megatron_amp_O2): NeMo's
# `MainParamsOptimizerWrapper` with fp32_grad_accum and contiguous_grad_bucket, whose hook adds each
# bf16 gradient into the fp32 buffer and frees it (`param.grad = None`) and all-reduces the buffer in
# place. vTrain states no code settings: the paper's defaults.
CODE = {
    "llm-foundry": dict(fsdp=True, fp32_grad_shard=0.0, fused_cross_entropy=True),
    "nemo-megatron": dict(fp32_main_grads=True),
}
# How each source's code issues its stage-3 collectives (perfmodel/implementation.py): Megatron-LM
# 2021's ZeRO-3 baseline is DeepSpeed's stage 3 of that year. The source names that code, but the
# profile's mechanism (list-form host ops, a wait per gather) was designed after these six runs were
# first scored, with their error growing with GPU count in view: a choice in the ledger, so the rows
# are validation (perfmodel/choices.py). Every other source runs the default (`efficient`;
# llm-foundry's FSDP gathers each unit with one flat all-gather).
IMPLEMENTATION = {"megatron-lm-2021": "deepspeed-0.3"}
# Each scoring of the holdout rows: (revision that scored, what the model was then). The first's
# predictions are kept beside the current ones (results/external_holdout_at_6a41b00.csv).
SCORINGS = (("6a41b00", "before any model change"),
            ("b2c03e2", "after the collective schedule, the NCCL table and the implementation profiles"),
            ("526d111", "after the model's memory became this engine's (engine_memory.py): the memory verdicts "
                        "move, no throughput term"))  # fmt: skip
FIRST_SCORE = HOLDOUT_OUT.with_name(f"external_holdout_at_{SCORINGS[0][0]}.csv")


def kept_scoring(rev: str) -> Path:
    """Where an earlier scoring's record is kept (every scoring but the current)."""
    return HOLDOUT_OUT.with_name(f"external_holdout_at_{rev}.csv")


def load(splits: tuple[str, ...] = SEEN, path: Path = DATA) -> pd.DataFrame:
    """The rows of `splits` (fit and validation unless the holdout is asked for by name)."""
    unknown = set(splits) - set(SPLITS)
    if unknown:
        raise ValueError(f"splits={sorted(unknown)!r}: must be among {SPLITS}")
    df = pd.read_csv(path)
    bad = set(df.split) - set(SPLITS)
    if bad:
        raise ValueError(f"{path.name}: split {sorted(bad)!r}: must be one of {SPLITS}")
    return df[df.split.isin(splits)].reset_index(drop=True)


def expressible(df: pd.DataFrame) -> pd.Series:
    """Rows the model can predict: `expressible` is `yes` (the rest say why not)."""
    return df.expressible.astype(str).str.strip() == "yes"


def _predicted(
    r, cal: Calibration, implementation=None, without: tuple[str, ...] = ()
) -> tuple[float | None, bool, int, str]:
    """(the row's metric as the model predicts it, fits, largest micro-batch, the memory it needs by
    term against what is usable, GB), under the row's `implementation` profile unless another is
    given (a sensitivity variant); `without`: terms of the step time (Prediction fields, e.g.
    `dp_comm_s`) left out, a model with a term removed (fitting/coverage_power.py)."""
    model = ModelConfig(layers=int(r.layers), hidden=int(r.hidden), heads=int(r.heads), seq=int(r.seq),
                        vocab=int(r.vocab), name=r.model)  # fmt: skip
    parallel = ParallelConfig(dp=int(r.gpus) // int(r.mp), mp=int(r.mp), stage=int(r.stage),
                              checkpoint_activations=bool(r.checkpoint_activations))  # fmt: skip
    train = TrainConfig(micro_batch=int(r.micro_batch), grad_accum=int(r.grad_accum))
    pred = predict(model, parallel, PrecisionConfig(r.precision, "cuda"), train, r.hardware,
                   cal=cal.replace(**CODE.get(r.source, {})), attention=r.attention,
                   implementation=implementation or r.implementation)  # fmt: skip
    pred = dataclasses.replace(pred, **dict.fromkeys(without, 0.0))
    step = pred.step_time_s
    if r.metric == "step_time_s":
        value = step
    elif r.metric == "tflops_per_gpu":  # the paper's convention (zerobench.flops: recomputation counted)
        value = pred.tflops_per_gpu
    elif r.metric == "tokens_per_s_per_gpu":
        value = int(r.micro_batch) * int(r.grad_accum) * int(r.seq) / step / int(r.mp)
    else:
        raise ValueError(f"metric={r.metric!r}: must be step_time_s, tflops_per_gpu or tokens_per_s_per_gpu")
    mem = pred.memory
    return value, pred.fits, pred.max_micro_batch, f"{mem.terms()}; {mem.usable_bytes / 1e9:.1f} usable"


def validate(
    cal: Calibration = DEFAULT, path: Path = DATA, rows: pd.DataFrame | None = None, without: tuple[str, ...] = ()
) -> pd.DataFrame:
    """Every row (of `rows`, else the file's fit and validation rows) with the model's prediction and
    its error in % of the published value (with the step time's `without` terms left out); a row the
    model cannot express gets none."""
    df = load(path=path) if rows is None else rows.copy()
    if "implementation" not in df:  # the trial field: the code each source ran, unless the rows name it
        df["implementation"] = df.source.map(IMPLEMENTATION).fillna(DEFAULT_IMPLEMENTATION)
    can = expressible(df)
    none = (float("nan"), False, 0, "")
    out = [_predicted(r, cal, None, without) if ok else none for r, ok in zip(df.itertuples(), can, strict=True)]
    df["predicted"] = [o[0] for o in out]
    df["model_fits"] = [o[1] for o in out]
    df["model_max_micro_batch"] = [o[2] for o in out]
    df["model_memory_gb"] = [o[3] for o in out]
    df["error_pct"] = 100 * (df.predicted - df.value) / df.value
    return df


def sensitivity(df: pd.DataFrame, cal: Calibration = DEFAULT) -> pd.DataFrame:
    """The expressed rows of a profile with a SENSITIVITY range, predicted at each of its variants:
    one row per (row, variant) with the error there, beside the point's (implementation.variants); role
    `sensitivity`, and the recorded row's own role (`run_role`: validation or holdout, `role`)."""
    out = []
    for r in df[expressible(df)].itertuples():
        for label, impl in variants(r.implementation).items():
            value = _predicted(r, cal, impl)[0]
            out.append(dict(source=r.source, model=r.model, gpus=r.gpus, micro_batch=r.micro_batch, value=r.value,
                            implementation=r.implementation, variant=label, role="sensitivity",
                            run_role=role(r.source), error_pct=r.error_pct,
                            variant_error_pct=100 * (value - r.value) / r.value))  # fmt: skip
    return pd.DataFrame(out)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """MAPE and worst |error| per (source, hardware, split), and over all validation rows, with how
    many of those runs (all of which trained) the memory model calls out of memory (`model_oom`)."""
    df = df[expressible(df)]
    df = df.assign(abs_err=df.error_pct.abs(), oom=~df.model_fits.astype(bool))
    by = df.groupby(["source", "hardware", "split"])
    table = pd.DataFrame({"points": by.size(), "mape_pct": by.abs_err.mean(), "max_pct": by.abs_err.max(),
                          "bias_pct": by.error_pct.mean(), "model_oom": by.oom.sum()})  # fmt: skip
    val = df[df.split == "validation"]
    table.loc[("all", "all", "validation"), :] = [len(val), val.abs_err.mean(), val.abs_err.max(),
                                                  val.error_pct.mean(), val.oom.sum()]  # fmt: skip
    return table.reset_index()


def role(source: str) -> str:
    """`validation` for a holdout source some choice of the model was made on (choices.fitted_rows),
    else `holdout`."""
    return "validation" if ("external_runs", source) in fitted_rows() else "holdout"


def label(df: pd.DataFrame, first: Path = FIRST_SCORE) -> pd.DataFrame:
    """The scored holdout rows with their `role`, their error at the first scoring
    (`first_error_pct`) and their scoring history in words (`history`)."""
    before = pd.read_csv(first)
    if len(before) != len(df) or list(before.source) != list(df.source) or list(before.gpus) != list(df.gpus):
        raise ValueError(f"{first.name}: its rows are not the holdout's, in order")
    roles = df.source.map(role)
    *earlier, last = [f"at {rev} ({what})" for rev, what in SCORINGS]
    scored = f"scored {', '.join(earlier)} and {last}"
    history = [scored
               + ("; a choice of the model was made on it after the first (perfmodel/choices.py): validation"
                  if r == "validation" else "; no choice of the model was made on it")
               for r in roles]  # fmt: skip
    impl = df.source.map(IMPLEMENTATION).fillna(DEFAULT_IMPLEMENTATION)
    return df.assign(implementation=impl.values, role=roles.values, first_error_pct=before.error_pct.values,
                     history=history)  # fmt: skip


def label_first(before: pd.DataFrame) -> pd.DataFrame:
    """The first scoring's record (FIRST_SCORE) with each row's `role` now (`role`): what its error
    is, as in the current record."""
    return before.drop(columns=["role"], errors="ignore").assign(role=before.source.map(role).values)


def score_holdout(cal: Calibration = DEFAULT, out: Path | None = HOLDOUT_OUT) -> pd.DataFrame:
    """The holdout rows predicted by the current model: every row with its error (none where the
    model cannot express the run), labelled (`label`), written to `out` with the revision that
    scored it. Scoring again is a scoring of its own: SCORINGS lists them."""
    df = label(validate(cal, rows=load(("holdout",))))
    df["git_rev"] = git_revision()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(out, index=False)
    return df


def holdout_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per holdout source and hardware: runs, how many the model expresses, MAPE, worst, mean error."""
    rows = []
    for (source, hw), sub in [*df.groupby(["source", "hardware"]), (("all", "all"), df)]:
        judged = sub[expressible(sub)].error_pct
        rows.append(dict(source=source, hardware=hw, runs=len(sub), expressed=len(judged),
                         mape_pct=judged.abs().mean(), max_pct=judged.abs().max(), bias_pct=judged.mean()))  # fmt: skip
    return pd.DataFrame(rows)


def _print(df: pd.DataFrame, title: str) -> None:
    print(title)
    print(df.round(1).to_string(index=False))


if __name__ == "__main__":
    cols = ["source", "model", "hardware", "gpus", "mp", "stage", "micro_batch", "value", "predicted", "error_pct",
            "model_fits"]  # fmt: skip
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60):
        if "--label" in sys.argv:  # the recorded scoring labelled (role, history), nothing predicted again
            kept = pd.read_csv(HOLDOUT_OUT)
            kept = kept.drop(columns=["implementation", "role", "first_error_pct", "history"], errors="ignore")
            label(kept).to_csv(HOLDOUT_OUT, index=False)
            label_first(pd.read_csv(FIRST_SCORE)).to_csv(FIRST_SCORE, index=False)
            raise SystemExit(0)
        if "--sensitivity" in sys.argv:  # the recorded rows' fragile terms at their range (no scoring)
            table = sensitivity(pd.read_csv(HOLDOUT_OUT))
            table.to_csv(SENSITIVITY_OUT, index=False)
            _print(table, f"sensitivity (written to {SENSITIVITY_OUT}):")
            raise SystemExit(0)
        if "--holdout" in sys.argv:  # a scoring of the holdout (docs/perfmodel.md): record it in SCORINGS
            scored = score_holdout()
            _print(scored[cols + ["expressible"]], f"holdout runs (written to {HOLDOUT_OUT}):")
            _print(holdout_summary(scored), "holdout score (expressed runs only):")
            raise SystemExit(0)
        rows = validate()
        _print(summary(rows), "fit and validation rows:")
        worst = rows.reindex(rows.error_pct.abs().sort_values(ascending=False).index).head(8)
        _print(worst[cols], "worst rows:")
        print(f"model says out of memory for {int((~rows.model_fits).sum())} of {len(rows)} runs that trained")
