"""Table 1 traced in one process: each cell's engine built under FakeTensorMode (runtime/trace.py,
`trace_states`: no step), its model states counted, the table written beside the formula and the
paper's printed cells (artifacts/tables/table1.py). The workflow traces the same cells as separate
`zerobench trace --states-only` trials; this is the one-command route.

    python -m zerobench.checks.table1_trace OUTDIR [--all]   # OUTDIR/table1.csv and .md
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd

from zerobench.artifacts.tables.table1 import MODELS, STAGES, Cell, markdown, table1
from zerobench.engine.config import ModelConfig, ParallelConfig, PrecisionConfig
from zerobench.runtime.trace import trace_states
from zerobench.trial import TrialSpec

NDS = (1, 4, 16, 64, 256, 1024)
# traced by default (sheets/table1.yaml lists the same): a cell's trace (the engine built, no
# step) costs seconds of CPU, so three N_d per model; the formula covers every cell, and `--all`
# traces all 54
TRACED_NDS = (4, 64, 1024)
PRECISION = PrecisionConfig(mode="bf16")  # 2 + 2 + 12 bytes per parameter (K = 12)


def traced_state_bytes(model: ModelConfig, stage: int, nd: int) -> int:
    """Per-rank model-state bytes of this engine, traced (see `zerobench.runtime.trace.trace_states`)."""
    spec = TrialSpec(model, ParallelConfig(dp=nd, stage=stage), PRECISION)
    return sum(trace_states(spec).values())


def trace_cells(nds: dict[float, tuple[int, ...]], log=None) -> dict[Cell, int]:
    """Trace the cells named by `nds` (size -> N_d) in this process, every stage."""
    out = {}
    for size, model_nds in nds.items():
        for nd in model_nds:
            for stage in STAGES:
                t0 = time.perf_counter()
                out[size, nd, stage] = traced_state_bytes(MODELS[size], stage, nd)
                if log:
                    log(f"traced {MODELS[size].name} stage {stage} N_d {nd}: {time.perf_counter() - t0:.1f} s")
    return out


def write(outdir: str | Path, nds: dict[float, tuple[int, ...]]) -> pd.DataFrame:
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    df = table1(trace_cells(nds, log=lambda s: print(s, file=sys.stderr)))
    df.to_csv(outdir / "table1.csv", index=False)
    (outdir / "table1.md").write_text(markdown(df))
    return df


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--all"]):
        sys.exit("usage: python -m zerobench.checks.table1_trace OUTDIR [--all]")
    frame = write(sys.argv[1], {size: NDS if sys.argv[2:] else TRACED_NDS for size in MODELS})
    sys.exit(0 if frame.match.all() else 1)
