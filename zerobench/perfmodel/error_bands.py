"""How far to trust a modelled figure: a prediction interval from the validation errors of its regime.

A regime is (hardware generation × parallelism kind × scale bucket). Its band is a prediction
interval at the declared COVERAGE (80 %) of |error|, from the published runs of that regime the model
was not fitted on but whose errors were in view while its choices were made (validation): each A100
source's validation rows judged with constants fitted on the other sources only
(leave-one-source-out), and the holdout rows a choice was made on (docs/perfmodel.md "Error bands").
With n such runs, the interval is the ⌈COVERAGE·(n + 1)⌉-th smallest |error| (the split-conformal
quantile: a next run of the same regime falls inside with probability at least COVERAGE if runs are
exchangeable; Vovk et al. 2005, Lei et al., JASA 2018). With fewer runs than that rank needs
(MIN_RUNS = 4 at 80 %) there is no band: `unvalidated`. The holdout rows no choice was made on set no
band: the coverage is counted on them (fitting/write_bands.py). The bands are read from
zerobench/data/error_bands.csv, which `python -m zerobench.fitting.write_bands` writes; the model
never imports the fitting code. The band is of throughput (step time, TFLOPS), not of memory.

A modelled row of a table carries one band, `band_pct` (`carried`; artifacts/judging/judged_bands.py): its
regime's band where the regime has one, else the POOLED band, the POOLED_COVERAGE (90 %) interval over
every validation run of every regime (zerobench/data/pooled_band.csv), wider than the regimes' 80 % as
a row borrows it from runs of other regimes; `band_basis` says which. A memory row takes the pooled
band as an assumption, named so. A record's `error_band_pct` is the regime's band alone (`Band.value`),
the input to `carried`; no table shows it beside `band_pct`.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

BANDS = Path(__file__).resolve().parents[1] / "data" / "error_bands.csv"
POOLED = BANDS.with_name("pooled_band.csv")
POOLED_COVERAGE = 0.9  # a pooled band borrows from other regimes: a wider interval than theirs
UNVALIDATED = "unvalidated"
# upper GPU count of each scale bucket: one node, a few nodes, up to the paper's 400-512, beyond
SCALES = ((8, "1-8"), (64, "9-64"), (512, "65-512"), (float("inf"), ">512"))
KINDS = ("data-parallel", "tensor-parallel", "fully-sharded")
COVERAGE = 0.8  # declared share of runs like this one inside the band


def interval_rank(n: int, coverage: float = COVERAGE) -> int | None:
    """Which order statistic of n validation |errors| bounds the next run's at `coverage` (1-based),
    or None when n runs are too few for any."""
    k = math.ceil(coverage * (n + 1))
    return k if k <= n else None


def prediction_interval(abs_errors, coverage: float = COVERAGE) -> float | None:
    """The band of these validation |errors| in %: their `interval_rank`-th smallest; None if too few."""
    values = sorted(float(abs(e)) for e in abs_errors)
    k = interval_rank(len(values), coverage)
    return None if k is None else values[k - 1]


MIN_RUNS = next(n for n in range(1, 100) if interval_rank(n) is not None)  # 4 at 80 %


@dataclass(frozen=True)
class Regime:
    generation: str  # v100, a100, h100, h200 (a CPU profile: its own name)
    kind: str  # KINDS
    scale: str  # SCALES' labels

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r}: must be one of {KINDS}")
        if self.scale not in [s for _, s in SCALES]:
            raise ValueError(f"scale={self.scale!r}: must be one of {[s for _, s in SCALES]}")

    def __str__(self) -> str:
        return f"{self.generation}, {self.kind}, {self.scale} GPUs"


def regime(hardware: str, gpus: int, mp: int, stage: int) -> Regime:
    """The regime of a layout: parameters sharded (stage 3: ZeRO-3, FSDP full shard), else split by
    tensor parallelism (mp > 1), else replicated (stages 0-2 without MP)."""
    if not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus={gpus!r}: must be a positive integer")
    kind = "fully-sharded" if stage == 3 else "tensor-parallel" if mp > 1 else "data-parallel"
    scale = next(label for top, label in SCALES if gpus <= top)
    prefix = str(hardware).split("-")[0]  # a datasheet profile is named for its GPU: a100-80gb
    generation = prefix if re.fullmatch(r"[vah]\d00", prefix) else str(hardware)
    return Regime(generation, kind, scale)


@dataclass(frozen=True)
class Band:
    regime: Regime
    pct: float | None  # the COVERAGE prediction interval of |error| in %; None: unvalidated (< MIN_RUNS runs)
    runs: int = 0
    worst_pct: float | None = None
    evidence: str = ""  # which validation runs: sources and how they were held out of the fit

    @property
    def value(self) -> float | str:
        """What a record's `error_band_pct` holds: the number, or `unvalidated`."""
        return UNVALIDATED if self.pct is None else round(self.pct, 1)

    def text(self) -> str:
        if self.pct is None and not self.runs:
            return f"unvalidated: no validation published run like this one ({self.regime})"
        if self.pct is None:
            return (
                f"unvalidated: {self.runs} validation run(s) like this one, fewer than {MIN_RUNS} (worst "
                f"{self.worst_pct:.0f} %; {self.regime}; {self.evidence})"
            )
        return (
            f"±{self.pct:.0f} % ({COVERAGE:.0%} prediction interval from {self.runs} validation runs like this "
            f"one, worst {self.worst_pct:.0f} %; {self.regime}; {self.evidence})"
        )


@functools.cache
def _table(path: Path = BANDS) -> dict[Regime, Band]:
    df = pd.read_csv(path)
    out = {}
    for r in df.itertuples():
        reg = Regime(r.generation, r.kind, r.scale)
        pct = float(r.band_pct) if pd.notna(r.band_pct) else None  # empty under MIN_RUNS runs
        out[reg] = Band(reg, pct, int(r.runs), float(r.worst_pct), str(r.evidence))
    return out


def band(hardware: str, gpus: int, mp: int, stage: int, path: Path = BANDS) -> Band:
    """The error band of a layout's regime (unvalidated where it has too few validation runs)."""
    reg = regime(hardware, gpus, mp, stage)
    return _table(path).get(reg, Band(reg, None))


def band_values(values: pd.Series) -> pd.Series:
    """A column of records' `error_band_pct` as numbers (NaN where unvalidated or absent)."""
    return pd.to_numeric(values, errors="coerce")


@functools.cache
def pooled(path: Path = POOLED) -> tuple[float, int]:
    """(the pooled band in %, the runs it is the POOLED_COVERAGE interval of)."""
    r = pd.read_csv(path).iloc[0]
    return float(r.band_pct), int(r.runs)


REGIME_BASIS = f"regime ({COVERAGE:.0%})"
MEMORY_BASIS = "pooled, assumed for memory: no held-out run measured memory"


def pooled_basis() -> str:
    """`band_basis` of a row on the pooled band: how many validation runs it is the interval of."""
    return f"pooled ({pooled()[1]} validation runs, {POOLED_COVERAGE:.0%})"


def carried(regime_band, memory: bool = False) -> tuple[float | None, str | None]:
    """(`band_pct`, `band_basis`) of a modelled row from its record's `error_band_pct` (the regime's
    band, or `unvalidated`): the regime's band where it has one, else the pooled band; a memory row
    takes the pooled band as an assumption. (None, None) where the row carries none (not modelled)."""
    if regime_band is None or (isinstance(regime_band, float) and math.isnan(regime_band)):
        return None, None
    if memory:
        return pooled()[0], MEMORY_BASIS
    own = pd.to_numeric(pd.Series([regime_band]), errors="coerce").iloc[0]
    return (float(own), REGIME_BASIS) if pd.notna(own) else (pooled()[0], pooled_basis())
