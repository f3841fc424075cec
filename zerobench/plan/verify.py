"""A plan's top layouts checked by the engine itself, best first, until `top` of them pass:
- `trace`: one step of the engine under FakeTensorMode at the target's scale, on the target's device
  semantics (a GPU profile's ranks are CUDA devices: activations in the storage dtype), its peak
  (training or construction) held against the card's usable bytes; a layout over them is dropped,
  and the rest ranked again. Speed stays modelled.
- `emulate`: one rank of each run for real on this machine's GPU (runtime/emulate.py), its
  caching allocator capped at the target card's usable bytes, its compute measured and its
  collectives priced on the target's cluster (perfmodel/replay.py): the row is re-priced from it.
Each row's `checked` says which. Imports torch: the CLI imports this module when a verify is asked.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

import torch

from zerobench.perfmodel.replay import complete
from zerobench.plan.answer import picks
from zerobench.plan.rank import Layout, headroom_pct, ranked
from zerobench.plan.request import PlanRequest
from zerobench.runtime.emulate import emulate
from zerobench.runtime.trace import trace_record
from zerobench.trial import TrialSpec
from zerobench.trial.errors import InputError

TRACED_ACCUM = 2  # micro-batches a trace runs: the second sees the first's accumulated gradients, as every later one
TRIES = 2  # layouts checked per place in the top, at most, before the check stops


def spec(req: PlanRequest, row: dict, grad_accum: int | None = None) -> TrialSpec:
    """The trial of a plan row on the target's device semantics (req.precision_config names the device)."""
    layout = Layout(**{k: row[k] for k in Layout.__dataclass_fields__})
    if grad_accum is not None:
        layout = dataclasses.replace(layout, grad_accum=grad_accum)
    return TrialSpec(req.model, layout.parallel(), req.precision_config, layout.train())


def traced(req: PlanRequest, row: dict, tracer: Callable = trace_record) -> dict:
    """The row with its traced peak: `traced_peak_bytes` (training or construction, the higher),
    `traced_fits` against the card's usable bytes; memory and headroom are the trace's."""
    record = tracer(spec(req, row, min(row["grad_accum"], TRACED_ACCUM)))
    if record["status"] != "ok":
        return {**row, "checked": "traced", "traced_fits": False, "verify_error": record["error"]}
    peak = max(record["peak_allocated_bytes"], record["build_peak_bytes"])
    return {
        **row,
        "checked": "traced",
        "memory_bytes": peak,
        "headroom_bytes": row["usable_bytes"] - peak,
        "modelled_memory_bytes": row["memory_bytes"],
        "traced_peak_bytes": peak,
        "traced_fits": peak <= row["usable_bytes"],
    }


def emulated(req: PlanRequest, row: dict) -> dict:
    """The row re-priced from one emulated rank on this machine's GPU (see the module's docstring)."""
    record = emulate(dataclasses.replace(spec(req, row), mem_cap_bytes=int(row["usable_bytes"])))
    if record["status"] != "ok":
        return {**row, "checked": "emulated", "emulated_fits": False, "verify_error": record["error"]}
    record = complete(record, req.profile.name)
    peak = max(record["peak_reserved_bytes"], record["build_peak_bytes"])
    return {
        **row,
        "checked": "emulated",
        "modelled_tokens_per_s": row["tokens_per_s"],
        "tokens_per_s": record["tokens_per_s"],
        "tflops_per_gpu": record["tflops_per_gpu"],
        "step_time_s": record["step_time_s"],
        "mfu": record["mfu"],
        "modelled_memory_bytes": row["memory_bytes"],
        "memory_bytes": peak,
        "headroom_bytes": row["usable_bytes"] - peak,
        "emulated_fits": True,
        "emulated_on": torch.cuda.get_device_name(),
    }


def verify(req: PlanRequest, rows: list[dict], how: str, tracer: Callable = trace_record, progress=sys.stderr):
    """(every row, the top checked): the distinct layouts offered as picks, in the plan's order (the
    tied group first), each checked `how` (`trace` or `emulate`) until `req.top` pass (fit, and
    leave `req.headroom` free) or TRIES × top were tried. A layout that fails is dropped from
    the ranking with those alike to it (its rank) that need no less memory and have no more usable
    (its C_B and M_D variants: if it does not fit, neither do they); the others are ranked again, an
    emulated row by its emulated speed."""
    if how not in ("trace", "emulate"):
        raise InputError(f"verify={how!r}: must be trace or emulate")
    if how == "emulate" and not torch.cuda.is_available():
        raise InputError("verify=emulate: needs a local CUDA GPU (one rank of each layout runs on it); "
                          "none here: use --verify trace")  # fmt: skip
    check = (lambda r: traced(req, r, tracer)) if how == "trace" else (lambda r: emulated(req, r))
    done, dropped, passed = {}, {}, set()  # passed: the ranks a checked layout holds
    for _ in range(req.top * TRIES):
        # the best layout left, of a rank none has passed yet: after a failure, a variant of it that
        # needs less memory or has more usable (not dropped) is next
        left = [r for r in rows if r["layout"] not in dropped and r["layout"] not in done and r["rank"] not in passed]
        if len(passed) == req.top or not left:
            break
        candidate = picks(left, 1)[0]
        if not candidate["offered"]:
            break
        row = check({k: v for k, v in candidate.items() if k != "alike"})
        done[row["layout"]] = row
        fits = row.get("traced_fits", row.get("emulated_fits"))
        if fits and headroom_pct(row) >= req.headroom:
            passed.add(candidate["rank"])
        if not fits:
            dropped[row["layout"]] = row
            for alike in rows:
                if (
                    alike["rank"] == row["rank"]
                    and alike["layout"] != row["layout"]
                    and alike["memory_bytes"] >= candidate["memory_bytes"]
                    and alike["usable_bytes"] <= row["usable_bytes"]
                ):
                    dropped[alike["layout"]] = {**alike, "dropped_as_alike_to": row["layout"]}
        if progress is not None:
            said = "does not fit: dropped" if not fits else "fits" if candidate["rank"] in passed else "fits, tight"
            print(f"plan: {how}d {row['layout']}: {said}", file=progress)
    kept = ranked([done.get(r["layout"], r) for r in rows if r["layout"] not in dropped], req.headroom)
    top = [r for r in kept if r["layout"] in done and r["offered"]][: req.top]
    return kept + [{**d, "rank": None} for d in dropped.values()], top
