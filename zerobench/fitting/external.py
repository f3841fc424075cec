"""External validation: the model against published training runs on hardware other than the
paper's cluster (zerobench/data/external_runs.csv, each row with its citation and a fit or
validation split that was committed before any fitting; docs/perfmodel.md).

Each row is predicted from its own layout (GPUs, MP, ZeRO stage, micro-batch, accumulation,
checkpointing, attention kernel) on the datasheet profile of its GPU, and compared in the
metric the source printed (tokens/s per GPU, or step time). `python -m zerobench.fitting.external`
prints MAPE per source and hardware, per split, and the worst rows.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from zerobench.config import ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.perfmodel.constants import DEFAULT, Calibration
from zerobench.perfmodel.predict import predict

DATA = Path(__file__).resolve().parents[1] / "data" / "external_runs.csv"

# Memory behaviour of each source's training code (calibration.py; read from the code, docs/perfmodel.md
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


def _predicted(r, cal: Calibration) -> tuple[float | None, bool, int]:
    """(the row's metric as the model predicts it, fits, largest micro-batch)."""
    model = ModelConfig(layers=int(r.layers), hidden=int(r.hidden), heads=int(r.heads), seq=int(r.seq),
                        vocab=int(r.vocab), name=r.model)  # fmt: skip
    parallel = ParallelConfig(dp=int(r.gpus) // int(r.mp), mp=int(r.mp), stage=int(r.stage),
                              checkpoint_activations=bool(r.checkpoint_activations))  # fmt: skip
    train = TrainConfig(micro_batch=int(r.micro_batch), grad_accum=int(r.grad_accum))
    pred = predict(model, parallel, PrecisionConfig(r.precision, "cuda"), train, r.hardware,
                   cal=cal.replace(**CODE.get(r.source, {})),
                   attention=r.attention)  # fmt: skip
    step = pred.step_time_s
    value = (
        step if r.metric == "step_time_s" else int(r.micro_batch) * int(r.grad_accum) * int(r.seq) / step / int(r.mp)
    )
    return value, pred.fits, pred.max_micro_batch


def validate(cal: Calibration = DEFAULT, path: Path = DATA, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every row (of `rows`, else the file) with the model's prediction and its error in % of the
    published value."""
    df = pd.read_csv(path) if rows is None else rows.copy()
    out = [_predicted(r, cal) for r in df.itertuples()]
    df["predicted"] = [o[0] for o in out]
    df["model_fits"] = [o[1] for o in out]
    df["model_max_micro_batch"] = [o[2] for o in out]
    df["error_pct"] = 100 * (df.predicted - df.value) / df.value
    return df


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """MAPE and worst |error| per (source, hardware, split), and over all validation rows, with how
    many of those runs (all of which trained) the memory model calls out of memory (`model_oom`)."""
    df = df.assign(abs_err=df.error_pct.abs(), oom=~df.model_fits.astype(bool))
    by = df.groupby(["source", "hardware", "split"])
    table = pd.DataFrame({"points": by.size(), "mape_pct": by.abs_err.mean(), "max_pct": by.abs_err.max(),
                          "bias_pct": by.error_pct.mean(), "model_oom": by.oom.sum()})  # fmt: skip
    val = df[df.split == "validation"]
    table.loc[("all", "all", "validation"), :] = [len(val), val.abs_err.mean(), val.abs_err.max(),
                                                  val.error_pct.mean(), val.oom.sum()]  # fmt: skip
    return table.reset_index()


if __name__ == "__main__":
    rows = validate()
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary(rows).round(1).to_string(index=False))
        worst = rows.reindex(rows.error_pct.abs().sort_values(ascending=False).index).head(8)
        print(worst[["source", "model", "hardware", "gpus", "mp", "seq", "micro_batch", "value", "predicted",
                     "error_pct", "model_fits"]].round(2).to_string(index=False))  # fmt: skip
        print(f"model says out of memory for {int((~rows.model_fits).sum())} of {len(rows)} runs that trained")
