"""A stand-in for `python -m zerobench.cli` in the GPU check's rehearsal (GPU_CHECK_CLI): no torch,
no device. Each command answers as the JSON in STAND_IN says ({command: behaviour}, "ok" where
unsaid, and "peaks": {model: bytes at micro-batch 1}):
- ok: a record, its peaks the model's bytes times the micro-batch (traced, run and emulated alike);
- unequal: an ok record whose counted tensor peak is one byte over the trace's;
- exit: status 3 without a record, its last line naming it;
- silent: status 0 without a record;
- sleep: no record, until it is killed."""

import json
import os
import sys
import time
from pathlib import Path


def options(argv: list[str]) -> dict:
    """`--name value` pairs and bare switches (True) of a command line."""
    out, i = {}, 0
    while i < len(argv):
        name = argv[i].removeprefix("--").replace("-", "_")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[name], i = argv[i + 1], i + 2
        else:
            out[name], i = True, i + 1
    return out


def main() -> int:
    command, *rest = sys.argv[1:]
    said = json.loads(os.environ.get("STAND_IN", "{}"))
    behaviour, opts = said.get(command, "ok"), options(rest)
    if behaviour == "exit":
        print(f"stand-in: {command} failed on purpose", file=sys.stderr)
        return 3
    if behaviour == "silent":
        return 0
    if behaviour == "sleep":
        time.sleep(3600)
    peak = float(said.get("peaks", {}).get(opts["model"], 1e9)) * int(opts.get("micro_batch", 1))
    record = {"source": command, "status": "ok", "error": None, "model": opts["model"], "stage": int(opts["stage"]),
              "micro_batch": int(opts.get("micro_batch", 1)), "peak_allocated_bytes": peak,
              "tensor_peak_bytes": peak + (behaviour == "unequal"), "tflops_per_gpu": 1.0}  # fmt: skip
    Path(opts["out"]).write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
