"""External validation: the model against published training runs on hardware other than the
paper's cluster (zerobench/data/external_runs.csv, each row with its citation and a fit or
validation split that was committed before any fitting; docs/perfmodel.md).

Each row is predicted from its own layout (GPUs, MP, ZeRO stage, micro-batch, accumulation,
checkpointing, attention kernel) on the datasheet profile of its GPU, and compared in the
metric the source printed (tokens/s per GPU, or step time). `python -m zerobench.perfmodel.external`
prints MAPE per source and hardware, per split, and the worst rows.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from zerobench.config import ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.perfmodel.calibration import DEFAULT, Calibration
from zerobench.perfmodel.predict import predict

DATA = Path(__file__).resolve().parents[1] / "data" / "external_runs.csv"


def _predicted(r, cal: Calibration) -> tuple[float | None, bool, int]:
    """(the row's metric as the model predicts it, fits, largest micro-batch)."""
    model = ModelConfig(layers=int(r.layers), hidden=int(r.hidden), heads=int(r.heads), seq=int(r.seq),
                        vocab=int(r.vocab), name=r.model)  # fmt: skip
    parallel = ParallelConfig(dp=int(r.gpus) // int(r.mp), mp=int(r.mp), stage=int(r.stage),
                              checkpoint_activations=bool(r.checkpoint_activations))  # fmt: skip
    train = TrainConfig(micro_batch=int(r.micro_batch), grad_accum=int(r.grad_accum))
    pred = predict(model, parallel, PrecisionConfig(r.precision, "cuda"), train, r.hardware, cal=cal,
                   attention=r.attention)  # fmt: skip
    step = pred.step_time_s
    value = (
        step if r.metric == "step_time_s" else int(r.micro_batch) * int(r.grad_accum) * int(r.seq) / step / int(r.mp)
    )
    return value, pred.fits, pred.max_micro_batch


def validate(cal: Calibration = DEFAULT, path: Path = DATA) -> pd.DataFrame:
    """Every row with the model's prediction and its error in % of the published value."""
    df = pd.read_csv(path)
    out = [_predicted(r, cal) for r in df.itertuples()]
    df["predicted"] = [o[0] for o in out]
    df["model_fits"] = [o[1] for o in out]
    df["model_max_micro_batch"] = [o[2] for o in out]
    df["error_pct"] = 100 * (df.predicted - df.value) / df.value
    return df


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """MAPE and worst |error| per (source, hardware, split), and over all validation rows."""
    df = df.assign(abs_err=df.error_pct.abs())
    groups = df.groupby(["source", "hardware", "split"]).abs_err
    table = pd.DataFrame({"points": groups.size(), "mape_pct": groups.mean(), "max_pct": groups.max(),
                          "bias_pct": df.groupby(["source", "hardware", "split"]).error_pct.mean()})  # fmt: skip
    val = df[df.split == "validation"]
    table.loc[("all", "all", "validation"), :] = [len(val), val.abs_err.mean(), val.abs_err.max(), val.error_pct.mean()]
    return table.reset_index()


if __name__ == "__main__":
    rows = validate()
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary(rows).round(1).to_string(index=False))
        worst = rows.reindex(rows.error_pct.abs().sort_values(ascending=False).index).head(8)
        print(worst[["source", "model", "hardware", "gpus", "mp", "seq", "micro_batch", "value", "predicted",
                     "error_pct", "model_fits"]].round(2).to_string(index=False))  # fmt: skip
