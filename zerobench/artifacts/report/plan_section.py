"""REPORT.md's section on planning: each plan request of workflows/config/plans.yaml (its top layouts,
modelled and traced; where the published layout it names ranks) and the plan against the published
runs with complete layouts (results/plan_validation.csv, fitting/plan_validation.py). Reads the CSVs
only; no torch import."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

TOP = 3  # layouts shown per request; the CSV has every one
SWITCHES = ("checkpoint_activations", "partition_activations", "offload_activations", "contiguous_buffers")


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f}"


def _basis(text: str) -> str:
    """`regime` or `pooled`: the first word of a row's `band_basis`."""
    return text.split(" ")[0]


def _tied(df: pd.DataFrame) -> pd.Series:
    return df["tied"].astype(str).str.lower() == "true"


def _rows(df: pd.DataFrame) -> list[str]:
    lines = [
        "| rank | group | layout | tokens/s | TFLOPS/GPU | memory / usable GB | headroom % | band ±% | checked |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r, tied in zip(df.itertuples(), _tied(df)):
        lines.append(
            f"| {r.rank:g} | {'tied' if tied else ''} | {r.layout} | {r.tokens_per_s:.4g} | {r.tflops_per_gpu:.1f} | "
            f"{_gb(r.memory_bytes)} / {_gb(r.usable_bytes)} | {r.headroom_pct:.1f} | {r.band_pct:g} "
            f"({_basis(r.band_basis)}) | {r.checked} |"
        )
    return lines


def published(df: pd.DataFrame, layout: dict) -> pd.DataFrame:
    """The plan's rows of a published layout (its stage, MP, micro-batch and the switches it names;
    a switch it does not name is off), best first."""
    named = {
        **dict.fromkeys(SWITCHES, False),
        "checkpoint_activations": bool(layout.get("partition_activations")),
        **layout,
    }
    mask = pd.Series(True, index=df.index)
    for key, value in named.items():
        mask &= df[key].astype(str).str.lower() == str(value).lower()
    return df[mask & df["rank"].notna()]


def _bands(ranked: pd.DataFrame) -> str:
    """How many ranked layouts carry their regime's band and how many the pooled one."""
    basis = ranked.band_basis.astype(str).map(_basis).value_counts()
    words = {"regime": "their regime's", "pooled": "the pooled"}
    parts = [f"{basis.get(b, 0)} on {words.get(b, b)} band" for b in basis.index]
    return "; ".join(sorted(parts))


def _gap(q, p) -> str:
    """A pick's modelled speed against the published layout, beside the band both carry: a difference
    inside the band is one the model cannot tell from its own error."""
    gain = 100 * (q.tokens_per_s / p.tokens_per_s - 1)
    band = max(float(q.band_pct), float(p.band_pct))
    inside = abs(gain) <= band
    return (
        f"{gain:+.1f}% against the published layout, modelled: {'inside' if inside else 'outside'} the "
        f"±{band:g}% band both carry ({_basis(p.band_basis)}), so "
        + ("the model cannot tell the two apart" if inside else "past the model's error")
    )


def _request(name: str, request: dict, df: pd.DataFrame) -> str:
    ranked = df[df["rank"].notna()]
    checked = ranked[ranked.checked != "modelled"]
    top = (checked if len(checked) else ranked).head(TOP)
    gone = df[df["rank"].isna()]
    group = ranked[_tied(ranked)]
    fastest = group.loc[group.tokens_per_s.idxmax()] if len(group) else None
    tie = (f"{len(group)} layouts ({group['rank'].nunique()} distinct speeds) are **tied** with the top: inside "
           f"±{fastest.band_pct:g}% of the fastest offered ({fastest.layout}), the model's band, so they are ordered "
           "by headroom, most first; a measurement (`--verify emulate`, a run) would break the tie."
           if fastest is not None else "No layout leaves the headroom asked.")  # fmt: skip
    text = [
        f"### {request['title']} (`{name}`: {request['hardware']})",
        f"{len(ranked)} layouts fit ({ranked['rank'].max():g} distinct speeds; bands: {_bands(ranked)}); the top "
        f"{len(top)} {'traced' if len(checked) else 'modelled'}"
        + (f", {len(gone)} dropped by the trace" if len(gone) else "")
        + f". Figure `figures/plan_{name}.png`. {tie}",
        "\n".join(_rows(top)),
    ]
    layout = request.get("paper_layout")
    if layout:
        mine = published(df, layout)
        best = ranked.iloc[0]
        if len(mine):
            p = mine.iloc[0]
            text.append(
                f"**The published layout** ({p.layout}) ranks **{p['rank']:g}** of {ranked['rank'].max():g} "
                f"distinct speeds{' and is in the tied group' if _tied(mine).any() else ''}: {p.tokens_per_s:.4g} "
                f"tokens/s, {p.tflops_per_gpu:.1f} TFLOPS/GPU; the plan's top pick ({best.layout}) is "
                f"{_gap(best, p)}."
            )
        else:
            text.append(f"**The published layout** {layout} is not among the layouts that fit in the model.")
        paper_code = ranked[ranked.stage <= 2]  # the paper's code had no stage 3 (P_os+g+p)
        if len(paper_code) and len(mine):
            q = paper_code.iloc[0]
            verdict = ("**the published layout itself**" if q.layout == p.layout else
                       f"{q.layout} (rank {q['rank']:g}), {_gap(q, p)}")  # fmt: skip
            text.append(f"Among stages 0-2 alone (the paper's code had no P_os+g+p) the top pick is {verdict} "
                        "(C_B's size and M_D move memory, not the model's speed: variants alike).")  # fmt: skip
    return "\n\n".join(text)


def _validation(df: pd.DataFrame) -> str:
    lines = ["| source | runs | in the plan | published rank (median) | published in the top tied group | "
             "top pick faster by (median %, modelled) | its band ±% (median) | top pick = published | "
             "top picks traced, fit | pairs ordered as measured % |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for source, sub in [*df.groupby("source", sort=False), ("all", df)]:
        inside = sub[sub.published_rank.notna()]
        same = (inside.top_gain_pct.abs() < 1e-9).sum()
        picks = sub.drop_duplicates("top_layout")
        traced = picks[picks.top_traced_fits.notna()]
        fits = traced.top_traced_fits.astype(str).str.lower().eq("true").sum()
        pairs = sub.drop_duplicates(["model", "gpus", "global_batch"]).pairs_ordered_pct.dropna()
        ordered = f"{pairs.mean():.0f}" if len(pairs) else "-"
        tied = sub.published_tied.astype(str).str.lower().eq("true").sum()
        lines.append(
            f"| {source} | {len(sub)} | {len(inside)} | {inside.published_rank.median():.0f} | {tied} | "
            f"{inside.top_gain_pct.median():.1f} | {inside.top_band_pct.median():g} | {same} | {len(traced)}, "
            f"{fits} | {ordered} |"
        )
    differs = df[df.top_gain_pct.fillna(0).abs() > 1e-9].differs_in.str.split(", ").explode().value_counts()
    splits = df.split.value_counts()
    fitted_on = sorted(df[df.split == "fit"].hardware.unique())
    notes = df.note.fillna("").value_counts().drop("", errors="ignore")
    return "\n\n".join([
        "### Against published runs with complete layouts",
        f"Each published run (zerobench/data/external_runs.csv, every split: {splits.get('fit', 0)} fit rows, the "
        f"{', '.join(fitted_on)} constants fitted on them (constants.py `per_hardware`), {splits.get('validation', 0)} "
        f"validation and {splits.get('holdout', 0)} holdout rows; the plan fits nothing itself) planned on its "
        "own request (its GPUs, hardware, precision, attention and global batch, its code's memory switches and "
        "collective profile), `results/plan_validation.csv`. Its layout's rank among the plan's distinct speeds, "
        "whether it is in the plan's top tied group (inside the band of the fastest layout that leaves the "
        "headroom), and the plan's top pick (that group's most headroom) against it (modelled tokens/s; the pick "
        "traced for memory, the published layout having trained).",
        "\n".join(lines),
        "Where the top pick differs, what differs (count of runs): "
        + ", ".join(f"{k} {v}" for k, v in differs.items()) + ". Runs not in the plan: "
        + ("; ".join(f"{k} ({v})" for k, v in notes.items()) or "none") + ".",
    ])  # fmt: skip


def plan_section(sheet: str | Path, tables: list[str], validation: str | None) -> str:
    """The section: every request of `sheet` whose CSV (results/plan/<name>.csv) is among `tables`,
    then the validation table where its CSV is given."""
    requests = yaml.safe_load(Path(sheet).read_text())["requests"]
    by_name = {Path(t).stem: t for t in tables}
    parts = ["## Planning: the best layout for a model on N GPUs (`zerobench plan`)",
             "Every layout the engine can express (stage, MP inside a node, micro-batch and accumulation, "
             "checkpointing, P_a, P_a+cpu, M_D, C_B) ranked by the performance model's tokens/s (**modelled**, "
             "each with its band: its regime's where the regime has one, else the pooled band; each request says "
             "how many carry which), its memory by the model's; the top layouts **traced** (the "
             "engine under FakeTensorMode on the target's CUDA semantics) and dropped if their peak is over "
             "the card's usable bytes. docs/plan.md."]  # fmt: skip
    parts += [_request(name, req, pd.read_csv(by_name[name])) for name, req in requests.items() if name in by_name]
    if validation:
        parts.append(_validation(pd.read_csv(validation)))
    return "\n\n".join(parts)
