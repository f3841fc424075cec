"""The plan against published runs with complete layouts (zerobench/data/external_runs.csv, every split:
nothing is fitted here). Runs of one request (source, model, GPUs, hardware, precision, attention, global
batch = micro-batch × DP × accumulation) are planned once, under their source's code switches and
implementation profile (fitting/external.py CODE, IMPLEMENTATION), and for each published run:
- its layout's rank in the plan (modelled; the best of its C_B and M_D variants), or why it is not
  there: an MP group across nodes (the plan keeps MP inside a node), or the memory model's out of memory;
  whether it is in the plan's top tied group (`published_tied`: one of its variants offered and
  inside the band of the fastest offered layout, rank.ranked);
- the plan's top pick (the tied group's most headroom) against it: its layout, its modelled tokens/s
  over the published layout's (`top_gain_pct`) with the band it carries (`top_band_pct`), the
  distinct speeds in its tied group (`tied_speeds`), and what differs (`differs_in`);
- the top pick traced for memory (the published layout trained, so it fitted; the pick's peak is the
  question): `top_traced_gb`, `top_traced_fits` against the card's usable bytes;
- where a request has several published runs, the share of their pairs the plan orders as the
  published measurements do (`pairs_ordered_pct`).
`python -m zerobench.fitting.plan_validation [--out CSV] [--no-trace]`. Imports torch to trace.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import pandas as pd

from zerobench.engine.config import ModelConfig
from zerobench.fitting.external import CODE, IMPLEMENTATION, SPLITS, expressible, load
from zerobench.perfmodel.constants import DEFAULT
from zerobench.perfmodel.implementation import DEFAULT_IMPLEMENTATION
from zerobench.plan.rank import find, rank
from zerobench.plan.request import PlanRequest
from zerobench.trial.errors import REFUSED

KEY = ["source", "model", "layers", "hidden", "heads", "seq", "vocab", "hardware", "gpus", "precision", "attention",
       "global_batch"]  # fmt: skip
# the layout fields a published run states, as the plan's rows name them
STATED = ("mp", "stage", "micro_batch", "grad_accum", "checkpoint_activations")
BETTER_HIGH = {"tokens_per_s_per_gpu": True, "tflops_per_gpu": True, "step_time_s": False}


def _published(df: pd.DataFrame) -> pd.DataFrame:
    df = df[expressible(df)].copy()
    for col in ("mp", "micro_batch", "grad_accum", "gpus"):
        df[col] = df[col].astype(int)
    df["checkpoint_activations"] = df.checkpoint_activations.astype(str).str.lower() == "true"
    df["global_batch"] = df.micro_batch * df.grad_accum * (df.gpus // df.mp)
    return df.reset_index(drop=True)


def _matches(run) -> callable:
    def match(r: dict) -> bool:
        return all(r[k] == getattr(run, k) for k in STATED) and not r["partition_activations"]

    return match


def _request(run) -> PlanRequest:
    model = ModelConfig(
        layers=int(run.layers),
        hidden=int(run.hidden),
        heads=int(run.heads),
        seq=int(run.seq),
        vocab=int(run.vocab),
        name=run.model,
    )
    impl = IMPLEMENTATION.get(run.source, DEFAULT_IMPLEMENTATION)
    return PlanRequest(
        model,
        int(run.gpus),
        run.hardware,
        run.precision,
        int(run.global_batch),
        top=1,
        attention=run.attention,
        implementation=impl,
    )


def _not_there(req: PlanRequest, run) -> str:
    if run.mp not in req.mp_degrees():
        return f"MP {run.mp} spans nodes of {req.profile.gpus_per_node}: outside the plan's layouts"
    return "the memory model calls it out of memory (it trained)"


def validate_plans(df: pd.DataFrame, trace: bool = True, progress=sys.stderr) -> pd.DataFrame:
    runs = _published(df)
    out = []
    for key, group in runs.groupby(KEY, sort=False):
        first = next(group.itertuples())
        cal = DEFAULT.replace(**CODE.get(first.source, {}))
        try:
            req = _request(first)
            rows = rank(req, cal, progress=None)
        except REFUSED as exc:
            out += [
                dict(zip(KEY, key, strict=True), value=r.value, metric=r.metric, note=str(exc))
                for r in group.itertuples()
            ]
            continue
        top = rows[0]
        traced = {}
        if trace and not any(_matches(r)(top) for r in group.itertuples()):
            from zerobench.plan.verify import traced as trace_row  # imports torch: only when tracing

            traced = trace_row(req, top)
        ranks = {}
        tied_speeds = len({r["rank"] for r in rows if r["tied"]})
        for run in group.itertuples():
            mine = find(rows, _matches(run))
            ranks[run.Index] = mine
            differs = [k for k in STATED if top[k] != getattr(run, k)]
            out.append(dict(
                zip(KEY, key, strict=True), split=run.split, metric=run.metric, value=run.value,
                published_layout=f"z{run.stage} mp{run.mp} b{run.micro_batch}x{run.grad_accum}"
                                 f"{' ckpt' if run.checkpoint_activations else ''}",
                published_rank=mine["rank"] if mine else None, distinct_ranks=max(r["rank"] for r in rows),
                published_tied=any(r["tied"] for r in rows if _matches(run)(r)), tied_speeds=tied_speeds,
                published_modelled_tokens_per_s=mine["tokens_per_s"] if mine else None,
                note="" if mine else _not_there(req, run), top_layout=top["layout"],
                top_tokens_per_s=top["tokens_per_s"],
                top_gain_pct=100 * (top["tokens_per_s"] / mine["tokens_per_s"] - 1) if mine else None,
                top_band_pct=top["band_pct"], top_headroom_pct=top["headroom_pct"],
                differs_in=", ".join(differs + ["P_a"] * top["partition_activations"]),
                top_modelled_gb=top["memory_bytes"] / 1e9, usable_gb=top["usable_bytes"] / 1e9,
                top_traced_gb=traced["traced_peak_bytes"] / 1e9 if "traced_peak_bytes" in traced else None,
                top_traced_fits=traced.get("traced_fits"),
            ))  # fmt: skip
        ordered = _pairs_ordered(group, ranks)
        for row in out[-len(group) :]:
            row["pairs_ordered_pct"] = ordered
        if progress is not None:
            what = f"{first.source} {first.model} on {first.gpus} GPUs"
            print(f"plan_validation: {what}: top {top['layout']}", file=progress)
    return pd.DataFrame(out)


def _pairs_ordered(group: pd.DataFrame, ranks: dict) -> float | None:
    """% of the pairs of published runs (both in the plan, measured apart) the plan orders as measured."""
    high = BETTER_HIGH[group.metric.iloc[0]]
    pairs = [
        (a, b)
        for a, b in itertools.combinations(group.itertuples(), 2)
        if ranks[a.Index] and ranks[b.Index] and a.value != b.value
    ]
    if not pairs:
        return None
    agree = sum(
        ((a.value > b.value) == high) == (ranks[a.Index]["tokens_per_s"] > ranks[b.Index]["tokens_per_s"])
        for a, b in pairs
    )
    return 100 * agree / len(pairs)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/plan_validation.csv")
    ap.add_argument("--no-trace", action="store_true", help="modelled only: do not trace the top picks")
    args = ap.parse_args()
    table = validate_plans(load(SPLITS), trace=not args.no_trace)
    table.to_csv(args.out, index=False)
    cols = ["source", "model", "gpus", "published_layout", "published_rank", "distinct_ranks", "published_tied",
            "top_layout", "top_gain_pct", "top_band_pct", "top_traced_fits", "pairs_ordered_pct", "note"]  # fmt: skip
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.max_colwidth", 50):
        print(table[cols].round(1).to_string(index=False))
