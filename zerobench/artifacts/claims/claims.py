"""The claims ledger (results/claims.csv): the paper's own claims, one row each, with the paper's
number, ours, where ours comes from and a verdict.

Only the claim is declared here: its sentence, its section, where the paper's number stands in
paper_reference.csv, the tolerance, and how ours is read from the artifacts' tables
(results/<artifact>.csv, read by artifacts/claims/claim_readers.py). Every number of ours is computed
from those tables when the ledger is built; nothing of ours is typed in.

Verdict (`verdict`), in this order: `reproduced` where ours misses the paper's number by at most the
tolerance, or, where the paper states only a bound (">38"), where ours is on the bound's side (no
tolerance past a bound: 37.9 misses ">38"); `consistent within our uncertainty` where it misses, but
by no more than ours' own band (the error band of the rows read, artifacts/judging/judged_bands.py: their
regime's, or the pooled band; a ratio's the sum of its two), so the paper's number lies inside ours ±
band, measured as the band is (|error| in % of the paper's number): the model cannot tell the two
apart, and the note names the band; `partly` where it misses by more, but the qualitative statement
the claim declares (`holds_above`: superlinear is a per-GPU ratio above 1) still holds, read on ours
or on the claim's `holds_on` (superlinear: the lowest of its interleaved rounds); `refuted` otherwise:
the paper's number outside ours ± band (or, where ours carries no band, a measured, traced or emulated
figure, outside the tolerance) and the statement fails. `not testable here` where a table, a row or
the paper's number is absent, and where ours is read from a fitted point that the model cannot read
without its choice and that reproduces: that shows the fit, not the model (common.ROLES); such a
point that misses gives its miss. Where it can (artifacts/judging/choice_readings.py: the row without the
choice), the claim shows both readings and takes the worse verdict (`WORSE`).

`role` says what the verdict reads: `judged` where every row it reads is judged, or where it comes
from the reading without the choices; `fitted` where it comes from a fitted row as fitted.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from zerobench.artifacts.claims.claim_readers import Reader, Reading, cell, over_derived, over_rows, ratio, worst
from zerobench.artifacts.judging.common import JUDGED, error_pct
from zerobench.paper_reference import load_paper_reference
from zerobench.perfmodel.choices import reversible

REPRODUCED, PARTLY, REFUTED, UNTESTABLE = "reproduced", "partly", "refuted", "not testable here"
CONSISTENT = "consistent within our uncertainty"
VERDICTS = (REPRODUCED, CONSISTENT, PARTLY, REFUTED, UNTESTABLE)
FITTED_NOTE = "read from a fitted point: it shows the fit, not the model, so it is not testable here"
WORSE = (REFUTED, PARTLY, CONSISTENT, REPRODUCED)  # the first of two readings' verdicts in this order is taken


@dataclass(frozen=True)
class PaperRef:
    """A number of paper_reference.csv: the row of `artifact` and `metric` whose columns equal
    `where` (exactly, as text); over `per`, the ratio of two such numbers."""

    artifact: str
    metric: str
    where: tuple[tuple[str, str], ...] = ()
    per: PaperRef | None = None


@dataclass(frozen=True)
class Claim:
    name: str
    text: str
    section: str
    unit: str
    read: Reader
    paper: PaperRef | None  # None: the paper's number of the row ours was read from
    tolerance_pct: float
    holds_above: float | None = None  # the qualitative statement: ours above this
    # what that statement is judged on, where not ours: e.g. the lowest of a measurement's
    # interleaved rounds, so that a statement holds only where it held in every round
    holds_on: Reader | None = None
    # where the claim states a direction the paper's number leaves unwritten ('>': at least it; "C5
    # does not lower the memory": C5 over C4 at least 1), the bound its statement sets
    bound: str = ""

    def __post_init__(self):
        if self.bound not in ("", ">", "<"):
            raise ValueError(f"claim {self.name}: bound={self.bound!r} must be '', '>' or '<'")
        if not self.tolerance_pct > 0:
            raise ValueError(f"claim {self.name}: tolerance_pct must be > 0, got {self.tolerance_pct}")


def reference(ref: PaperRef) -> tuple[float, str, str] | None:
    """(value, bound, kind) of a paper number: bound '>' or '<' where the paper states only a
    bound (">38"), else ''; kind as tagged (stated, read_from_figure, derived). None if absent."""
    df = load_paper_reference()
    df = df[(df.artifact == ref.artifact) & (df.metric == ref.metric)]
    for col, val in ref.where:
        df = df[df[col].astype(str) == val]
    if df.empty:
        return None
    text, kind = str(df.value.iloc[0]).strip(), str(df.kind.iloc[0])
    match = re.fullmatch(r"([<>]?)~?\s*([0-9.]+)", text)
    if not match:
        return None
    value, bound = float(match.group(2)), match.group(1)
    if ref.per is not None:
        den = reference(ref.per)
        if den is None or not den[0]:
            return None
        return value / den[0], "", f"{kind} / {den[2]}" if den[2] != kind else kind
    return value, bound, kind


def _ref(artifact: str, metric: str, per: PaperRef | None = None, **where) -> PaperRef:
    return PaperRef(artifact, metric, tuple((k, str(v)) for k, v in where.items()), per)


# the measured superlinear pair (artifacts/tables/superlinear.py): per-rank throughput at N_d 2 over N_d 1
_SL, _SL_ROW = "superlinear", "P_os+g+p N_d=2: largest micro-batch that fits"
# the emulated superlinear line (artifacts/tables/superlinear_emulated.py): one rank of N_d 2 over one of N_d 1
_SLE, _SLE_ROW = "superlinear_emulated", "emulated P_os+g N_d=2"


def _per_rank(vs_linear_pct: float) -> float:
    return 1 + vs_linear_pct / 100


def _fig3_per_gpu(gpus: int) -> PaperRef:
    return _ref("fig3", "throughput_per_gpu", gpus=gpus)


# The claims. `section` names the table or figure and where paper.md extracts the claim. Tolerances:
# the artifact sheet's tolerance_pct (workflows/config/sheets/), 1 % for counted bytes.
_T1, _T2, _F2, _F3, _F8 = (
    "Table 1 (paper.md §1.1, §2)",
    "Table 2 (paper.md §3)",
    "Fig 2 (paper.md §5.1)",
    "Fig 3 (paper.md §5.2)",
    "Fig 8 (paper.md §5.6)",
)
_COMM = "communication analysis (paper.md §1.4)"
_F6 = "Fig 6 (paper.md §10.4)"


def _c5_over_c4(size: int) -> tuple[Reader, PaperRef]:
    """The engine's traced allocated peak with P_a+cpu (C5) over without (C4) at `size` B, and the
    paper's cached C5 over C4: ours counts tensors, the paper's bars the allocator's cache."""
    traced = [cell("fig6", f"{size}B C{c}", "traced_allocated_gib", carries_fit=False) for c in (5, 4)]
    paper = [_ref("fig6", "max_memory_cached", model_params_b=size, stage_or_config=f"C{c}") for c in (5, 4)]
    return ratio(*traced), dataclasses.replace(paper[0], per=paper[1])


def _comm(stage: str) -> Reader:
    """A stage's volume per step over the baseline's, at the table's largest N_d."""
    return ratio(cell("comm_volume", f"{stage} N_d=4"), cell("comm_volume", "baseline N_d=4"))


CLAIMS = (
    Claim("table1_every_cell", "Per-device model-state memory is 16Ψ, 4Ψ + 12Ψ/N_d, 2Ψ + 14Ψ/N_d and 16Ψ/N_d "
          "for the three stages: every Table 1 cell (the worst of ours shown)", _T1, "GB", worst("table1"), None, 2.5),
    Claim("table1_1t_1024", "A 1T-parameter model's states take 15.6 GB per device with P_os+g+p on 1024 GPUs, "
          "so DP alone fits it in 32 GB", "Table 1 (paper.md §7)", "GB", cell("table1", "1T P_os+g+p N_d=1024"),
          _ref("table1", "model_state_memory_per_device", model_params_b=1000, dp=1024,
               stage_or_config="P_os+g+p"), 2.5),
    Claim("table2_pos_mp16", "ZeRO-OS (P_os) trains a 100B model at MP 16 on 1024 GPUs (measured)", _T2,
          "B params", cell("table2", "MP 16 P_os measured"),
          _ref("table2", "max_model_size_measured", gpus=1024, stage_or_config="P_os (ZeRO-OS)"), 10),
    Claim("fig8_13b_without_mp", "ZeRO-100B trains models up to 13B without model parallelism on 128 GPUs", _F8,
          "B params", cell("fig8", "max model ZeRO-DP"), _ref("fig8", "max_model_without_MP"), 10),
    Claim("fig8_ddp_1_4b", "Data parallelism without ZeRO runs out of memory beyond 1.4B parameters", _F8,
          "B params", cell("fig8", "max model DDP"), _ref("fig8", "max_model_without_ZeRO"), 10),
    Claim("fig8_ddp_under_20tf", "DDP at its largest model (1.4B) runs at under 20 TFLOPS per GPU", _F8,
          "TFLOPS/GPU", cell("fig8", "DDP 1.38B"), _ref("fig8", "throughput_per_gpu", model_params_b=1.4), 10),
    Claim("fig8_zero_dp_over_40tf", "ZeRO-DP without MP runs 1.5B-13B models at over 40 TFLOPS per GPU on average",
          _F8, "TFLOPS/GPU", over_rows("fig8", r"ZeRO [0-9.]+B"), _ref("fig8", "avg_throughput_per_gpu"), 10),
    Claim("fig2_100b_38tf", "ZeRO-100B trains a 100B model on 400 GPUs at over 38 TFLOPS per GPU", _F2,
          "TFLOPS/GPU", cell("fig2", "ZeRO 100B"),
          _ref("fig2", "throughput_per_gpu", model_params_b=100, kind="stated"), 10),
    Claim("fig2_15pf_average", "ZeRO-100B sustains 15 PFLOPS on 400 GPUs on average over 8B-100B models", _F2,
          "PFLOPS", over_rows("fig2", r"ZeRO (8|40|60|80|100)B", scale=400 / 1000),
          _ref("fig2", "aggregate_throughput_average"), 10),
    Claim("fig2_10x_megatron", "ZeRO-100B is up to 10x faster than the Megatron-LM baseline (1.5B-170B, "
          "400 GPUs)", _F2, "x", over_derived("fig2", "speed-up", "max"),
          _ref("fig2", "max_speedup_over_baseline"), 10, holds_above=1.0),
    Claim("model_size_8x", "ZeRO-100B trains 8x larger models than the largest the Megatron baseline fits "
          "(ours: Fig 5's largest configuration on 400 GPUs over Table 2's baseline at MP 16)",
          "Fig 2, headline (paper.md §5.1, §8)", "x",
          ratio(over_rows("fig5", r"C\d", "max"), cell("table2", "MP 16 baseline measured")),
          _ref("headline", "model_size_increase"), 10, holds_above=1.0),
    Claim("fig3_superlinear", "A 60B model scales superlinearly from 64 to 400 GPUs: per-GPU throughput at "
          "400 GPUs over that at 64", _F3, "x", ratio(cell("fig3", "400 GPUs"), cell("fig3", "64 GPUs")),
          _ref("fig3", "throughput_per_gpu", per=_fig3_per_gpu(64), gpus=400), 10, holds_above=1.0),
    Claim("superlinear_doubling", "Performance more than doubles when the GPU count doubles (P_os+g, per-rank "
          "throughput of one rank of N_d 2 over one of N_d 1, emulated: each at its largest micro-batch under one "
          "budget, no ranks sharing the host; paper: 64 -> 128 GPUs)", _F3, "x",
          cell(_SLE, _SLE_ROW, "per_rank_ratio"), _ref("fig3", "throughput_per_gpu", per=_fig3_per_gpu(64), gpus=128),
          10, holds_above=1.0, holds_on=cell(_SLE, _SLE_ROW, "per_rank_ratio_low")),
    Claim("superlinear_doubling_shared_host", "The same, measured with two real ranks sharing this 2-core host "
          "(P_os+g+p, per-rank throughput at N_d 2 over N_d 1 in interleaved rounds): the two ranks share one host's "
          "cores, caches and memory bandwidth, as the paper's ranks, a GPU each, did not", _F3, "x",
          cell(_SL, _SL_ROW, "vs_linear_pct", _per_rank), _ref("fig3", "throughput_per_gpu",
          per=_fig3_per_gpu(64), gpus=128), 10, holds_above=1.0, holds_on=cell(_SL, _SL_ROW, "vs_linear_low_pct",
          _per_rank)),
    Claim("fig6_40b_c5_no_drop", "At 40B (micro-batch 16) offloading activation checkpoints to the host (C5) "
          "does not lower the memory per GPU below C4's: C5 over C4 at least 1 (ours: the engine's traced allocated "
          "peak; the paper's: cached)", _F6, "x", *_c5_over_c4(40), 10, bound=">"),
    Claim("fig6_100b_c5_drop", "At 100B (micro-batch 32) C5 lowers the memory per GPU below C4's: C5 over C4 "
          "(ours: the engine's traced allocated peak; the paper's: cached)", _F6, "x", *_c5_over_c4(100), 10),
    Claim("comm_stage3_1_5x", "P_os+g+p moves 1.5x the data-parallel baseline's communication volume (3Ψ vs 2Ψ)",
          _COMM, "x", _comm("P_os+g+p"), _ref("headline", "comm_volume_vs_DP", stage_or_config="P_os+g+p"), 1),
    Claim("comm_stage12_1x", "P_os and P_os+g move the same volume as the data-parallel baseline (2Ψ)", _COMM,
          "x", _comm("P_os+g"), _ref("headline", "comm_volume_vs_DP", stage_or_config="P_os / P_os+g"), 1),
)  # fmt: skip


def verdict(
    ours: float | None,
    paper: float | None,
    bound: str,
    tolerance_pct: float,
    holds_above: float | None = None,
    fitted: bool = False,
    held: float | None = None,
    band_pct: float | None = None,
) -> tuple[str, float | None]:
    """(verdict, error %) of ours against the paper's number (module docstring). With a bound
    ('>' or '<'), ours on the bound's side misses by nothing, and a miss is measured to the bound;
    `held`: what `holds_above` is judged on, if not ours; `band_pct`: ours' band, inside which a miss
    is consistent within our uncertainty (None: ours carries none, the tolerance judges alone)."""
    err = error_pct(ours, paper)
    if err is None or fitted:  # a fitted point tests the fit, not the model
        return UNTESTABLE, err
    if bound:  # a bound holds on its side only
        within = (bound == ">" and ours >= paper) or (bound == "<" and ours <= paper)
    else:
        within = abs(err) <= tolerance_pct
    if within:
        return REPRODUCED, err
    if band_pct is not None and abs(err) <= band_pct:  # the paper's number inside ours ± band
        return CONSISTENT, err
    if holds_above is not None and (ours if held is None else held) > holds_above:
        return PARTLY, err
    return REFUTED, err


def without_choices(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The tables with each row the model can read without every choice made on it (its
    `ours_without_choice`) read so, and judged: the claim's second reading."""
    out = {}
    for name, df in tables.items():
        if "ours_without_choice" in df:
            undoable = set(reversible(name))
            by = df.fitted_by.fillna("").astype(str).str.split("; ", regex=False)
            undone = df.ours_without_choice.notna() & by.map(undoable.issuperset)
            df = df.assign(ours=df.ours.where(~undone, df.ours_without_choice), role=df.role.where(~undone, JUDGED))
        out[name] = df
    return out


def band_note(got: Reading, inside: bool) -> str:
    """Which band a miss was judged by, and on which side of it the paper's number lies."""
    return f"the paper's number lies {'inside' if inside else 'outside'} ours ±{got.band_pct:.1f} % ({got.band_basis})"


def both_readings(c: Claim, tables: dict, got: Reading, paper: float, bound: str, held) -> tuple[str, float, str, str]:
    """(the worse verdict, ours without the choices, a note with both, the role of the reading the
    verdict comes from) of a claim read from a fitted row. Where the model cannot read it without them,
    the fitted reading alone: a miss stands (a fit that still misses, inside the band or not), a hit
    shows the fit (UNTESTABLE)."""
    value = got.value
    with_, err = verdict(value, paper, bound, c.tolerance_pct, c.holds_above, False, held, got.band_pct)
    bare = c.read(without_choices(tables))
    if isinstance(bare, str) or bare.fitted:
        shown = f"read from a fitted row the model cannot read without its choice: {value:.4g} ({with_}, {err:+.1f} %)"
        if with_ == REPRODUCED:
            return UNTESTABLE, None, f"{shown}; {FITTED_NOTE}", "fitted"
        return with_, None, f"{shown}; a miss on a fitted row stands", "fitted"
    without, err0 = verdict(bare.value, paper, bound, c.tolerance_pct, c.holds_above, False, held, bare.band_pct)
    note = (
        f"read from a row a choice was made on (perfmodel/choices.py): with it {value:.4g} ({with_}, "
        f"{err:+.1f} %), without it {bare.value:.4g} ({without}, {err0:+.1f} %); the worse is taken"
    )
    taken = min(with_, without, key=WORSE.index)
    return taken, bare.value, note, JUDGED if taken == without else "fitted"


def ledger(tables: dict[str, pd.DataFrame], claims: tuple[Claim, ...] = CLAIMS) -> pd.DataFrame:
    """One row per claim, ours read from `tables` (artifact name -> its table)."""
    rows = []
    for c in claims:
        got = c.read(tables)
        ref = reference(c.paper) if c.paper is not None else None
        paper, bound, kind = ref if ref else (getattr(got, "paper", None), "", "the row's paper number")
        bound = c.bound or bound
        notes = []
        if isinstance(got, str):
            notes.append(got)
            got = None
        if paper is None:
            notes.append("no paper number")
        value = got.value if got else None
        held = c.holds_on(tables) if c.holds_on is not None and got else None
        if isinstance(held, str):
            notes.append(f"the statement read on ours: {held}")
            held = None
        elif held is not None:
            notes.append(f"the statement read on {held.basis}: {held.value:.4g}")
        v, err = verdict(value, paper, bound, c.tolerance_pct, c.holds_above, False, held and held.value,
                         got.band_pct if got else None)  # fmt: skip
        bare, role = None, (("fitted" if got.fitted else JUDGED) if got else None)
        if got and got.fitted and paper is not None:
            v, bare, note, role = both_readings(c, tables, got, paper, bound, held and held.value)
            notes.append(note)
        if v == CONSISTENT:
            notes.append(f"{band_note(got, True)}: consistent within our uncertainty, neither reproduced nor refuted")
        elif v in (REFUTED, PARTLY) and got and got.band_pct is not None:
            notes.append(band_note(got, False))
        rows.append(
            dict(
                claim=c.name,
                text=c.text,
                section=c.section,
                paper=paper,
                paper_bound=bound,
                paper_kind=kind,
                ours=value,
                unit=c.unit,
                source=got.source if got else None,
                role=role,
                basis=got.basis if got else None,
                error_pct=err,
                band_pct=got.band_pct if got else None,
                band_basis=got.band_basis if got else None,
                ours_without_choice=bare,
                error_without_choice_pct=error_pct(bare, paper),
                tolerance_pct=c.tolerance_pct,
                holds_above=c.holds_above,
                verdict=v,
                note="; ".join(notes) or None,
            )
        )
    return pd.DataFrame(rows)


def build(paths: list[str]) -> pd.DataFrame:
    """The ledger from results/<artifact>.csv files (each named by its stem)."""
    return ledger({Path(p).stem: pd.read_csv(p) for p in paths})


def _num(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"


def section(csv_path: str) -> str:
    """REPORT.md's section: the verdicts counted, what the claims read (judged or fitted rows,
    counted from the ledger), then every claim."""
    df = pd.read_csv(csv_path)
    counts = ", ".join(f"{int((df.verdict == v).sum())} {v}" for v in VERDICTS if (df.verdict == v).any())
    fitted = df.basis.astype(str).str.contains("fitted")
    lines = ["| claim | section | paper | ours | source | role | error % | band ±% | tolerance % | verdict "
             "| read from |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for _, r in df.astype(object).where(df.notna(), None).iterrows():
        paper = f"{r.paper_bound or ''}{_num(r.paper)} ({r.paper_kind})"
        read_from = "; ".join(t for t in (r.basis, r.note) if t) or "-"
        lines.append(
            f"| {r.text} | {r.section} | {paper} | {_num(r.ours)} {r.unit} | {r.source or '-'} | {r.role or '-'} | "
            f"{_num(r.error_pct)} | {_num(r.band_pct)} | {r.tolerance_pct:g} | **{r.verdict}** | {read_from} |"
        )
    return "\n\n".join([
        "## The paper's claims",
        f"**Ledger** (`{csv_path}`): {len(df)} claims of the paper, each ours read from the artifacts' tables: "
        f"{int((~fitted).sum())} from judged rows only, {int(fitted.sum())} from rows a choice of the model was "
        "fitted or chosen on (`read from` names them, with how many are fitted). `role`: what the verdict reads, "
        "`judged` (judged rows, or the model's reading without the choices) or `fitted`. **reproduced**: within "
        "the tolerance of the paper's number, or on the side of its bound (no tolerance past a bound); "
        f"**{CONSISTENT}**: outside the tolerance, but the paper's number lies inside ours ± our band (`band`: the "
        "error band of the rows read, their regime's or the pooled one, artifacts/judging/judged_bands.py; a "
        "ratio's the sum of its two), so the model cannot tell them apart; the note names the band; **partly**: "
        "outside the band, but the claim's qualitative statement holds (e.g. superlinear: a per-GPU ratio above 1); "
        "**refuted**: the paper's number outside ours ± band (outside the tolerance where ours carries no band: "
        "measured, traced or emulated) and the statement fails; **not testable here**: a table, row or number is "
        "absent, or ours is read from a fitted point the model cannot read without its choice and it reproduces. "
        "A claim read from a row a choice was made on, where the model can undo the choice, shows both readings "
        f"and takes the worse. Verdicts: {counts}.",
        "\n".join(lines),
    ])  # fmt: skip
