"""REPORT.md's section "On one H200": the engine measured on one GPU beside plain PyTorch on the same
GPT, and the performance model's error on those runs.

Reads results/gpu/h200 only (results/gpu/h200/README.md says what ran, where and at which revision):
the engine's records (`runs/*.json`, measured), the plain-PyTorch loop's (`peer.jsonl`,
`peer_compile.jsonl`, measured) and `compare.csv` (the current model's predictions, modelled,
remade from the records by the workflow's `gpu_compare` rule:
`python -m zerobench.checks.gpu_check --compare results/gpu/h200`).
MFU is achieved TFLOPS (the paper's count, recomputation included) over the GPU's dense bf16
datasheet peak (zerobench/gpus.py), for ours and the peers alike. No torch import.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from zerobench.gpus import mfu
from zerobench.perfmodel.choices import fitted_rows

GPU_DIR = Path("gpu") / "h200"  # under results/
PROFILE = "h200-141gb"


def _peers(directory: Path) -> pd.DataFrame:
    rows = []
    for name in ("peer.jsonl", "peer_compile.jsonl"):
        path = directory / name
        if path.exists():
            rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return pd.DataFrame(rows, columns=["impl", "model", "micro_batch", "step_time_s", "tflops_per_gpu",
                                       "peak_allocated_bytes"])  # fmt: skip


def _cell(value, fmt: str) -> str:
    return "" if value is None or pd.isna(value) else format(value, fmt)


def speed_table(runs: pd.DataFrame, peers: pd.DataFrame) -> str:
    """Per preset and micro-batch: our TFLOPS and MFU at stages 0 and 3, the plain loop's and the
    compiled loop's, our stage 0 step over the plain loop's, and the peak memory of each."""
    lines = ["| model | micro-batch | ours s0 TFLOPS (MFU) | ours s3 TFLOPS (MFU) | plain PyTorch TFLOPS (MFU) | "
             "compiled TFLOPS (MFU) | ours s0 step / plain | peak GB: ours s0, plain |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (model, mb), sub in runs.groupby(["model", "micro_batch"], sort=False):
        ours = {int(r.stage): r for r in sub.itertuples()}
        peer = {r.impl: r for r in peers[(peers.model == model) & (peers.micro_batch == mb)].itertuples()}

        def rate(r) -> str:
            return "" if r is None else f"{r.tflops_per_gpu:.0f} ({mfu(r.tflops_per_gpu, PROFILE):.2f})"

        s0, plain = ours.get(0), peer.get("torch-plain")
        ratio = s0.step_time_s / plain.step_time_s if s0 is not None and plain is not None else None
        mem = ", ".join(_cell(r and r.peak_allocated_bytes / 1e9, ".1f") for r in (s0, plain))
        lines.append(
            f"| {model} | {mb} | {rate(s0)} | {rate(ours.get(3))} | {rate(plain)} | "
            f"{rate(peer.get('torch-compile'))} | {_cell(ratio, '.2f')} | {mem} |"
        )
    return "\n".join(lines)


LEDGER = fitted_rows(GPU_DIR.as_posix())


def _key(r) -> tuple[str, str]:
    return GPU_DIR.as_posix(), f"{r.model} stage {r.stage} micro-batch {r.micro_batch}"


def role(r) -> str:
    """`fitted` for a run the ledger of choices names (perfmodel/choices.py: fitted on it, or carrying
    a term fitted on runs like it), else `judged`."""
    return "fitted" if _key(r) in LEDGER else "judged"


def error_table(compare: pd.DataFrame) -> str:
    """The model's error per run, on the datasheet profile and on the calibrated one."""
    cols = {
        "tflops_error_pct": "TFLOPS error %",
        "peak_bytes_error_pct": "memory error %",
        "calibrated_tflops_error_pct": "calibrated TFLOPS error %",
        "calibrated_peak_bytes_error_pct": "calibrated memory error %",
    }
    cols = {k: v for k, v in cols.items() if k in compare}
    lines = [
        "| model | stage | micro-batch | role | " + " | ".join(cols.values()) + " |",
        "|---|---|---|---|" + "---|" * len(cols),
    ]
    for r in compare.itertuples():
        cells = [_cell(getattr(r, k), "+.1f") if pd.notna(getattr(r, k)) else "out of memory" for k in cols]
        by = "; ".join(LEDGER.get(_key(r), ()))
        lines.append(
            f"| {r.model} | {r.stage} | {r.micro_batch} | {role(r)}{f' ({by})' if by else ''} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def summary(compare: pd.DataFrame) -> str:
    """One line: runs called out of memory, and the error's range by micro-batch (the TFLOPS over the
    judged rows: the fitted ones, `role`, set apart)."""
    trained = compare[compare.status == "ok"]
    oom = int(trained.predicted_tflops.isna().sum())
    judged = trained[[role(r) == "judged" for r in trained.itertuples()]]
    small = judged.micro_batch == 1
    mem, t1, t4 = trained.peak_bytes_error_pct, judged[small].tflops_error_pct, judged[~small].tflops_error_pct
    return (
        f"Of {len(trained)} runs that trained, the model calls {oom} out of memory. Peak memory "
        f"{mem.min():+.1f} … {mem.max():+.1f} %; TFLOPS at micro-batch 1 {t1.min():+.1f} … {t1.max():+.1f} %, "
        f"at micro-batch ≥ 4 {t4.min():+.1f} … {t4.max():+.1f} % (the {len(judged)} judged rows; the "
        f"{len(trained) - len(judged)} fitted ones, perfmodel/choices.py, apart)."
    )


def memory_sentence(compare: pd.DataFrame) -> str:
    """What the two profiles' memory columns show, read from them: the same bytes (both price this
    engine's memory) or not, and the error's range."""
    trained = compare[compare.status == "ok"]
    a, b = trained.predicted_peak_bytes, trained.calibrated_predicted_peak_bytes
    err = trained.peak_bytes_error_pct
    same = bool(((a - b).abs() <= 1e-9 * a.abs()).all())
    which = (
        f"both profiles price this engine's memory (perfmodel/engine_memory.py): their peaks are the same bytes for "
        f"all {len(trained)} runs"
        if same
        else f"the two profiles' peaks differ for {int(((a - b).abs() > 1e-9 * a.abs()).sum())} of {len(trained)} runs"
    )
    return (
        f"Peak memory: {which}, {err.min():+.1f} … {err.max():+.1f} % against the runs. These runs' peak held a "
        "4 B/param fp32 step temporary that the engine, as now priced, no longer holds (the README, docs/gpu.md)."
    )


def gpu_section(results: Path) -> str | None:
    """The section (markdown), or None where results/gpu/h200 holds no records."""
    directory = Path(results) / GPU_DIR
    paths = sorted((directory / "runs").glob("*.json")) if directory.exists() else []
    if not paths:
        return None
    runs = pd.DataFrame([json.loads(p.read_text()) for p in paths])
    runs = runs[runs.status == "ok"].sort_values(["num_params", "micro_batch", "stage"])
    parts = [
        "## On one H200",
        f"**Source:** measured (this engine and a plain PyTorch loop on the same GPT, one H200, bf16, activation "
        f"checkpointing, dp = 1) and modelled (the performance model's prediction of each run) · "
        f"`results/{GPU_DIR.as_posix()}/` (its README: the revision that ran them, 6c88ed3, and what each file is)",
        speed_table(runs, _peers(directory)),
        "MFU: TFLOPS over the H200's 989 TFLOPS dense bf16 datasheet peak. The plain loop keeps fp32 parameters "
        "under bf16 autocast; the engine stores bf16 parameters and gradients beside fp32 Adam states, and these "
        "runs' peak also holds a 4 B/param fp32 step temporary (the README).",
    ]
    compare_path = directory / "compare.csv"
    if compare_path.exists():
        compare = pd.read_csv(compare_path)
        parts += ["**The model on these runs** (modelled; `compare.csv`, error = 100·(predicted − measured)/measured). "
                  + summary(compare), error_table(compare), memory_sentence(compare)]  # fmt: skip
    return "\n\n".join(parts)
