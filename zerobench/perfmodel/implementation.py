"""How a ZeRO code issues its collectives, as named settings: what the network model prices beside the
bytes (schedule.dp_schedule) and what the host adds (`list_form_host_s`). A modelled record names the
profile it used (`implementation`); `efficient`, this engine, is the default.

- `efficient`: this engine (zero/stage3.py, zero/gather.py, parallel/comms.py). Stage 3 gathers one
  bucket per module, 6 per layer plus the root's, with a flat all-gather into one tensor and a flat
  reduce-scatter per module; no tensor stays whole (`persistence_threshold` 0); nothing waits on the
  host beside the kernels (host_cost.py prices its per-gather bookkeeping as max(device, host)).
- `deepspeed-0.3`: DeepSpeed's stage 3 as released in 2021 (v0.3.16-v0.4, with the PyTorch 1.8 of
  that time), the code behind Megatron-LM 2021's ZeRO-3 comparison (Narayanan et al., SC21, Table 2),
  read from its source:
  - `partition_parameters.py` `_allgather_param`: one all-gather per parameter; a Python loop over the
    world size makes one `narrow` view per rank, and `torch.distributed.all_gather` takes that list;
  - PyTorch 1.8 `ProcessGroupNCCL::allgather` with a list of outputs gathers into a flat buffer and
    copies it out with one `copy_` per rank; `reduce_scatter` with a list of inputs copies each rank's
    chunk into a flat buffer first (one `copy_` per rank). So a gather costs 2 host ops per rank and a
    gradient reduce-scatter 1 (`ops_per_rank`), each at the per-op host cost measured on a GPU host
    (host_cost.HOST_OP_S);
  - `stage3_param_persistence_threshold` default 1e5 elements: smaller parameters (layernorms,
    biases) stay whole and are not gathered; gradients reduce-scattered in `reduce_bucket_size`
    buckets (default 5e8 elements, `reduce_scatter_coalesced`);
  - `fetch_sub_module` waits for each sub-module's gathers before it runs (`sync_per_gather`): the host
    cannot queue ahead, so host work and device time add rather than overlap.
Neither profile hides gathers behind compute (the model's stage 3 as it was, kept, not re-chosen;
perfmodel/choices.py "stage 3 gathers not overlapped").

Sensitivity (`SENSITIVITY`, `variants`): `deepspeed-0.3`'s list-form host work is most of what moves
its six published runs, and rests on a cost per host op borrowed from another machine and on a wait
per gather read from the code. Its plausible range is priced beside the point: the host op at half
and at twice HOST_OP_S, the host work overlapping the device instead of waiting, and the term
removed (the bytes-only profile). The range is an
assumption (no list-form host op of DeepSpeed 2021 on an A100 host was timed), stated as such.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Implementation:
    name: str
    per_parameter: bool  # stage 3 gathers each parameter on its own (False: one bucket per module)
    persistence_threshold: int  # elements: parameters at most this size stay whole on every rank
    reduce_bucket_elems: int  # gradient reduce-scatter bucket, elements (0: one call per gathered unit)
    ops_per_rank: tuple[int, int]  # host ops per rank of one (all-gather, reduce-scatter) call: list form
    sync_per_gather: bool  # the host waits for each gather: its work adds to the device's
    source: str
    op_s_scale: float = 1.0  # the cost per list-form host op, in units of the host's (sensitivity only)


PROFILES = {
    "efficient": Implementation(
        "efficient", per_parameter=False, persistence_threshold=0, reduce_bucket_elems=0, ops_per_rank=(0, 0),
        sync_per_gather=False, source="this engine: zero/stage3.py, zero/gather.py",
    ),
    "deepspeed-0.3": Implementation(
        "deepspeed-0.3", per_parameter=True, persistence_threshold=100_000, reduce_bucket_elems=500_000_000,
        ops_per_rank=(2, 1), sync_per_gather=True,
        source="DeepSpeed v0.3.16-v0.4 partition_parameters.py, stage3.py; PyTorch 1.8 ProcessGroupNCCL",
    ),
}  # fmt: skip
DEFAULT_IMPLEMENTATION = "efficient"


# The plausible range of a profile's fragile terms (assumed: see the module docstring): variant -> changes.
SENSITIVITY = {
    "deepspeed-0.3": {
        "host op x0.5": dict(op_s_scale=0.5),
        "host op x2": dict(op_s_scale=2.0),
        "host work overlaps the device": dict(sync_per_gather=False),
        "no list-form host work": dict(op_s_scale=0.0),
    },
}


def variants(name: str) -> dict[str, Implementation]:
    """The profile `name` at each point of its SENSITIVITY range (none for a profile without one)."""
    impl = get(name)
    return {label: dataclasses.replace(impl, **changes) for label, changes in SENSITIVITY.get(name, {}).items()}


def get(name: str | Implementation) -> Implementation:
    if isinstance(name, Implementation):
        return name
    if name not in PROFILES:
        raise ValueError(f"implementation={name!r}: must be one of {sorted(PROFILES)}")
    return PROFILES[name]


def list_form_host_s(gathers: int, reductions: int, dp: int, impl: Implementation, op_s: float) -> float:
    """Host seconds of a step's list-form collectives: `ops_per_rank` host ops per rank of the DP
    group per call, at `op_s` seconds an op."""
    if dp == 1:
        return 0.0
    per_gather, per_reduction = impl.ops_per_rank
    return (gathers * per_gather + reductions * per_reduction) * dp * op_s * impl.op_s_scale
