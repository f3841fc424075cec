"""The paper's Table 1 (per-device model-state memory, K = 12) by three independent routes: the
paper's printed cells, the analytic formula (`memory.model_state_bytes`, paper §5) and traces of
this engine (`zerobench.trace`), cell by cell at the paper's printed precision.

The paper's 7.5B, 128B and 1T are parameter counts, not shapes: `MODELS` gives GPT shapes whose
`num_params` is exactly 7.5·10⁹, 128·10⁹ and 10¹² (the vocabulary is the free knob). Most 128B
and 1T cells are truncated, not rounded, in the paper (paper.md §2; the `notes` column of
paper_reference.csv says which), and each cell is compared the way it was printed.

    python -m zerobench.table1 OUTDIR [--all]   # OUTDIR/table1.csv and OUTDIR/table1.md
"""

from __future__ import annotations

import sys
import time
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal
from pathlib import Path

import pandas as pd

from zerobench import memory
from zerobench.config import STAGE_LABELS, ModelConfig, ParallelConfig, PrecisionConfig
from zerobench.results import load_paper_reference

GB = 1e9  # the paper's GB
STAGES = {s: STAGE_LABELS[s] for s in (1, 2, 3)}
NDS = (1, 4, 16, 64, 256, 1024)
# traced by default: a cell's trace (the engine built, no step) costs ~1-6 s of CPU here, plus ~3 s
# once to import torch._dynamo (zerobench/trace.py), so three N_d per model; the formula covers
# every cell, and `--all` traces all 54
TRACED_NDS = (4, 64, 1024)
# paper's size in billions -> a GPT shape with exactly that many parameters (seq 1024). Table 1
# depends on Ψ alone; few wide layers keep the traces short (their cost grows with the number of
# tensors, not their size).
MODELS: dict[float, ModelConfig] = {
    7.5: ModelConfig(layers=9, hidden=8000, heads=64, vocab=72357, name="table1-7.5b"),
    128: ModelConfig(layers=16, hidden=25600, heads=200, vocab=83566, name="table1-128b"),
    1000: ModelConfig(layers=52, hidden=40000, heads=250, vocab=38298, name="table1-1t"),
}
PRECISION = PrecisionConfig(mode="bf16")  # 2 + 2 + 12 bytes per parameter (K = 12)


def printed(value: float, like: str, truncate: bool) -> Decimal:
    """`value` written with as many decimals as the paper's `like`, truncated or rounded half up."""
    places = Decimal(1).scaleb(-len(like.partition(".")[2]))
    return Decimal(repr(value)).quantize(places, rounding=ROUND_DOWN if truncate else ROUND_HALF_UP)


def traced_state_bytes(model: ModelConfig, stage: int, nd: int) -> int:
    """Per-rank model-state bytes of this engine, traced (see `zerobench.trace.trace_states`)."""
    from zerobench.trace import trace_states
    from zerobench.trial import TrialSpec

    spec = TrialSpec(model, ParallelConfig(dp=nd, stage=stage), PRECISION)
    return sum(trace_states(spec).values())


def table1(traced: dict[float, tuple[int, ...]] | None = None, log=None) -> pd.DataFrame:
    """One row per paper cell: model, nd, stage, paper_gb, formula_gb, traced_gb, match.

    `traced` names, per model size, the N_d whose cells are traced (default: TRACED_NDS); the
    others are NaN in `traced_gb` and checked against the formula alone. `match` is True when the
    formula and (where present) the trace print as the paper's cell."""
    traced = {size: TRACED_NDS for size in MODELS} if traced is None else traced
    ref = load_paper_reference()
    ref = ref[ref.artifact == "table1"]
    rows = []
    for r in ref.itertuples():
        size, nd = float(r.model_params_b), int(r.dp)
        stage = {v: k for k, v in STAGES.items()}[r.stage_or_config]
        model = MODELS[size]
        truncate = "truncated" in str(r.notes)
        formula = memory.total_model_state_bytes(model.num_params, stage, nd) / GB
        traced_gb = float("nan")
        if nd in traced.get(size, ()):
            t0 = time.perf_counter()
            traced_gb = traced_state_bytes(model, stage, nd) / GB
            if log:
                log(f"traced {model.name} stage {stage} N_d {nd}: {time.perf_counter() - t0:.1f} s")
        paper = Decimal(str(r.value))
        match = printed(formula, str(r.value), truncate) == paper and (
            traced_gb != traced_gb or printed(traced_gb, str(r.value), truncate) == paper
        )
        rows.append(
            dict(
                model=f"{size:g}B" if size < 1000 else "1T",
                num_params=model.num_params,
                nd=nd,
                stage=stage,
                stage_name=STAGES[stage],
                paper_gb=float(paper),
                formula_gb=formula,
                traced_gb=traced_gb,
                rounding="truncated" if truncate else "rounded",
                match=bool(match),
            )
        )
    return pd.DataFrame(rows)


def markdown(df: pd.DataFrame) -> str:
    """Table 1 as the paper lays it out (N_d rows, model × stage columns), each cell
    paper / formula / traced in GB, and a line saying whether every cell matched."""
    lines = []
    cols = [(m, s) for m in df.model.unique() for s in STAGES]
    header = " | ".join(f"{m} {STAGES[s]}" for m, s in cols)
    lines += [f"| N_d | {header} |", "|---" * (len(cols) + 1) + "|"]
    for nd in sorted(df.nd.unique()):
        cells = []
        for m, s in cols:
            r = df[(df.model == m) & (df.nd == nd) & (df.stage == s)].iloc[0]
            traced = "–" if r.traced_gb != r.traced_gb else f"{r.traced_gb:.6g}"
            cells.append(f"{r.paper_gb:g} / {r.formula_gb:.6g} / {traced}{'' if r.match else ' ✗'}")
        lines.append(f"| {nd} | " + " | ".join(cells) + " |")
    sizes = ", ".join(f"{m} = {n:,} parameters" for m, n in df.groupby("model", sort=False).num_params.first().items())
    n_traced = int(df.traced_gb.notna().sum())
    lines += [
        "",
        "Each cell: paper / formula / traced, GB = 10⁹ bytes per device (model states, K = 12). "
        f"Models: {sizes}. {n_traced} of {len(df)} cells traced; "
        f"{'every cell matches' if df.match.all() else f'{int((~df.match).sum())} cells differ (✗)'} "
        "at the paper's printed precision.",
    ]
    return "\n".join(lines) + "\n"


def write(outdir: str | Path, traced: dict[float, tuple[int, ...]] | None = None) -> pd.DataFrame:
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    df = table1(traced, log=lambda s: print(s, file=sys.stderr))
    df.to_csv(outdir / "table1.csv", index=False)
    (outdir / "table1.md").write_text(markdown(df))
    return df


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--all"]):
        sys.exit("usage: python -m zerobench.table1 OUTDIR [--all]")
    frame = write(sys.argv[1], {size: NDS for size in MODELS} if sys.argv[2:] else None)
    sys.exit(0 if frame.match.all() else 1)
