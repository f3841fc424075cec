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

The paper's own codes (design.md "Each code priced as itself"; docs/perfmodel.md "The paper's codes"):
their memory is that code's (`memory="code"`: feasibility.code_breakdown's formulas, not this
engine's trace), their gradient copy (`grad_copy`) and their overlaps (`switches`: Calibration fields
the code sets) read from their source, each term cited beside it in PROFILES:
- `megatron-lm-2019`: the paper's baseline, NVIDIA/Megatron-LM at cf2f4d9;
- `pytorch-ddp-2019`: the same code with `--DDP-impl torch` (Fig 8's "PyTorch DDP");
- `deepspeed-zero-2020`: DeepSpeed 0.2 (microsoft/DeepSpeed bbd8cd7) as DeepSpeedExamples
  5426d18 ran Megatron-LM with it (`ds_zero2_config.json`): the paper's ZeRO-100B rows;
- `deepspeed-zero-os-2020`: DeepSpeed 0.1.0's ZeRO-OS (P_os): Table 2's measured P_os.

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
    # whose memory: "engine" (this engine's, engine_memory.py, equal to its trace) or "code" (the
    # code's own formulas, feasibility.code_breakdown)
    memory: str = "engine"
    # the flat copy of the 16-bit gradients the code reduces from (memory="code"): "none",
    # "transient" (built after backward, freed after the reduction) or "resident" (held all step)
    grad_copy: str = "none"
    grad_copy_elems: int = 0  # the copy's elements at most (0: every gradient of the rank)
    switches: tuple[tuple[str, object], ...] = ()  # Calibration fields the code sets (its overlaps)

    def __post_init__(self):
        if self.memory not in ("engine", "code"):
            raise ValueError(f"implementation {self.name}: memory={self.memory!r} must be 'engine' or 'code'")
        if self.grad_copy not in GRAD_COPIES:
            raise ValueError(f"implementation {self.name}: grad_copy={self.grad_copy!r} must be one of {GRAD_COPIES}")

    def calibrated(self, cal):
        """`cal` with this code's own switches (its overlaps, as its source has them)."""
        return cal.replace(**dict(self.switches)) if self.switches else cal


GRAD_COPIES = ("none", "transient", "resident")


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


# Megatron-LM 2019 (cf2f4d9) memory: fp16 parameters and gradients, and FP16_Optimizer's fp32 master
# parameters and Adam moments (fp16/fp16.py `fp32_from_fp16_groups`) -- the paper's 16 bytes; plus an fp32
# gradient per master parameter (fp16util.py `model_grads_to_master_grads`: `master.grad =
# master.data.new(...)`, 4 bytes, resident: feasibility.code_breakdown's buffer at stage 0); activations
# with materialized attention (model/transformer.py: `torch.matmul(query, key^T)` s^2 scores, softmax and
# `attention_dropout` on them, its mask kept) and a checkpoint per layer (`--checkpoint-num-layers` 1).
_MEGATRON_2019 = "NVIDIA/Megatron-LM cf2f4d9: megatron/fp16/fp16util.py, megatron/model/transformer.py"
PROFILES.update({
    # model/distributed.py `allreduce_params`: one `_flatten_dense_tensors` of every fp16 gradient, all-reduced
    # after backward (training.py `backward_step` calls it after `optimizer.backward`; the autograd hooks are
    # commented out), then unflattened: a transient copy of all gradients and no overlap (DDP_impl local, the
    # default in arguments.py).
    "megatron-lm-2019": Implementation(
        "megatron-lm-2019", per_parameter=False, persistence_threshold=0, reduce_bucket_elems=0,
        ops_per_rank=(0, 0), sync_per_gather=False, memory="code", grad_copy="transient",
        switches=(("ddp_overlap", False),),
        source=f"{_MEGATRON_2019}, megatron/model/distributed.py allreduce_params, megatron/training.py",
    ),
    # `--DDP-impl torch` (training.py: torch.nn.parallel.DistributedDataParallel): PyTorch 1.x's Reducer
    # copies each gradient into its bucket's flat `contents` tensor (reducer.cpp `initialize_buckets`: the
    # buckets cover every parameter, held for the model's life) and all-reduces a bucket from the autograd
    # hooks as soon as it is full (`autograd_hook` -> `mark_variable_ready`): resident copy, overlapped.
    "pytorch-ddp-2019": Implementation(
        "pytorch-ddp-2019", per_parameter=False, persistence_threshold=0, reduce_bucket_elems=0,
        ops_per_rank=(0, 0), sync_per_gather=False, memory="code", grad_copy="resident",
        switches=(("ddp_overlap", True),),
        source=f"{_MEGATRON_2019}, --DDP-impl torch; PyTorch 1.x torch/csrc/distributed/c10d/reducer.cpp",
    ),
    # DeepSpeed 0.2 stage 2 (bbd8cd7 deepspeed/pt/deepspeed_zero_optimizer.py): fp16 parameters, fp32 master
    # partition and Adam moments per rank; `step` flattens the rank's averaged gradients into an fp32
    # partition (`single_partition_of_fp32_groups[i].grad`: Calibration.fp32_grad_shard); gradients are
    # reduced from the backward hooks in `reduce_bucket_size` buckets on the current stream
    # (`average_tensor`: the reduction stream only with `overlap_comm`, default False in
    # deepspeed_zero_config.py and unset in DeepSpeedExamples 5426d18 Megatron-LM/scripts/ds_zero2_config.json):
    # not overlapped. Stage 1 of that code (zero_optimizer_stage1.py `reduce_scatter_gradients`) flattens
    # every gradient into sub-partitions to reduce-scatter them (`flatten_dense_tensors_sub_partition_aligned`):
    # a transient copy; stage 2 reduces bucket by bucket with no such copy.
    "deepspeed-zero-2020": Implementation(
        "deepspeed-zero-2020", per_parameter=False, persistence_threshold=0, reduce_bucket_elems=0,
        ops_per_rank=(0, 0), sync_per_gather=False, memory="code", grad_copy="transient",
        switches=(("overlap_grad_reduce", False), ("zero_os_stage1", False), ("fp32_grad_shard", 1.0)),
        source="microsoft/DeepSpeed bbd8cd7: deepspeed/pt/deepspeed_zero_optimizer.py, zero_optimizer_stage1.py, "
        "deepspeed_zero_config.py; DeepSpeedExamples 5426d18 Megatron-LM/scripts/ds_zero2_config.json",
    ),
    # DeepSpeed 0.1.0's ZeRO-OS: the engine all-reduces the gradients (deepspeed_light.py
    # `allreduce_gradients` -> `buffered_allreduce_fallback`, elements_per_buffer=500000000: each bucket
    # flattened, all-reduced, copied back), then each rank updates its partition: a transient copy of at most
    # 5e8 elements, the all-reduce's 1.5x volume (schedule.dp_schedule with zero_os_stage1).
    "deepspeed-zero-os-2020": Implementation(
        "deepspeed-zero-os-2020", per_parameter=False, persistence_threshold=0, reduce_bucket_elems=0,
        ops_per_rank=(0, 0), sync_per_gather=False, memory="code", grad_copy="transient",
        grad_copy_elems=500_000_000,
        switches=(("overlap_grad_reduce", False), ("zero_os_stage1", True), ("fp32_grad_shard", 1.0)),
        source="microsoft/DeepSpeed v0.1.0: deepspeed/pt/deepspeed_light.py buffered_allreduce_fallback",
    ),
})  # fmt: skip
# The code each paper series ran (design.md "Each code priced as itself").
PAPER_CODES = ("megatron-lm-2019", "pytorch-ddp-2019", "deepspeed-zero-2020", "deepspeed-zero-os-2020")


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
