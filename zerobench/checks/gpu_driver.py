"""The GPU check's driver (scripts/gpu_check.sh): a pre-flight, then each part in a process of its
own, budgeted from one deadline, most important first, and one summary that names every gate.

1. pre-flight, in its first seconds: the device, its profile, torch and CUDA, and any package a part
   needs that is missing; it stops there when a gated part cannot run (no device, a package);
2. the sweep (checks/gpu_check.py; gated);
3. the GPU tests (tests/gpu and the device-clock tests; gated);
4. the emulated ranks (checks/gpu_emulated.py; gated);
5. with time to spare: `zerobench calibrate` of this GPU and the peers at gpt-1.5b (reported).

A part's budget is a share of what the deadline leaves when it starts, capped (`PARTS`): the caps
are the times docs/gpu.md derives from the H200's run, with room; a gated part left less than its
floor is not run, which fails the check (a part that did not run never passes). Each part runs in a
session of its own, killed with its children at its budget (`timeout`). Exits 1 naming each failed
gate (`OUT/summary.txt`); `OUT/parts.json` holds each part's status and seconds.

A rehearsal on a CPU stands a card in for the device (GPU_CHECK_CARD, checks/card.py) and a
command in for each trial's process (GPU_CHECK_CLI, checks/gpu_check.py):
tests/unit/test_gpu_check_rehearsal.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from zerobench.checks.card import CARD_ENV, Card

# package (import name) -> the parts that import it
NEEDS = {"pandas": ("sweep", "emulated"), "pytest": ("tests",), "yaml": ("emulated",), "matplotlib": ("emulated",)}
COPY_BACK_S = 20  # seconds of the deadline kept for the lender to copy OUT back


@dataclass(frozen=True)
class Part:
    name: str
    argv: tuple[str, ...]  # "{budget}" stands for the part's budget in seconds
    share_pct: int  # of what the deadline leaves when the part starts
    cap_s: int  # the most it is given
    floor_s: int  # the least it can do anything in: left less, it is not run
    gated: bool  # its failure (or its not running) fails the check
    grace_s: int = 0  # beyond its budget before it is killed (a part that stops itself at its budget)


def parts(out: Path, py: str = sys.executable) -> list[Part]:
    """The check's parts in the order they run (docs/gpu.md, "Running the check": where each figure
    comes from)."""
    cli = (py, "-m", "zerobench.cli")
    return [
        Part("sweep", (py, "-m", "zerobench.checks.gpu_check", str(out), "--budget-s", "{budget}"), 35, 150, 45,
             True, grace_s=30),
        Part("tests", (py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/gpu", "tests/unit/test_devices.py"),
             50, 200, 60, True),
        Part("emulated", (py, "-m", "zerobench.checks.gpu_emulated", str(out / "emulated"), "--deadline-s",
                          "{budget}"), 100, 600, 60, True, grace_s=30),
        Part("calibrate", (*cli, "calibrate", "--device", "cuda", "--out", str(out / "calibrated-cuda.json")), 100,
             120, 60, False),
        Part("peers", (*cli, "peers", "--model", "gpt-1.5b", "--device", "cuda", "--precision", "bf16",
                       "--checkpoint-activations", "--micro-batch", "16", "--warmup", "1", "--steps", "3", "--out",
                       str(out / "peers" / "gpt-1.5b.csv")), 100, 120, 60, False),
    ]  # fmt: skip


# the device's answers, asked in a child process: no process of the check but the trials' holds a
# CUDA context (the card's plan counts one)
QUERY = ("import json, torch; c = torch.cuda.is_available(); p = c and torch.cuda.get_device_properties(0); "
         "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'gpus': torch.cuda.device_count(), "
         "'name': p.name if c else None, 'total': p.total_memory if c else None}))")  # fmt: skip


def preflight(card_text: str | None) -> tuple[dict, list[str]]:
    """What this machine is (device, profile, memory, torch, CUDA, missing packages) and why a
    gated part could not run here (empty: every part can). A stand-in card (`card_text`) is the
    device of a rehearsal."""
    done = subprocess.run([sys.executable, "-c", QUERY], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"device": None, "profile": None, "torch": None, "cuda": None, "gpus": 0, "missing": []}, [
            f"torch: {(done.stderr.strip().splitlines() or ['no answer'])[-1]}"
        ]
    found = json.loads(done.stdout)
    info = {"torch": found["torch"], "cuda": found["cuda"], "device": None, "profile": None, "gpus": found["gpus"]}
    problems = []
    if card_text:
        card = Card.parse(card_text)
        info["stand_in"] = True
    elif found["name"]:
        card = Card(found["name"], found["total"])
    else:
        card = None
        problems.append("device: no CUDA device is available here")
    if card is not None:
        info.update(device=card.name, profile=card.profile, total_bytes=card.total_bytes)
        os.environ[CARD_ENV] = f"{card.name}={card.total_bytes}"  # the parts' card, asked once
    info["missing"] = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    problems += [f"package {name} is missing (needed by {', '.join(NEEDS[name])})" for name in info["missing"]]
    return info, problems


def _tee(stream, log) -> None:
    for line in stream:
        sys.stdout.write(line)
        log.write(line)
    sys.stdout.flush()


def run_part(part: Part, budget: int, log_path: Path) -> dict:
    """`part` in a session of its own, its output teed into `log_path`, killed with its children
    once `budget` (and its grace) has passed: status passed, failed (exit status), or timeout."""
    argv = [a.replace("{budget}", str(budget)) for a in part.argv]
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        reader = threading.Thread(target=_tee, args=(proc.stdout, log))
        reader.start()
        try:
            rc = proc.wait(timeout=budget + part.grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the part and every trial it started
            proc.wait()
            rc = None
        reader.join()
    seconds = time.monotonic() - start
    lines = log_path.read_text().strip().splitlines()
    last = lines[-1] if lines else "(no output)"
    status = "timeout" if rc is None else "passed" if rc == 0 else "failed"
    return {
        "part": part.name,
        "status": status,
        "rc": rc,
        "budget_s": budget,
        "seconds": round(seconds, 2),
        "last": last,
    }


def budget_of(part: Part, left: float) -> int:
    """A part's seconds: its share of what is left, at most its cap."""
    return int(min(left * part.share_pct / 100, part.cap_s))


def summary(results: list[dict], seconds: float) -> tuple[str, list[str]]:
    """The one line the check ends with, and the gates that failed (named)."""
    failed = [
        f"{r['part']}: {r['status']}"
        + (f" after {r['seconds']:.0f} s of {r['budget_s']} s" if r["status"] == "timeout" else "")
        + f" — {r['last']}"
        for r in results
        if r["gated"] and r["status"] != "passed"
    ]
    if failed:
        return f"gpu_check: FAILED after {seconds:.0f} s — {' | '.join(failed)}", failed
    done = ", ".join(f"{r['part']} {r['status']} in {r['seconds']:.0f} s" for r in results)
    return f"gpu_check: passed in {seconds:.0f} s ({done})", failed


def main(argv: list[str] | None = None, plan: list[Part] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zerobench.checks.gpu_driver", description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the folder whose <device> subfolder gets everything")
    p.add_argument("--deadline-s", type=float, default=460.0, help="seconds from now the check ends by")
    p.add_argument("--card", default=os.environ.get(CARD_ENV), help="NAME=BYTES: a stand-in card (a rehearsal)")
    args = p.parse_args(argv)
    start = time.monotonic()
    deadline = start + args.deadline_s - COPY_BACK_S
    info, problems = preflight(args.card)
    print(
        f"gpu_check: pre-flight in {time.monotonic() - start:.1f} s: device {info['device']}, profile "
        f"{info['profile']}, torch {info['torch']}, CUDA {info['cuda']}, missing packages "
        f"{', '.join(info['missing']) or 'none'}",
        flush=True,
    )
    out = args.out / (info["device"] or "no-device").replace(" ", "-")
    out.mkdir(parents=True, exist_ok=True)
    (out / "versions.txt").write_text(json.dumps(info, indent=1) + "\n")
    if problems:
        line = f"gpu_check: FAILED at pre-flight — {' | '.join(problems)}"
        print(line, flush=True)
        (out / "summary.txt").write_text(line + "\n")
        return 1
    if shutil.which("nvidia-smi"):
        with open(out / "nvidia-smi.txt", "w") as f:
            subprocess.run(["nvidia-smi"], stdout=f, stderr=subprocess.STDOUT, check=False)
    (out / "peers").mkdir(exist_ok=True)
    results = []
    for part in plan if plan is not None else parts(out):
        left = deadline - time.monotonic()
        budget = budget_of(part, left - part.grace_s)
        if budget < part.floor_s:
            r = {
                "part": part.name,
                "status": "not_run",
                "rc": None,
                "budget_s": budget,
                "seconds": 0.0,
                "last": f"{left:.0f} s left, its floor {part.floor_s} s",
            }
            print(f"gpu_check: {part.name}: not run ({r['last']})", flush=True)
        else:
            print(f"gpu_check: {part.name}: {budget} s of {left:.0f} s left", flush=True)
            r = run_part(part, budget, out / f"{part.name}.log")
            print(f"gpu_check: {part.name}: {r['status']} in {r['seconds']:.1f} s", flush=True)
        results.append({**r, "gated": part.gated})
    (out / "parts.json").write_text(json.dumps(results, indent=1) + "\n")
    line, failed = summary(results, time.monotonic() - start)
    if info["gpus"] > 1:  # the node check is a call of its own (docs/gpu.md, "A node of N GPUs")
        print(f"gpu_check: {info['gpus']} GPUs here: run scripts/gpu_node_check.sh {info['gpus']} next", flush=True)
    print(line, flush=True)
    (out / "summary.txt").write_text(line + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
