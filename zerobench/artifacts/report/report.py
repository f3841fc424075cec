"""results/REPORT.md: for each table and figure of the paper, the paper's numbers beside ours, the
error, and a one-line verdict against the tolerance its workflow sheet sets. A verdict reads the
judged rows alone; fitted, formula, reference and derived rows are counted and shown apart
(artifacts/judging/common.py, ROLES). No torch import."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import yaml

from zerobench.artifacts.claims.claims import section as claims_section
from zerobench.artifacts.judging.common import JUDGED, ROLES, compared, judged
from zerobench.artifacts.judging.host_speed import note as host_note
from zerobench.artifacts.judging.judged_bands import counts as band_counts
from zerobench.artifacts.judging.judged_bands import headline, inside_of
from zerobench.artifacts.judging.noisy_rows import mark_noisy
from zerobench.artifacts.report.blind_section import blind_section
from zerobench.artifacts.report.gpu_section import gpu_section
from zerobench.artifacts.report.heldout import heldout_section
from zerobench.artifacts.report.plan_section import plan_section
from zerobench.artifacts.tables import superlinear, superlinear_emulated
from zerobench.peers.summary import peers_markdown

MAX_ROWS = 40  # rows shown per artifact; the CSV has them all
# What a sheet's claim states beyond its tolerance on the mean, checked as part of its verdict: a
# worst-row limit per series (`series`: the rows' `series` column; None: every judged row). A sheet's
# own `limits:` key takes precedence; `says` are the claim's words, which a test finds in the sheet.
STATED_LIMITS = {
    "model_vs_measured": dict(series={"step time (s)": 25.0, "peak memory (MiB)": 10.0},
                              says=("worst within 25%", "predicted peak memory within 10%")),
    "capacity": dict(series={None: 10.0}, says=("each trial's peak memory within 10%",)),
}  # fmt: skip
SHOWN = ["key", "source", "role", "status", "micro_batch", "ours", "paper", "expected", "error_pct", "band_pct",
         "too_noisy", "error_without_fitted_pct", "error_without_choice_pct", "fitted_by", "formula",
         "vs_linear_pct",
         "derived_from", "build_gb"]  # fmt: skip

# the sweeps whose section says, in words, what the run saw
SEEN = {"superlinear": superlinear.seen, "superlinear_emulated": superlinear_emulated.seen}


def _num(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
    return str(v)


def _markdown(df: pd.DataFrame) -> str:
    cols = [c for c in SHOWN if c in df and df[c].notna().any()]
    names = {
        "error_pct": "error %",
        "vs_linear_pct": "vs linear %",
        "formula": "bare formula",
        "error_without_fitted_pct": "error % without fitted terms",
        "derived_from": "derived from",
        "band_pct": "band ±%",
        "error_without_choice_pct": "error % without the choice",
        "too_noisy": "too noisy",
        "fitted_by": "fitted or chosen on by (perfmodel/choices.py)",
        "build_gb": "construction peak (GB, traced)",
    }
    head = "| " + " | ".join(names.get(c, c) for c in cols) + " |"
    lines = [head, "|" + "---|" * len(cols)]
    for _, r in df[cols].head(MAX_ROWS).iterrows():
        lines.append("| " + " | ".join(_num(r[c]) for c in cols) + " |")
    if len(df) > MAX_ROWS:
        lines.append(f"\n({len(df) - MAX_ROWS} more rows in the CSV)")
    return "\n".join(lines)


def _condense_loss(df: pd.DataFrame) -> pd.DataFrame:
    """Loss tables have one row per step: show each layout's last step, with its worst error."""
    rows = []
    for layout, sub in df.groupby("layout", sort=False):
        last = sub.iloc[-1].copy()
        worst = sub.error_pct.abs().max() if sub.error_pct.notna().any() else None
        last["key"] = f"{layout}: last loss (step {int(last.step)}); error % = worst over all steps"
        last["error_pct"] = worst
        rows.append(last)
    return pd.DataFrame(rows)


def stats(df: pd.DataFrame, name: str = "table") -> dict:
    """The verdict's numbers: mean and max |error| % over the judged points alone (common.judged),
    less those whose every run was taken in a slow spell of the host (`slow`, artifacts/judging/host_speed.py),
    with how many of them spread past the tolerance across their runs (`noisy`, artifacts/judging/noisy_rows.py:
    judged, and said); per other role its compared
    points and their mean |error| %, kept apart (`apart`)."""
    pts = judged(df, name)
    slow = pts.slow_spell.eq(True) if "slow_spell" in pts else pd.Series(False, index=pts.index)
    noisy = pts.too_noisy.eq(True) & ~slow if "too_noisy" in pts else pd.Series(False, index=pts.index)
    pts = pts[~slow]  # a noisy row is judged all the same: no rule chosen with its error in view sets it aside
    err = pts.error_pct.astype(float).abs()
    worst = pts.loc[err.idxmax(), "key"] if len(pts) else None
    others = compared(df)
    others = others[others.role != JUDGED]
    apart = {
        role: (len(sub), float(sub.error_pct.astype(float).abs().mean()))
        for role, sub in others.groupby("role")
        if len(sub)
    }
    status = df.status.dropna().astype(str) if "status" in df else pd.Series(dtype=str)
    return dict(
        n=len(pts),
        mape=err.mean() if len(pts) else None,
        max=err.max() if len(pts) else None,
        worst=worst,
        apart={r: apart[r] for r in ROLES if r in apart},
        slow=int(slow.sum()),
        noisy=int(noisy.sum()),
        not_ok=status[status != "ok"].value_counts().to_dict(),
    )


def apart(s: dict) -> str:
    """The compared points no verdict reads, per role: '1 fitted (mean |error| 0.2%), ...'."""
    return ", ".join(f"{n} {role} (mean |error| {m:.2f}%)" for role, (n, m) in s["apart"].items())


def limits_missed(df: pd.DataFrame, limits: dict | None, column: str = "error_pct") -> list[str]:
    """The sheet's stated limits (STATED_LIMITS) that the judged rows break: 'peak memory (MiB) worst
    64.8% > 10%'. With `column` another error column (the prediction without fitted terms), every
    compared row is read, as none of them carries a fitted term."""
    if not limits:
        return []
    rows = judged(df) if column == "error_pct" else compared(df.assign(error_pct=df[column]))
    if "slow_spell" in rows:
        rows = rows[~rows.slow_spell.eq(True)]
    missed = []
    for series, limit in limits.get("series", {}).items():
        sub = rows if series is None else rows[rows.get("series", pd.Series(index=rows.index)).eq(series)]
        worst = sub[column].astype(float).abs().max() if len(sub) else None
        if worst is not None and worst > limit:
            missed.append(f"{series or 'every row'} worst {worst:.1f}% > {limit:g}%")
    return missed


def verdict(s: dict, tolerance: float, missed: list[str] | None = None) -> str:
    """One line over the judged points: reproduced (every one within tolerance), mostly (the mean
    within, and every limit the sheet states held: `missed` lists those broken), or not; the points
    of other roles named apart, never counted."""
    extra = ""
    if s["not_ok"]:
        extra = "; rows not ok: " + ", ".join(f"{n} {k}" for k, n in s["not_ok"].items())
    if s["apart"]:
        extra = f"; not judged: {apart(s)}{extra}"
    if s.get("slow"):
        extra = f"; set aside: {s['slow']} judged row(s) with every run in a slow spell of the host{extra}"
    if s.get("noisy"):
        extra = f"; judged though noisy: {s['noisy']} row(s) whose runs spread past the tolerance{extra}"
    if not s["n"]:
        return f"No judged numbers to compare against: ours only{extra}."
    line = f"{s['n']} judged points, mean |error| {s['mape']:.2f}%, worst {s['max']:.2f}% ({s['worst']})"
    if s["max"] <= tolerance:
        return f"**Reproduced**: every judged point within ±{tolerance:g}% — {line}{extra}."
    if s["mape"] <= tolerance and not missed:
        return f"**Mostly reproduced**: mean within ±{tolerance:g}%, not every point — {line}{extra}."
    broken = f"; the sheet's stated limits missed: {', '.join(missed)}" if missed else ""
    return f"**Not reproduced** within ±{tolerance:g}%{broken} — {line}{extra}."


def without_fitted(name: str, sheet: dict, df: pd.DataFrame) -> str:
    """The verdict again on the predictions without the fitted terms (`error_without_fitted_pct`),
    where every compared row is judged: what the model says with nothing fitted on runs like these."""
    if "error_without_fitted_pct" not in df or not df.error_without_fitted_pct.notna().any():
        return ""
    bare = df.assign(error_pct=df.error_without_fitted_pct, role=JUDGED)
    bare = bare[bare.error_pct.notna()]
    limits = sheet.get("limits") or STATED_LIMITS.get(name)
    line = verdict(stats(bare, name), sheet["tolerance_pct"], limits_missed(bare, limits))
    parts = []
    for series, sub in bare.groupby("series" if "series" in bare else "kind"):
        err = sub.error_pct.astype(float).abs()
        parts.append(f"{series}: {len(err)} rows, mean {err.mean():.1f}%, worst {err.max():.1f}%")
    return f"**Without fitted terms** ({'; '.join(parts)}): {line}"


def section(name: str, sheet: dict, df: pd.DataFrame) -> tuple[str, str]:
    """(markdown section, summary-table line) of one artifact. Measured rows whose runs spread past the
    tolerance are judged, and named as noisy (noisy_rows.py)."""
    df = mark_noisy(df, sheet["tolerance_pct"])
    sources = sorted({str(v) for v in df.source.dropna().unique()}) if "source" in df else []
    s = stats(df, f"results/{name}.csv")
    line = verdict(s, sheet["tolerance_pct"], limits_missed(df, sheet.get("limits") or STATED_LIMITS.get(name)))
    shown = _condense_loss(df) if "layout" in df else df
    if "kind" in shown:  # capacity: the per-stage summary first
        shown = pd.concat([shown[shown.kind != "trial"], shown[shown.kind == "trial"]])
    if sheet["table"] in SEEN:  # what the run saw, in words, whichever way it went
        said = f"**Seen.** {SEEN[sheet['table']](df)}\n\n**Verdict.** {line}"
    else:
        said = f"**Verdict.** {line}"
    if "host_speed_runs" in df:  # a measured comparison: the host's speed beside it, as measured
        said += f" {host_note(df)}"
    if "too_noisy" in df and df.too_noisy.any():
        noisy = df[df.too_noisy]
        said += (f"\n\n**Noisy.** {len(noisy)} measured rows spread more than ±{sheet['tolerance_pct']:g}% across "
                 f"their runs (up to {noisy.runs_spread_pct.max():.0f}%): judged all the same, so which of their "
                 "runs a reproduction gets can move the verdict (noisy_rows.py).")  # fmt: skip
    outside = compared(df)
    outside = outside[(outside.role != JUDGED) & (outside.error_pct.astype(float).abs() > sheet["tolerance_pct"])]
    if len(outside):  # the sheet's claim may name them (fig3: "total TFLOPS"): their misses said, not hidden
        said += (
            f"\n\n**Outside ±{sheet['tolerance_pct']:g}% among the rows not judged:** "
            + ", ".join(f"{r.key} ({r.role}) {float(r.error_pct):+.2f}%" for r in outside.itertuples())
            + "."
        )
    bare = without_fitted(name, sheet, df)
    if bare:
        said += f"\n\n{bare}"
    if band_counts(df):
        said += f"\n\n{band_counts(df)}"
    if "fitted_by" in df and df.fitted_by.notna().any():  # what the verdict would read without the labels
        every = verdict(stats(df.assign(role=df.role.replace("fitted", JUDGED)), name), sheet["tolerance_pct"])
        said += f"\n\n**Counting its fitted rows as judged** (what the labels set apart): {every}"
    text = "\n\n".join([
        f"## {sheet['title']}",
        f"**Paper.** {sheet['paper']}",
        f"**Claim checked.** {sheet['claim']}",
        f"**Source:** {', '.join(sources) or '-'} · table `results/{name}.csv` · figure `figures/{name}.png`",
        f"![{name}](../figures/{name}.png)",
        _markdown(shown),
        said,
    ])  # fmt: skip
    mape = "" if s["mape"] is None else f"{s['mape']:.2f}"
    worst = "" if s["max"] is None else f"{s['max']:.2f}"
    not_judged = ", ".join(f"{n} {role}" for role, (n, _) in s["apart"].items())
    summary = f"| [{name}](#{_anchor(sheet['title'])}) | {', '.join(sources)} | {s['n']} | {mape} | {worst} | "
    summary += f"{inside_of(df)} | {not_judged} | " + line.split(":")[0].split(" within")[0].strip("*") + " |"
    return text, summary


def _anchor(title: str) -> str:
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return keep.replace(" ", "-")


def peers_section(csv_path: str) -> str:
    """The side-by-side comparison with DDP, ZeroRedundancyOptimizer, FSDP2 and DeepSpeed."""

    return "\n\n".join([
        "## Side by side: DDP, ZeroRedundancyOptimizer, FSDP2, DeepSpeed",
        "**Claim checked.** At each ZeRO stage, this engine's step time and memory beside DDP, "
        "ZeroRedundancyOptimizer, FSDP2 and DeepSpeed at the same stage, and the same losses (same weights, data, "
        "batch, precision and world size), measured on one CPU host (the setup below): what that host shows, "
        "not how the systems compare on GPUs or at scale.",
        f"**Source:** measured · table `{csv_path}` · figure `figures/peers.png`",
        "![peers](../figures/peers.png)",
        peers_markdown(csv_path),
    ])  # fmt: skip


def write_report(
    sheets: list[str],
    tables: list[str],
    out: str,
    peers: str | None = None,
    claims: str | None = None,
    plans: tuple[str, list[str], str | None] | None = None,
) -> None:
    """REPORT.md from the workflow sheets and the tables named like them (results/<sheet>.csv), the
    peers comparison and the paper's claims ledger (artifacts/claims/claims.py) when their CSVs are given,
    and the plan section (artifacts/report/plan_section.py) from `plans`: (the plan requests' sheet, their
    CSVs, the validation CSV or None)."""
    by_name = {Path(t).stem: t for t in tables}
    sections, summary, read = [], [], {}
    for path in sheets:
        name = Path(path).stem
        if name not in by_name:
            raise ValueError(f"report: no table for sheet {name!r} among {sorted(by_name)}")
        sheet = yaml.safe_load(Path(path).read_text())
        read[name] = pd.read_csv(by_name[name])
        text, line = section(name, sheet, read[name])
        sections.append(text)
        summary.append(line)
    if peers:
        sections.append(peers_section(peers))
    if plans:
        sections.append(plan_section(*plans))
    gpu = gpu_section(Path(out).parent)  # measured on one H200 (results/gpu/h200), when it is there
    if gpu:
        sections.append(gpu)
    if claims:  # after the held-out error, before the artifacts
        sections.insert(0, claims_section(claims))
    heldout = heldout_section(Path(out).parent)  # the model's held-out error: first, as the headline
    if heldout:
        sections.insert(0, heldout)
    head = [
        "# Reproduction report: ZeRO (Rajbhandari et al., SC20)",
        "Generated by the workflow (`snakemake`; see README, *Reproducing the paper*). Every number of ours "
        "says where it comes from: **measured** (real steps of this engine, here on CPU with gloo), **traced** "
        "(this engine under FakeTensorMode at paper scale) or **modelled** (the calibrated performance model, "
        "docs/perfmodel.md). The paper's numbers are references only. `error %` = 100·(ours − reference)/"
        "reference, against the paper where it has the number, else against the paper's formula at our scale "
        "(`expected`). Each row has a `role`; a verdict, its points, mean and worst read the **judged** rows "
        "alone. The others are counted apart and cannot move a verdict: "
        + "; ".join(f"**{role}**: {text}" for role, text in ROLES.items() if role != JUDGED)
        + ".",
        "| artifact | source | judged points | mean abs error % | worst % | inside band | not judged | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    table = "\n".join(head[2:] + summary) + "\n\n" + headline(read) + "\n\n" + capped(read)
    blind = blind_section(Path(out).parent, read)  # the paper judged blind: the headline, first
    text = "\n\n".join([*head[:2], *([blind] if blind else []), table, *sections]) + "\n"
    Path(out).write_text(text)


# the artifacts whose rows are the paper's own runs, each at the micro-batch its AE table lists (`today`
# runs the paper's layouts on other GPUs at the largest batch under a bound of its own)
PAPER_RUNS = ("table2", "fig2", "fig3", "fig5", "fig6", "fig7", "fig8")


def capped(tables: dict[str, pd.DataFrame]) -> str:
    """REPORT's count of the paper's runs (all of which trained) that the memory model scores at a
    smaller micro-batch than the paper listed, each with what the listed batch needs (`capped_by`)."""
    rows = [
        f"{name} {r.key} (micro-batch {int(r.micro_batch)}; {r.capped_by})"
        for name, df in tables.items()
        if name in PAPER_RUNS and "capped_by" in df
        for r in df[df.capped_by.notna()].itertuples()
    ]
    listed = ": " + "; ".join(rows) if rows else ""
    return (f"**Trained runs the memory model calls out of memory at the paper's batch**: {len(rows)} paper "
            f"run(s), each scored at the largest micro-batch that fits{listed}; the published runs of the "
            "holdout: below, under *Out of memory, says the model*.")  # fmt: skip
