"""`zerobench` command line: run, trace, model, estimate (one trial or answer each), plan (the
layouts of a model on N GPUs, ranked and checked), and table, plot, report, claims (results/ and
figures/ from records). See docs/design.md for the interface."""

from __future__ import annotations

import argparse
import json
import sys

from zerobench import slow_spells
from zerobench.cli_args import field_args, trial_args
from zerobench.engine.config import NOMINAL_BILLIONS, PRESETS, preset
from zerobench.perfmodel import estimate_text
from zerobench.perfmodel.implementation import DEFAULT_IMPLEMENTATION
from zerobench.plan.answer import heading, picks, table, write_csv
from zerobench.plan.rank import rank
from zerobench.plan.request import PlanRequest
from zerobench.record_files import write_record
from zerobench.runtime import allocator
from zerobench.sources import infeasible, measured, modelled, traced
from zerobench.sweeps.groups import sweep_args
from zerobench.trial import configs
from zerobench.trial.errors import REFUSED, InputError

# the trial fields `zerobench plan` takes: the model, the machine and the model's assumptions
PLAN_FIELDS = ("model", "layers", "hidden", "heads", "seq", "vocab", "gpus", "hardware", "gpus_per_node", "precision",
               "attention", "implementation")  # fmt: skip


def cmd_run(args) -> int:
    record = measured.record(vars(args), args.argv)
    _summarise(record)
    return 0 if record["status"] in ("ok", "oom", "infeasible", "timeout") else 1


def cmd_table(args) -> int:
    from zerobench.artifacts.tables.build import build  # pandas and the artifact modules: not for a trial

    build(args.artifact, args.records, args.sheet, args.profile).to_csv(args.out, index=False)
    return 0


def cmd_plot(args) -> int:
    from zerobench.artifacts.plots.draw import plot  # matplotlib: not for a trial

    plot(args.artifact, args.table, args.out, args.title)
    return 0


def cmd_report(args) -> int:
    from zerobench.artifacts.report.report import write_report  # pandas: not for a trial

    plans = (args.plan_sheet, args.plans, args.plan_validation) if args.plan_sheet else None
    write_report(args.sheets, args.tables, args.out, peers=args.peers, claims=args.claims, plans=plans)
    return 0


def cmd_claims(args) -> int:
    from zerobench.artifacts.claims.claims import build  # pandas: not for a trial

    build(args.tables).to_csv(args.out, index=False)
    return 0


def cmd_trace(args) -> int:
    record = traced.record(vars(args), args.out)
    if args.out:
        write_record(record, args.out)
    _summarise(record)
    return 0 if record["status"] != "error" else 1


def cmd_emulate(args) -> int:
    from zerobench.sources import emulated  # imports torch

    record = emulated.record(vars(args), args.out)
    if args.out:
        write_record(record, args.out)
    _summarise(record)
    return 0 if record["status"] in ("ok", "oom") else 1


def cmd_model(args) -> int:
    record = modelled.record(vars(args))
    if args.out:
        write_record(record, args.out)
    _summarise(record)
    return 0


def cmd_estimate(args) -> int:
    model, parallel, precision, train = configs(vars(args))

    attention = args.attention or "fused"
    print(
        estimate_text(
            model,
            parallel,
            precision,
            train,
            args.hardware,
            args.gpus_per_node,
            attention=attention,
            implementation=args.implementation or DEFAULT_IMPLEMENTATION,
        )
    )
    return 0


def cmd_plan(args) -> int:
    model = preset(args.model).with_overrides(
        layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq, vocab=args.vocab
    )
    req = PlanRequest(
        model,
        args.gpus,
        args.hardware,
        args.precision or "fp16",
        args.global_batch,
        args.top,
        args.attention or "fused",
        args.implementation or DEFAULT_IMPLEMENTATION,
        args.gpus_per_node,
        args.mp,
        args.headroom,
    )
    rows = rank(req)
    top = picks(rows, req.top)
    if args.verify:
        from zerobench.plan.verify import verify  # imports torch

        rows, top = verify(req, rows, args.verify)
    print(table(req, rows, top))
    if args.out:
        write_csv(rows, args.out)
    if args.figure:
        from zerobench.artifacts.plots.plan_frontier import plot_plan  # matplotlib: not for the ranking

        plot_plan(rows, args.figure, heading(req, rows))
    return 0


def cmd_calibrate(args) -> int:
    from zerobench.microbench.machine import main as calibrate  # imports torch

    sizes = tuple(int(n) for n in args.group_sizes.split(","))
    if any(n < 2 for n in sizes):
        raise InputError(f"group_sizes={args.group_sizes!r}: every group size must be >= 2")
    calibrate(args.device, args.out, sizes, args.passes)
    return 0


def cmd_presets(args) -> int:
    for name, cfg in PRESETS.items():
        nominal = f"{NOMINAL_BILLIONS[name]:g}B" if name in NOMINAL_BILLIONS else "-"
        print(
            f"{name:18s} L={cfg.layers:<4d} h={cfg.hidden:<5d} heads={cfg.heads:<4d} "
            f"params={cfg.num_params / 1e9:8.3f}B  paper={nominal:6s} {cfg.note}"
        )
    return 0


def cmd_peers(args) -> int:
    # torch, and DeepSpeed where installed
    from zerobench.peers.runner import peers_trial, run_peers, write_csv
    from zerobench.peers.summary import peers_markdown, plot_peers

    spec, impls = peers_trial(vars(args))
    rows = run_peers(spec, impls, rounds=args.rounds)
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
    trial_args(run, "run")
    run.add_argument("--out", help="write the record here (JSON)")
    run.add_argument("--save", metavar="DIR", help="write a sharded checkpoint here after the timed steps")
    run.add_argument("--resume", metavar="DIR", help="load this checkpoint (any dp, stage) and continue from it")
    run.add_argument("--time-limit", type=float, default=0, help="wall seconds before status timeout (0: none)")
    run.add_argument(
        "--probe-reference",
        metavar="PROFILE",
        help="a calibrated profile: if the host probe read "
        f"beside the trial says it ran more than {slow_spells.SLOW_SPELL * 100:.0f} %% slower than at calibration, "
        "run it once more",
    )
    run.set_defaults(fn=cmd_run)
    trace = sub.add_parser("trace", help="one step of the engine under FakeTensorMode at any scale")
    trial_args(trace, "trace")
    trace.add_argument("--out", help="write the record here (JSON)")
    trace.set_defaults(fn=cmd_trace)
    emulate = sub.add_parser(
        "emulate",
        help="one rank of a dp x mp world of any size on this device: real memory and compute, "
        "collectives priced by the model",
    )
    trial_args(emulate, "emulate")
    emulate.add_argument("--out", help="write the record here (JSON)")
    emulate.set_defaults(fn=cmd_emulate)
    model = sub.add_parser("model", help="one modelled record from the performance model")
    trial_args(model, "model")
    model.add_argument("--out", help="write the record here (JSON)")
    model.set_defaults(fn=cmd_model)
    estimate = sub.add_parser("estimate", help="does it fit, at what batch, how fast")
    trial_args(estimate, "estimate")
    estimate.set_defaults(fn=cmd_estimate)
    plan = sub.add_parser("plan", help="every layout of a model on N GPUs, ranked by the model, the top checked")
    field_args(plan, PLAN_FIELDS, model=True, gpus=True, hardware=True)
    plan.add_argument("--mp", type=int, help="only this MP degree (default: every one dividing the heads and a node)")
    plan.add_argument("--global-batch", type=int, help="sequences per step = micro-batch x dp x grad-accum")
    plan.add_argument("--top", type=int, default=5, help="layouts shown, and checked with --verify")
    plan.add_argument("--headroom", type=float, default=PlanRequest.headroom,
                      help="per cent of the usable bytes a top pick leaves free, at least")  # fmt: skip
    plan.add_argument(
        "--verify",
        choices=("trace", "emulate"),
        help="check the top layouts: traced (any machine) or one rank emulated (a local GPU)",
    )
    plan.add_argument("--out", help="CSV of every layout that fits")
    plan.add_argument("--figure", help="PNG: tokens/s against memory, the frontier and the top marked")
    plan.set_defaults(fn=cmd_plan)
    cal = sub.add_parser("calibrate", help="microbenchmark this machine -> a measured hardware profile")
    cal.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    cal.add_argument("--out", default="calibrated-cpu", help="profile JSON path, or NAME (results/profiles/NAME.json)")
    cal.add_argument("--group-sizes", default="2", help="collective group sizes to measure, comma-separated")
    cal.add_argument("--passes", type=int, help="grid sweeps (default 5; 1: quick, one MP step round)")
    trial_args(cal, "calibrate")
    cal.set_defaults(fn=cmd_calibrate)
    sub.add_parser("presets", help="list model presets").set_defaults(fn=cmd_presets)
    sweep_args(sub.add_parser("sweep", help="a sheet's modelled groups in one process, one record per trial"))
    peers = sub.add_parser(
        "peers", help="ours vs DDP, ZeroRedundancyOptimizer, FSDP2, DeepSpeed (dp > 1) or the plain loop (dp 1)"
    )
    trial_args(peers, "peers")
    peers.add_argument("--impls", help="comma-separated implementations (default: the world size's, or --stage's)")
    peers.add_argument("--rounds", type=int, default=1, help="run every row this many times, interleaved (medians)")
    peers.add_argument("--out", default="results/peers.csv", help="CSV to write")
    peers.add_argument("--figure", help="PNG to write (step time and peak memory per stage)")
    peers.set_defaults(fn=cmd_peers)
    table = sub.add_parser("table", help="records -> one artifact's CSV")
    table.add_argument("artifact", help="its entry in artifacts/tables/registry.py: a sheet's `table` (fig2, ...)")
    table.add_argument("records", nargs="*", help="record JSON files, or directories of them (a modelled group's)")
    table.add_argument("--sheet", help="the artifact's sheet (name or path): joins records to their trials")
    table.add_argument("--profile", help="the calibrated profile (JSON) the artifact's table predicts from")
    table.add_argument("--out", required=True, help="CSV to write")
    table.set_defaults(fn=cmd_table)
    plot = sub.add_parser("plot", help="an artifact's CSV -> PNG, with the paper's points overlaid")
    plot.add_argument("artifact", help="as for `table`")
    plot.add_argument("table", help="the artifact's CSV")
    plot.add_argument("--title", default="")
    plot.add_argument("--out", required=True, help="PNG to write")
    plot.set_defaults(fn=cmd_plot)
    report = sub.add_parser("report", help="REPORT.md: the paper's numbers beside ours, error and verdict")
    report.add_argument("sheets", nargs="+", help="workflow sheets (YAML), one per artifact")
    report.add_argument("--tables", nargs="+", required=True, help="results/<artifact>.csv, as named by the sheets")
    report.add_argument("--peers", help="results/peers.csv: add the side-by-side comparison")
    report.add_argument("--claims", help="results/claims.csv: add the paper's claims ledger")
    report.add_argument("--plan-sheet", help="workflows/config/plans.yaml: add the plan section")
    report.add_argument("--plans", nargs="*", default=[], help="results/plan/<request>.csv, as the plan sheet names")
    report.add_argument("--plan-validation", help="results/plan_validation.csv: the plan against published runs")
    report.add_argument("--out", required=True)
    report.set_defaults(fn=cmd_report)
    claims = sub.add_parser("claims", help="the paper's claims, each read from the artifacts' tables -> a CSV")
    claims.add_argument("tables", nargs="+", help="results/<artifact>.csv; a claim whose table is absent: not testable")
    claims.add_argument("--out", required=True, help="CSV to write (results/claims.csv)")
    claims.set_defaults(fn=cmd_claims)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv is None and args.command in ("run", "calibrate"):  # the process itself, not a caller's
            allocator.use(args.allocator)
        return args.fn(args)
    except REFUSED as exc:
        print(f"zerobench {args.command}: invalid configuration: {exc}", file=sys.stderr)
        if args.command in ("run", "trace", "model") and args.out:
            write_record(infeasible.record(args.command, vars(args), exc), args.out)
            return 0
        return 2


if __name__ == "__main__":
    sys.exit(main())
