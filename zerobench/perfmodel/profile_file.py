"""A hardware profile as a JSON file: what `zerobench calibrate` writes and `model`, `estimate`
and the workflow read (`--hardware PATH` or `--hardware NAME` for PROFILE_DIR/NAME.json).

The file holds the profile's fields under "profile" and the raw microbenchmark samples under
"samples" (kept for the record, not read back). Loading validates every field once and names the
field it refuses; a partial file (a required field missing) is refused, never filled in.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

from zerobench.perfmodel.hardware_profile import HardwareProfile
from zerobench.trial.errors import InputError

FORMAT = "zerobench-hardware-profile/2"  # /2: Adam and clip by size, in the kernel table
OPS = ("all_reduce", "reduce_scatter", "all_gather")
# Rates and sizes that must be finite and > 0 in every profile (datasheet or measured).
_POSITIVE = ("peak_flops", "memory_bytes", "hbm_bw", "intra_bw", "nic_bw", "host_bw")
# What a measured profile must carry beside them: the model's terms read these instead of
# datasheet peaks times fitted efficiencies.
_MEASURED = (
    "gemm_table",
    "kernel_table",
    "op_overhead_s",
    "ops_per_layer",
    "ops_fixed",
    "runtime_bytes",
    "checkpoint_runtime_bytes",
    "concurrency_slowdown",
)

KERNELS = ("layernorm", "gelu", "residual_add", "cross_entropy", "vocab_cross_entropy", "softmax", "attention",
           "copy", "embedding", "adam", "clip")  # fmt: skip


# The project's own profiles (an editable install or a checkout): found by name from any folder.
PROJECT_PROFILES = Path(__file__).resolve().parents[2] / "results" / "profiles"


def profile_dir() -> Path:
    """Where `zerobench calibrate --out NAME` writes: $ZEROBENCH_PROFILES, else results/profiles here."""
    return Path(os.environ.get("ZEROBENCH_PROFILES", "results/profiles"))


def search_dirs() -> tuple[Path, ...]:
    """Where a profile is found by name, first match wins: `profile_dir()` (a workflow's own folder),
    then the project's committed profiles, so a name works from any working directory."""
    if "ZEROBENCH_PROFILES" in os.environ:
        return (profile_dir(),)
    return (profile_dir(), PROJECT_PROFILES)


def find(name: str) -> Path | None:
    """The file of a calibrated profile given as a path or as a name in `search_dirs()`."""
    for path in (Path(name), *(folder / f"{name}.json" for folder in search_dirs())):
        if path.suffix == ".json" and path.is_file():
            return path
    return None


def to_dict(profile: HardwareProfile) -> dict:
    d = dataclasses.asdict(profile)
    for name in (
        "gemm_table",
        "collectives",
        "collective_table",
        "sync_table",
        "mp_sync_table",
        "kernel_table",
        "host_probe",
    ):
        d[name] = [list(row) for row in getattr(profile, name)]  # JSON rows: lists, not tuples
    return d


def _number(field: str, value, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(f"{field}={value!r}: must be a finite number")
    if positive and value <= 0:
        raise InputError(f"{field}={value!r}: must be > 0")
    return value


def _rows(field: str, value, width: int, check) -> tuple:
    if not isinstance(value, list | tuple):
        raise InputError(f"{field}={value!r}: must be a list of {width}-element rows")
    rows = []
    for i, row in enumerate(value):
        if not isinstance(row, list | tuple) or len(row) != width:
            raise InputError(f"{field}[{i}]={row!r}: must have {width} elements")
        rows.append(tuple(check(f"{field}[{i}]", row)))
    return tuple(rows)


def _gemm_row(where: str, row) -> list:
    m, n, k, fwd, bwd = row
    for name, v in zip("mnk", (m, n, k), strict=True):
        if not isinstance(v, int) or v < 1:
            raise InputError(f"{where}.{name}={v!r}: must be an integer >= 1")
    return [m, n, k, _number(f"{where}.forward_flops_per_s", fwd), _number(f"{where}.backward_flops_per_s", bwd)]


def _kernel_row(where: str, row) -> list:
    name, size, fwd, bwd = row
    if name not in KERNELS:
        raise InputError(f"{where}.kernel={name!r}: must be one of {KERNELS}")
    return [
        name,
        _number(f"{where}.size", size),
        _number(f"{where}.forward_s", fwd),
        _number(f"{where}.backward_s", bwd, positive=False),
    ]


def _probe_row(where: str, row) -> list:
    n, size, gemm, copy = row
    for name, v in (("gemm_n", n), ("copy_bytes", size)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise InputError(f"{where}.{name}={v!r}: must be an integer >= 1")
    return [n, size, _number(f"{where}.gemm_flops_per_s", gemm), _number(f"{where}.copy_bytes_per_s", copy)]


def _group(where: str, op: str, size) -> None:
    """A collective's op and group size, checked (every collective row names both)."""
    if op not in OPS:
        raise InputError(f"{where}.op={op!r}: must be one of {OPS}")
    if not isinstance(size, int) or size < 2:
        raise InputError(f"{where}.size={size!r}: must be an integer >= 2")


def _collective_row(where: str, row) -> list:
    op, size, alpha, bw = row
    _group(where, op, size)
    return [op, size, _number(f"{where}.alpha_s", alpha, positive=False), _number(f"{where}.bytes_per_s", bw)]


def _curve_row(where: str, row) -> list:
    op, size, volume, seconds = row
    _group(where, op, size)
    return [op, size, _number(f"{where}.volume_bytes", volume), _number(f"{where}.seconds", seconds)]


def _sync_row(where: str, row) -> list:
    size, compute, wait = row
    _group(where, "all_reduce", size)  # the sync benchmark's collective
    if _number(f"{where}.wait_s", wait, positive=False) < 0:
        raise InputError(f"{where}.wait_s={wait!r}: must be >= 0 (a rank waits no time or some)")
    return [size, _number(f"{where}.compute_s", compute), wait]


def from_dict(d: dict) -> HardwareProfile:
    """A validated profile; InputError names the first field that is missing or wrong."""
    if not isinstance(d, dict):
        raise InputError(f"profile={d!r}: must be a JSON object")
    fields = {f.name: f for f in dataclasses.fields(HardwareProfile)}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise InputError(f"{unknown[0]}: unknown profile field; expected some of {sorted(fields)}")
    required = [n for n, f in fields.items() if f.default is dataclasses.MISSING]
    if d.get("measured"):
        required += list(_MEASURED)
    for name in required:
        if name not in d:
            raise InputError(f"{name}: missing from the profile")
    for name in ("name", "gpu"):
        if not isinstance(d[name], str) or not d[name]:
            raise InputError(f"{name}={d[name]!r}: must be a non-empty string")
    v = dict(d)
    for name in _POSITIVE:
        v[name] = _number(name, d[name])
    for name in ("gpus_per_node", "nics_per_node", "tensor_core_align"):
        if name in d and (not isinstance(d[name], int) or isinstance(d[name], bool) or d[name] < 1):
            raise InputError(f"{name}={d[name]!r}: must be an integer >= 1")
    for name in ("intra_latency", "inter_latency"):
        if name in d:
            v[name] = _number(name, d[name], positive=False)
    for name in ("reserve_bytes", "fragmentation_bytes"):
        if d.get(name) is not None:
            v[name] = _number(name, d[name], positive=False)
            if v[name] < 0:
                raise InputError(f"{name}={d[name]!r}: must be >= 0")
    for name in ("measured", "ranks_share_compute"):
        if name in d and not isinstance(d[name], bool):
            raise InputError(f"{name}={d[name]!r}: must be true or false")
    v["gemm_table"] = _rows("gemm_table", d.get("gemm_table", []), 5, _gemm_row)
    v["collectives"] = _rows("collectives", d.get("collectives", []), 4, _collective_row)
    v["collective_table"] = _rows("collective_table", d.get("collective_table", []), 4, _curve_row)
    v["sync_table"] = _rows("sync_table", d.get("sync_table", []), 3, _sync_row)
    v["mp_sync_table"] = _rows("mp_sync_table", d.get("mp_sync_table", []), 3, _sync_row)
    timed = {(row[0], row[1]) for row in v["collective_table"]}
    for op, size, *_ in v["collectives"]:
        if (op, size) not in timed:
            raise InputError(f"collective_table: no row of {op} over {size} ranks; its measured curve is read")
    v["kernel_table"] = _rows("kernel_table", d.get("kernel_table", []), 4, _kernel_row)
    v["host_probe"] = _rows("host_probe", d.get("host_probe", []), 4, _probe_row)
    if d.get("measured"):
        if not v["gemm_table"]:
            raise InputError("gemm_table=[]: a measured profile needs at least one row")
        missing = sorted(set(KERNELS) - {row[0] for row in v["kernel_table"]})
        if missing:
            raise InputError(f"kernel_table: no row of kernel {missing[0]!r}; a measured profile times {KERNELS}")
        for name in ("op_overhead_s", "runtime_bytes", "checkpoint_runtime_bytes"):
            v[name] = _number(name, d[name], positive=False)
            if v[name] < 0:
                raise InputError(f"{name}={d[name]!r}: must be >= 0")
        if _number("concurrency_slowdown", d["concurrency_slowdown"]) < 1:
            raise InputError(f"concurrency_slowdown={d['concurrency_slowdown']!r}: must be >= 1")
        for name in ("ops_per_layer", "ops_fixed"):
            if not isinstance(d[name], int) or isinstance(d[name], bool) or d[name] < 0:
                raise InputError(f"{name}={d[name]!r}: must be an integer >= 0")
    return HardwareProfile(**v)


def load(path: str | Path) -> HardwareProfile:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"hardware={str(path)!r}: cannot read the profile ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f"format: {str(path)!r} is not a {FORMAT} file (run `zerobench calibrate` to write one)")
    if "profile" not in doc:
        raise InputError(f"profile: missing from {str(path)!r}")
    return from_dict(doc["profile"])


def save(profile: HardwareProfile, path: str | Path, samples: dict | None = None) -> Path:
    """Write the profile (validated by reading it back first) and its raw samples."""
    from_dict(to_dict(profile))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")  # nothing half-written is left at `path`
    tmp.write_text(json.dumps({"format": FORMAT, "profile": to_dict(profile), "samples": samples or {}}, indent=1))
    tmp.replace(path)
    return path
