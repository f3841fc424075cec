"""`zerobench` command line: run, trace, model, estimate (one trial or answer each), and table,
plot, report (results/ and figures/ from records). See design.md for the interface."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path

from zerobench.config import (
    ZERO_CONFIGS,
    ConfigError,
    ModelConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainConfig,
    preset,
)

MiB = 2**20


def _model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default="tiny", help="preset name (see `zerobench presets`)")
    for name in ("layers", "hidden", "heads", "seq", "vocab"):
        g.add_argument(f"--{name}", type=int, help=f"override the preset's {name}")


def _parallel_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallel layout and ZeRO")
    g.add_argument("--dp", type=int, default=None, help="data-parallel degree N_d (default 1, or gpus/mp)")
    g.add_argument("--mp", type=int, default=1, help="tensor model-parallel degree N_m")
    g.add_argument("--stage", type=int, default=None, help="ZeRO-DP stage 0-3 (0 = plain DP)")
    g.add_argument("--zero-config", choices=sorted(ZERO_CONFIGS), help="the paper's C1-C5 (sets stage and ZeRO-R)")
    g.add_argument("--bucket-mb", type=float, default=25.0, help="C_B: fused buffer size in MiB")
    g.add_argument("--checkpoint-activations", action="store_true", help="one checkpoint per block")
    g.add_argument("--partition-activations", action="store_true", help="P_a: split checkpoints over MP")
    g.add_argument("--offload-activations", action="store_true", help="P_a+cpu: checkpoints to host")
    g.add_argument("--contiguous-buffers", action="store_true", help="M_D: preallocated contiguous buffers")
    g.add_argument("--prefetch-mb", type=float, default=50.0, help="stage 3: gathered bytes in flight")
    g.add_argument("--max-live-mb", type=float, default=8192.0, help="stage 3: gathered bytes alive at once")
    g.add_argument("--persistence-threshold", type=int, default=0, help="stage 3: keep tensors this small whole")


def _train_args(p: argparse.ArgumentParser, precision: str = "fp32") -> None:
    g = p.add_argument_group("training")
    g.add_argument(
        "--precision", default=precision, help=f"fp32, bf16 or fp16 (16-bit = 2+2+12 bytes/param; default {precision})"
    )
    g.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL)")
    g.add_argument("--micro-batch", type=int, default=1, help="sequences per DP rank per micro-step")
    g.add_argument("--grad-accum", type=int, default=1)
    g.add_argument("--steps", type=int, default=5, help="timed steps")
    g.add_argument("--warmup", type=int, default=1, help="untimed steps before timing")
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument(
        "--clip-norm", type=float, default=TrainConfig.clip_norm, help="global gradient-norm clip; 0 disables it"
    )
    g.add_argument("--seed", type=int, default=1234)


def _hardware_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("hardware")
    g.add_argument(
        "--hardware", default="v100-32gb-dgx2", help="profile: v100-32gb-dgx2, a100-80gb, h100-80gb, h200-141gb"
    )
    g.add_argument("--gpus", type=int, help="total GPUs (sets dp = gpus / mp)")
    g.add_argument("--gpus-per-node", type=int, help="override the profile's node size")


def configs(args) -> tuple[ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig]:
    """Validated configs from parsed arguments; raises ConfigError naming the field."""
    model = preset(args.model).with_overrides(
        layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq, vocab=args.vocab
    )
    dp = args.dp
    gpus = getattr(args, "gpus", None)
    if gpus is not None:
        if args.mp < 1:  # before `gpus % mp` below
            raise ConfigError(f"mp={args.mp}: must be an integer >= 1")
        if gpus < 1 or gpus % args.mp:
            raise ConfigError(f"gpus={gpus}: must be a positive multiple of mp ({args.mp})")
        if dp is not None and dp * args.mp != gpus:
            raise ConfigError(f"dp={dp}: dp × mp must equal gpus ({gpus})")
        dp = gpus // args.mp
    zero = dict(ZERO_CONFIGS[args.zero_config]) if args.zero_config else {}
    if args.stage is not None:
        if zero and zero["stage"] != args.stage:
            raise ConfigError(f"stage={args.stage}: conflicts with zero-config {args.zero_config}")
        zero["stage"] = args.stage
    switches = ("checkpoint_activations", "partition_activations", "offload_activations", "contiguous_buffers")
    for name in switches:
        zero[name] = zero.get(name, False) or getattr(args, name)
    if zero["partition_activations"]:
        zero["checkpoint_activations"] = True  # P_a partitions the checkpoints, so it implies them
    parallel = ParallelConfig(
        dp=1 if dp is None else dp,
        mp=args.mp,
        bucket_bytes=_mib(args.bucket_mb, "bucket_mb"),
        prefetch_bytes=_mib(args.prefetch_mb, "prefetch_mb"),
        max_live_bytes=_mib(args.max_live_mb, "max_live_mb"),
        persistence_threshold=args.persistence_threshold,
        **zero,
    )
    parallel.check_model(model)
    precision = PrecisionConfig(mode=args.precision, device=args.device)
    train = TrainConfig(
        micro_batch=args.micro_batch,
        grad_accum=args.grad_accum,
        steps=args.steps,
        warmup=args.warmup,
        lr=args.lr,
        clip_norm=args.clip_norm,
        seed=args.seed,
    )
    return model, parallel, precision, train


def _mib(value: float, field: str) -> int:
    if not 0 < value * MiB < math.inf:  # in bytes, so a huge finite MiB count is refused too
        raise ConfigError(f"{field}={value!r}: must be a finite number > 0")
    return max(1, int(value * MiB))


def _trial_spec(args):
    from zerobench.run import TrialSpec

    model, parallel, precision, train = configs(args)
    cap = _mib(args.mem_cap_mb, "mem_cap_mb") if args.mem_cap_mb is not None else None
    return TrialSpec(
        model, parallel, precision, train, args.out, args.timeout, data=args.data, mem_cap_bytes=cap,
        resume=args.resume, save=args.save,
    )  # fmt: skip


def cmd_run(args) -> int:
    if args.time_limit:
        configs(args)  # refuse a bad configuration here, without importing torch in this process
        record = _run_with_time_limit(args, args.time_limit)
    else:
        from zerobench.run import run_trial

        record = run_trial(_trial_spec(args))
    _summarise(record)
    return 0 if record["status"] in ("ok", "oom", "infeasible", "timeout") else 1


def _run_with_time_limit(args, limit: float) -> dict:
    """This same command in a child process; past `limit` seconds it is killed with the launcher
    and every rank, and the record says `timeout`."""
    import os
    import signal
    import subprocess

    from zerobench.results import read_record, write_record

    if not args.out:
        raise ConfigError("time_limit: needs --out (the record is written there)")
    child = subprocess.Popen([sys.executable, "-m", "zerobench.cli", *args.argv, "--time-limit", "0"])
    try:
        child.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        for pid in _process_tree(child.pid):  # the launcher starts each rank in a session of its own
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        child.wait()
        error = f"over the time limit of {limit:g} s"
        write_record(_trial_spec(args).base_record("measured", status="timeout", error=error), args.out)
    if not os.path.exists(args.out):
        error = f"exit code {child.returncode}"
        write_record(_trial_spec(args).base_record("measured", status="error", error=error), args.out)
    return read_record(args.out)


def _process_tree(root: int) -> list[int]:
    """`root` and all its descendants, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def _write_infeasible(args, exc: ConfigError) -> None:
    """A layout that cannot run is a result row (status infeasible), not a crash."""
    from zerobench.results import new_record, write_record

    source = {"run": "measured", "trace": "traced", "model": "modelled"}[args.command]
    fields = {k: getattr(args, k) for k in ("model", "dp", "mp", "stage", "precision", "micro_batch")}
    write_record(new_record(source, status="infeasible", error=str(exc), **fields), args.out)


def cmd_table(args) -> int:
    from zerobench.tables import build

    build(args.kind, args.records).to_csv(args.out, index=False)
    return 0


def cmd_plot(args) -> int:
    from zerobench.plots import plot

    plot(args.kind, args.table, args.out, args.title)
    return 0


def cmd_report(args) -> int:
    from zerobench.report import write_report

    write_report(args.sheets, args.tables, args.out, peers=args.peers)
    return 0


def cmd_trace(args) -> int:
    from zerobench.results import write_record
    from zerobench.run import TrialSpec
    from zerobench.trace import trace_record

    model, parallel, precision, train = configs(args)
    record = trace_record(TrialSpec(model, parallel, precision, train, out=args.out))
    if args.out:
        write_record(record, args.out)
    _summarise(record)
    return 0 if record["status"] != "error" else 1


def cmd_model(args) -> int:
    model, parallel, precision, train = configs(args)
    from zerobench.perfmodel import model_record
    from zerobench.results import write_record

    record = model_record(model, parallel, precision, train, args.hardware, args.gpus_per_node)
    if args.out:
        write_record(record, args.out)
    _summarise(record)
    return 0


def cmd_estimate(args) -> int:
    model, parallel, precision, train = configs(args)
    from zerobench.perfmodel import estimate_text

    print(estimate_text(model, parallel, precision, train, args.hardware, args.gpus_per_node))
    return 0


def cmd_presets(args) -> int:
    from zerobench.config import NOMINAL_BILLIONS, PRESETS

    for name, cfg in PRESETS.items():
        nominal = f"{NOMINAL_BILLIONS[name]:g}B" if name in NOMINAL_BILLIONS else "-"
        print(f"{name:18s} L={cfg.layers:<4d} h={cfg.hidden:<5d} heads={cfg.heads:<4d} "
              f"params={cfg.num_params / 1e9:8.3f}B  paper={nominal:6s} {cfg.note}")  # fmt: skip
    return 0


def cmd_peers(args) -> int:
    from zerobench.peers.common import IMPLEMENTATIONS
    from zerobench.peers.runner import run_peers, write_csv
    from zerobench.peers.summary import peers_markdown, plot_peers
    from zerobench.run import TrialSpec

    model, parallel, precision, train = configs(args)
    if precision.mode != "fp32" or precision.device != "cpu":
        raise ConfigError(f"precision={precision.mode}/{precision.device}: the peers compare fp32 on cpu")
    if train.grad_accum != 1:
        raise ConfigError(f"grad_accum={train.grad_accum}: the peers compare one micro-batch per step")
    impls = args.impls.split(",") if args.impls else [
        i for i, (_, stage) in IMPLEMENTATIONS.items() if args.stage is None or stage == args.stage
    ]  # fmt: skip
    unknown = [i for i in impls if i not in IMPLEMENTATIONS]
    if unknown:
        raise ConfigError(f"impls={unknown}: unknown; choose from {list(IMPLEMENTATIONS)}")
    spec = TrialSpec(model, parallel, precision, train, timeout_s=args.timeout)
    rows = run_peers(spec, impls)
    write_csv(rows, args.out)
    if args.figure:
        plot_peers(args.out, args.figure)
    print(peers_markdown(args.out))
    return 0 if all(r["status"] in ("ok", "skipped") for r in rows) else 1


def _summarise(record: dict) -> None:
    keys = (
        *("source", "status", "error", "model", "num_params", "dp", "mp", "stage", "step_time_s"),
        *("tflops_per_gpu", "param_bytes", "grad_bytes", "optimizer_bytes", "peak_rss_bytes", "last_loss"),
    )
    print(json.dumps({k: record.get(k) for k in keys if record.get(k) is not None}, indent=1))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zerobench", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="one measured trial (launches its own ranks, or joins torchrun)")
    for add in (_model_args, _parallel_args, _train_args):
        add(run)
    run.add_argument("--out", help="write the record here (JSON)")
    run.add_argument("--timeout", type=float, default=1800.0, help="seconds a collective (or a step) may wait")
    run.add_argument("--save", metavar="DIR", help="write a sharded checkpoint here after the timed steps")
    run.add_argument("--resume", metavar="DIR", help="load this checkpoint (any dp, stage) and continue from it")
    run.add_argument("--data", default="synthetic", help="synthetic, or a text file / shipped corpus (byte tokens)")
    run.add_argument("--mem-cap-mb", type=float, help="per-rank budget (MiB); exceeding it is status oom")
    run.add_argument("--time-limit", type=float, default=0, help="wall seconds before status timeout (0: none)")
    run.set_defaults(fn=cmd_run)
    trace = sub.add_parser("trace", help="one step of the engine under FakeTensorMode at any scale")
    for add in (_model_args, _parallel_args, _train_args):
        add(trace)
    trace.add_argument("--out", help="write the record here (JSON)")
    trace.set_defaults(fn=cmd_trace)
    for name, fn, text in (
        ("model", cmd_model, "one modelled record from the performance model"),
        ("estimate", cmd_estimate, "does it fit, at what batch, how fast"),
    ):
        s = sub.add_parser(name, help=text)
        _model_args(s)
        _parallel_args(s)
        _train_args(s, precision="fp16")  # the paper's mixed precision on GPUs
        _hardware_args(s)
        if name == "model":
            s.add_argument("--out", help="write the record here (JSON)")
        s.set_defaults(fn=fn)
    sub.add_parser("presets", help="list model presets").set_defaults(fn=cmd_presets)
    peers = sub.add_parser("peers", help="ours vs DDP, ZeroRedundancyOptimizer, FSDP2, DeepSpeed, side by side")
    for add in (_model_args, _parallel_args, _train_args):
        add(peers)
    peers.add_argument("--impls", help="comma-separated implementations (default: all, or those of --stage)")
    peers.add_argument("--out", default="results/peers.csv", help="CSV to write")
    peers.add_argument("--figure", help="PNG to write (step time and peak RSS per stage)")
    peers.add_argument("--timeout", type=float, default=1800.0, help="seconds a collective may wait")
    peers.set_defaults(fn=cmd_peers)
    table = sub.add_parser("table", help="records (or a modelled artifact) -> one artifact's CSV")
    table.add_argument("kind", help="memory, comm, loss, capacity, table1, or a modelled artifact (fig2, ...)")
    table.add_argument("records", nargs="*", help="record JSON files")
    table.add_argument("--out", required=True, help="CSV to write")
    table.set_defaults(fn=cmd_table)
    plot = sub.add_parser("plot", help="an artifact's CSV -> PNG, with the paper's points overlaid")
    plot.add_argument("kind", help="as for `table`")
    plot.add_argument("table", help="the artifact's CSV")
    plot.add_argument("--title", default="")
    plot.add_argument("--out", required=True, help="PNG to write")
    plot.set_defaults(fn=cmd_plot)
    report = sub.add_parser("report", help="REPORT.md: the paper's numbers beside ours, error and verdict")
    report.add_argument("sheets", nargs="+", help="workflow sheets (YAML), one per artifact")
    report.add_argument("--tables", nargs="+", required=True, help="results/<artifact>.csv, as named by the sheets")
    report.add_argument("--peers", help="results/peers.csv: add the side-by-side comparison")
    report.add_argument("--out", required=True)
    report.set_defaults(fn=cmd_report)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return args.fn(args)
    except ConfigError as exc:
        print(f"zerobench {args.command}: invalid configuration: {exc}", file=sys.stderr)
        if args.command in ("run", "trace", "model") and args.out:
            _write_infeasible(args, exc)
            return 0
        return 2


if __name__ == "__main__":
    sys.exit(main())
