"""The comparison read back from results/peers.csv: a markdown table for results/REPORT.md and
figures/peers.png (step time and peak memory per ZeRO stage, ours beside each peer). On one device
(world size 1: `zerobench peers --device cuda`) the table gives TFLOPS, MFU and peak allocated
device memory in place of the floors and bounds, which a world of one does not have. Imports no
torch, so the report step stays light."""

from __future__ import annotations

import json

GiB = 2**30
FLOOR = "floor"  # one rank alone, no communication
FLOOR_CONCURRENT = "floor-concurrent"  # dp such ranks at once, each alone
FLOORS = (FLOOR, FLOOR_CONCURRENT)
BOUND = "bound"  # per stage: the floor plus our collectives at that stage with no compute (runner.py)
_FLOOR_LINES = {  # line style and legend in the figure
    FLOOR: ("--", "floor: one rank, no comm."),
    FLOOR_CONCURRENT: (":", "floor: dp ranks at once, no comm."),
}


def _load(csv_path):
    import pandas as pd

    return pd.read_csv(csv_path)


def _fmt(x, spec: str, dash: str = "—") -> str:
    return dash if x is None or x != x else format(x, spec)  # x != x: NaN


def _one_device(df) -> bool:
    """Rows of a world of one (no floors, no bounds): the single-device table."""
    return "world_size" in df and bool((df["world_size"] == 1).all())


def _cuda(df) -> bool:
    return "device" in df and bool((df["device"] == "cuda").any())


def _memory(df) -> tuple[str, str, str]:
    """(column, its heading, the ratio ours / peer of it): peak allocated device memory on CUDA,
    peak RSS per rank otherwise."""
    if _cuda(df):
        return "peak_allocated_bytes", "peak allocated (GiB)", "allocated_ratio_ours_over"
    return "peak_rss_bytes", "peak RSS/rank (GiB)", "rss_ratio_ours_over"


def _sorted(df):
    return df.sort_values(["stage", "family"], key=_order, na_position="first")


def peers_markdown(csv_path) -> str:
    """One line per implementation, grouped by ZeRO stage (its bound first), after the floors:
    median step time [min–max], its ratios to the floors and to its stage's bound, peak RSS per
    rank, collective bytes per step, the loss agreement with ours and the ratios ours / peer.
    On one device: `device_markdown`."""
    df = _load(csv_path)
    if df.empty:
        return "_no peer rows_\n"
    if _one_device(df):
        return device_markdown(df)
    peers = df[~df["family"].isin((*FLOORS, BOUND))]
    first = (peers if not peers.empty else df).iloc[0]
    head = (
        f"Measured on one machine, one implementation at a time: `{first['model']}` "
        f"({first['num_params'] / 1e6:.1f}M parameters), dp = {first['dp']}, {first['precision']}, "
        f"global batch {first['global_batch']}, {first['threads_per_rank']} thread per rank, median of "
        f"{first['steps']} steps after {first['warmup']} warm-up, {_clipping(first)}{_rounds(first)}. The floor is "
        f"one rank at the same per-rank batch with no communication (our engine at dp = 1), measured beside each "
        "stage's rows; \"/ floor\" is each step time over its stage's floor. The concurrent floor"
        f" is {first['dp']} such ranks stepping at once, each alone, sharing the "
        f'machine as the ranks of a world do; "/ conc." is each step time over it. A stage\'s bound is its floor '
        f"plus our engine's collectives at that stage (the same ops, message sizes and calls per step, from its "
        f"ledger) issued again with no compute in the same world, timed: on a CPU host compute and gloo share the "
        f'cores, so this is what the machine allows that stage\'s communication to cost; "/ bound" is each step '
        f"time over its stage's bound. Ratios are ours / peer at "
        f"the same stage (< 1: ours faster or smaller). Load average "
        f"(1 min) during the runs: "
        f"{df['loadavg_before'].min():.1f}–{df['loadavg_after'].max():.1f}. {_host_speeds(df)}\n\n"
    )
    lines = [
        "| stage | implementation | version | s/step (median [min–max]) | / floor | / conc. | / bound "
        "| peak RSS/rank (GiB) | comm MB/step | max loss rel. diff vs ours | time ours/peer | RSS ours/peer |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in _sorted(df).iterrows():
        stage = _fmt(r["stage"], ".0f")
        if r["status"] != "ok":
            lines.append(
                f"| {stage} | {r['impl']} | {r['peer_version']} | {r['status']}: {r['error']} | | | | | | | | |"
            )
            continue
        lines.append(
            f"| {stage} | {r['impl']} | {r['peer_version']} "
            f"| {r['step_time_s']:.3f} [{r['step_time_min_s']:.3f}–{r['step_time_max_s']:.3f}] "
            f"| {_fmt(r.get('time_over_floor'), '.2f')} | {_fmt(r.get('time_over_floor_concurrent'), '.2f')} "
            f"| {_fmt(r.get('time_over_bound'), '.2f')} "
            f"| {_fmt(r['peak_rss_bytes'] / GiB, '.2f')} | {_fmt(r['comm_bytes_per_step'] / 1e6, '.1f')} "
            f"| {_fmt(r['loss_max_rel_diff'], '.1e')} | {_fmt(r['time_ratio_ours_over'], '.2f')} "
            f"| {_fmt(r['rss_ratio_ours_over'], '.2f')} |"
        )
    return head + "\n".join(lines) + "\n"


def device_markdown(df) -> str:
    """The single-device table: per implementation, grouped by ZeRO stage, median step time
    [min–max], the warm-up's seconds (a compiled peer's compilation in them), TFLOPS per device,
    MFU, peak memory (allocated on CUDA, RSS on CPU), the loss agreement with ours and the ratios
    ours / peer at the same stage."""
    first = df.iloc[0]
    column, heading, ratio = _memory(df)
    hardware = df["hardware"].dropna() if "hardware" in df else []
    peak = f"the {hardware.iloc[0]} datasheet's dense 16-bit peak" if len(hardware) else "a datasheet peak (none: —)"
    ckpt = "one activation checkpoint per block" if first.get("checkpoint_activations") else "no activation checkpoints"
    memory = (
        "torch.cuda.max_memory_allocated from a reset before the model is built, each implementation in its own process"
        if _cuda(df)
        else "the process's peak RSS"
    )
    head = (
        f"Measured on one {first['device']} device, one implementation at a time, each in its own process: "
        f"`{first['model']}` ({first['num_params'] / 1e6:.1f}M parameters), world size 1, {first['precision']}, "
        f"micro-batch {first['micro_batch']}, {ckpt}, median of {first['steps']} steps after {first['warmup']} "
        f"warm-up (a compiled peer compiles in its warm-up), {_clipping(first)}{_rounds(first)}. TFLOPS per device "
        f"by zerobench/flops.py's convention, MFU over {peak} (zerobench/gpus.py); peak memory: {memory}. Ratios "
        "are ours / peer at the same stage (the plain loop beside ours-0; < 1: ours faster or smaller).\n\n"
    )
    lines = [
        f"| stage | implementation | version | s/step (median [min–max]) | warm-up s | TFLOPS | MFU | {heading} "
        "| max loss rel. diff vs ours | time ours/peer | memory ours/peer |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in _sorted(df).iterrows():
        stage = _fmt(r["stage"], ".0f")
        if r["status"] != "ok":
            lines.append(f"| {stage} | {r['impl']} | {r['peer_version']} | {r['status']}: {r['error']} | | | | | | | |")
            continue
        tflops = _fmt(r["tflops_per_gpu"], ".1f" if r["tflops_per_gpu"] >= 1 else ".2g")  # a CPU's: below one
        lines.append(
            f"| {stage} | {r['impl']} | {r['peer_version']} "
            f"| {r['step_time_s']:.3f} [{r['step_time_min_s']:.3f}–{r['step_time_max_s']:.3f}] "
            f"| {_fmt(r['warmup_time_s'], '.1f')} | {tflops} | {_fmt(r['mfu'], '.2f')} "
            f"| {_fmt(r[column] / GiB, '.2f')} | {_fmt(r['loss_max_rel_diff'], '.1e')} "
            f"| {_fmt(r['time_ratio_ours_over'], '.2f')} | {_fmt(r[ratio], '.2f')} |"
        )
    return head + "\n".join(lines) + "\n"


def _clipping(row) -> str:
    clip = row.get("clip_norm")
    if clip is None or clip != clip:  # a CSV written before the column existed
        return "gradient clipping as configured"
    return f"gradient-norm clipping at {clip:g}" if clip > 0 else "no gradient clipping"


def _rounds(row) -> str:
    rounds = row.get("rounds")
    if rounds is None or rounds != rounds or rounds < 2:  # one round, or a CSV from before rounds
        return ""
    return (
        f"; every row run in {rounds:g} interleaved rounds (the order reversed every other round), each ratio "
        "taken within its round and the median over the rounds shown"
    )


def _order(col):
    if col.name == "family":
        return col.map({FLOOR: -3, FLOOR_CONCURRENT: -2, BOUND: -1, "zerobench": 0, "torch": 1, "deepspeed": 2})
    return col


def plot_peers(csv_path, png_path) -> None:
    """Two panels: median step time (bars, min–max whiskers; each stage's floor a dashed and its
    bound a dash-dotted line over its bars) and peak RSS per rank, per stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = _load(csv_path)
    ok = df[(df["status"] == "ok") & ~df["family"].isin((*FLOORS, BOUND))]
    bounds = df[(df["status"] == "ok") & (df["family"] == BOUND)].set_index("stage")["step_time_s"]
    floors = df[(df["status"] == "ok") & df["family"].isin(FLOORS)]
    stage_floors = floors[floors["family"] == FLOOR].dropna(subset=["stage"]).set_index("stage")["step_time_s"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    colors = {"zerobench": "tab:blue", "torch": "tab:orange", "deepspeed": "tab:green"}
    memory, heading, _ = _memory(df)
    for ax, (col, scale, label) in zip(axes, (("step_time_s", 1.0, "median step time (s)"), (memory, GiB, heading))):
        ticks, names = [], []
        x = 0.0
        if col == "step_time_s":  # a floor of no stage spans the figure; a stage's floor, its bars
            for _, f in floors[floors["stage"].isna()].iterrows():
                style, text = _FLOOR_LINES[f["family"]]
                ax.axhline(f["step_time_s"], color="black", linestyle=style, label=text)
        for stage in sorted(ok["stage"].unique()):
            group = ok[ok["stage"] == stage].sort_values("family", key=_order)
            first_stage = stage == ok["stage"].min()
            lines = (
                (bounds, "-.", "bound: floor + our collectives, no compute"),
                (stage_floors, "--", _FLOOR_LINES[FLOOR][1]),
            )
            for values, style, text in lines if col == "step_time_s" else ():
                if stage in values.index:
                    ax.hlines(
                        values[stage],
                        x - 0.4,
                        x + len(group) - 0.6,
                        colors="black",
                        linestyles=style,
                        label=text if first_stage else None,
                    )
            for _, r in group.iterrows():
                err = None
                if col == "step_time_s":
                    err = [[r["step_time_s"] - r["step_time_min_s"]], [r["step_time_max_s"] - r["step_time_s"]]]
                ax.bar(x, r[col] / scale, color=colors[r["family"]], yerr=err, capsize=2)
                ticks.append(x)
                names.append(r["impl"])
                x += 1
            x += 0.8  # gap between stages
        if col == "step_time_s" and not (floors.empty and bounds.empty):
            ax.legend(loc="upper left", fontsize=8)
        ax.set_xticks(ticks, names, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    first = (ok if not ok.empty else df).iloc[0]
    hardware = first.get("hardware")
    where = "CPU/gloo" if not _cuda(df) else f"one {hardware} GPU" if isinstance(hardware, str) else "one CUDA device"
    fig.suptitle(
        f"zerobench vs peers, measured: {first['model']} ({first['num_params'] / 1e6:.0f}M), dp={first['dp']}, "
        f"{first['precision']}, {where} (blue: ours; orange: torch; green: DeepSpeed; grouped by ZeRO stage 0→3)"
    )
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)


def losses_of(csv_path) -> dict[str, list[float]]:
    """Per-step losses of every implementation that ran."""
    df = _load(csv_path)
    trained = df[(df["status"] == "ok") & (df["family"] != BOUND)]  # a bound trains nothing
    return {r["impl"]: json.loads(r["losses"]) for _, r in trained.iterrows()}


def _host_speeds(df) -> str:
    """The host speed probe's spread over the rows, against the floor's (runtime/probe.py)."""
    speeds = df["host_speed"].dropna() if "host_speed" in df else []
    if len(speeds) == 0:
        return "Host speed: not recorded (no probe in these rows)."
    return (
        f"Host speed beside each row, against the floor's (GEMM and copy probe): {speeds.min():.2f}–{speeds.max():.2f}."
    )
