"""Memory feasibility per GPU: what is resident, whether it fits, the largest batch and model.

On every profile the bytes are this engine's, as `zerobench trace` counts them (engine_memory.py),
against what the card leaves its tensors: the CUDA context and NCCL's buffers named outside the
allocator, the allocator's own overhead, measured where a card was, else fitted (`engine_breakdown`,
`allocator_bytes`). A published run of another code is priced from that code's formulas
(`code_breakdown`, selected by Calibration's code switches), per GPU, in bytes (paper §3, §5, §6):
- model states: the paper's formulas per stage (zerobench/memory.py; Ψ/N_m per MP rank, then /N_d);
- activation checkpoints: one per layer, b·s·h 16-bit elements, replicated on every MP rank, /N_m
  with P_a, ≈0 on the device with P_a+cpu (only the layer being moved is staged);
- the recompute working set of one layer: its activations (Korthikanti et al. 2022, Megatron
  tensor parallel without sequence parallel: s·b·h·(10 + 24/t) + 5·a·s²·b/t bytes in fp16) times
  `working_set_factor` (activations plus their gradients), the all-gathered checkpoint under
  P_a, and the vocabulary-parallel logits (16-bit logits, fp32 softmax and its gradient);
- buffers: constant-size fused buckets (C_B; a reduce and an all-gather bucket of `bucket_bytes`,
  never larger than the gradients they hold)
  and the fp32 copy of the rank's gradient shard that DeepSpeed's stage 1–2 optimizer updates
  from (4Ψ/(N_m·N_d), the "+4 B/N" of simulators.md §3.2; DeepSpeed's own estimator counts it
  as resident, 2Ψ + 18Ψ/N; counted resident here, see docs/perfmodel.md) for ZeRO, or the fp32 flattened
  gradient buffer of the whole model (4Ψ/N_m) that the baselines'
  fp16 optimizers keep (paper §3.2: 1.5B → 6 GB);
- the reduction transient: a flattened copy of all of the rank's fp16 gradients (2Ψ/N_m), built
  after backward, so it coexists with model states and buffers but not with activations; at
  N_d = 1 nothing is reduced and no copy is made. The
  baselines' Megatron-LM DDP coalesces every gradient into one buffer to all-reduce it, and
  DeepSpeed's stage 1 of May 2020 flattens every rank's sub-partitions to reduce-scatter them
  (not ZeRO-OS, `zero_os_stage1`; docs/perfmodel.md "Gradient copies");
- unusable: the CUDA context and allocator reserve, plus a fragmentation share of the device
  unless M_D (contiguous buffers) is on (paper §3.2: OOM with >30% free in extreme cases); both
  fitted on the paper's points, or measured on the card where its profile says (`usable_bytes`);
- construction, apart from training: the peak while the engine is built (memory.build_peak_bytes:
  the parameters' storage plus one parameter's initial value as it is drawn, or the model states
  if larger; engine_memory.initial_draw_bytes: the whole parameter in fp32 and its MP slice).
  A configuration fits when both its training and its construction peak do.
Other codes than the paper's, by Calibration switches (off by default; docs/perfmodel.md "External
validation"): PyTorch FSDP's stage 3 (`fsdp`: gathered units, not buckets), a fused cross-entropy
(`fused_cross_entropy`), NeMo/Megatron O2's fp32 main-gradient buffer (`fp32_main_grads`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from zerobench.engine.config import ModelConfig, ParallelConfig, PrecisionConfig
from zerobench.memory import build_peak_bytes, checkpoint_bytes, model_state_bytes
from zerobench.perfmodel.attention_memory import kept_bytes
from zerobench.perfmodel.constants import Calibration
from zerobench.perfmodel.engine_memory import compute_bytes as activation_dtype_bytes
from zerobench.perfmodel.engine_memory import engine_peak, initial_draw_bytes
from zerobench.perfmodel.hardware import HardwareProfile
from zerobench.perfmodel.implementation import Implementation
from zerobench.stages import rule

# Megatron's vocab-parallel cross-entropy casts the fp16 logits to fp32 (4 B), exponentiates and
# normalises them in place and saves them; backward writes the gradient into that same buffer,
# then casts it to fp16. So at most an fp16 and an fp32 copy coexist: 2 + 4 bytes per logit.
SOFTMAX_BYTES = 4


@dataclass(frozen=True)
class MemoryBreakdown:
    param_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    checkpoint_bytes: float
    working_bytes: float
    buffer_bytes: float
    reduce_transient_bytes: float  # held while gradients are reduced, after backward freed activations
    usable_bytes: float  # device memory minus reserve and fragmentation
    build_bytes: float  # the peak while the engine is built, before training (memory.build_peak_bytes)
    moment: str = "backward"  # where in the step the training peak is (engine_memory.py's moments)

    @property
    def model_state_bytes(self) -> float:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def activation_bytes(self) -> float:
        return self.checkpoint_bytes + self.working_bytes

    @property
    def total_bytes(self) -> float:
        """The peak: model states and buffers, plus backward's activations or the gradient
        reduction's transient, whichever is larger (the reduction runs after backward)."""
        return self.model_state_bytes + self.buffer_bytes + max(self.activation_bytes, self.reduce_transient_bytes)

    @property
    def trains(self) -> bool:
        """The training peak fits."""
        return self.total_bytes <= self.usable_bytes

    @property
    def builds(self) -> bool:
        """The construction peak fits."""
        return self.build_bytes <= self.usable_bytes

    @property
    def fits(self) -> bool:
        return self.trains and self.builds

    def terms(self) -> str:
        """The training peak's terms in GB, largest first: which one does not fit."""
        terms = {
            "model states": self.model_state_bytes,
            "activations": self.checkpoint_bytes,
            "transient": self.working_bytes,
            "buffers": self.buffer_bytes,
        }
        return ", ".join(f"{k} {v / 1e9:.1f}" for k, v in sorted(terms.items(), key=lambda kv: -kv[1]) if v)

    def cached_bytes(self, cal: Calibration) -> float:
        """What PyTorch's caching allocator holds at peak: the allocated peak plus a share of the
        free headroom kept as cached blocks (the paper's Fig 6 metric)."""
        return self.total_bytes + cal.cache_headroom * max(0.0, self.usable_bytes - self.total_bytes)


def layer_activation_bytes(
    model: ModelConfig, micro_batch: int, mp: int, act_bytes: int, attention: str = "materialized"
) -> float:
    """Stored activations of one transformer layer on one GPU (Korthikanti et al. 2022, fp16), its
    attention's s² terms (`materialized`) or log-sum-exp (`fused`) as attention_memory.kept_bytes."""
    s, h, b = model.seq, model.hidden, micro_batch
    return s * b * h * (10 + 24 / mp) * act_bytes / 2 + kept_bytes(model, b, mp, act_bytes, attention)


def logits_bytes(model: ModelConfig, micro_batch: int, mp: int, act_bytes: int, fused: bool) -> float:
    """The loss's logits on one GPU at their peak: the vocabulary-parallel logits in the compute dtype
    plus Megatron's fp32 softmax copy (SOFTMAX_BYTES), or, for a fused cross-entropy, the gradient it
    writes in the logits' own dtype (flash-attn's xentropy: computes in fp32 in registers, saves the
    logits and one fp32 log-sum-exp per row, returns a new gradient tensor unless inplace_backward;
    llm-foundry 061f2c7 `modeling_mpt.py` loss_fn `fused_crossentropy`, flash-attn==1.0.9)."""
    extra = act_bytes if fused else SOFTMAX_BYTES
    return micro_batch * model.seq * (model.vocab / mp) * (act_bytes + extra)


def fsdp_gathered_bytes(model: ModelConfig, mp: int, act_bytes: int) -> float:
    """Unsharded 16-bit parameters and gradients that PyTorch FSDP (FULL_SHARD) holds at the activation
    peak, one FSDP unit per transformer block (llm-foundry's `fsdp_wrap_fn`): in backward the block in
    use, its unsharded gradient and the next block prefetched (`limit_all_gathers` lets two all-gathers
    be in flight), 3 × 12h² elements; and the root unit (the tied embedding, V·h), which FSDP does not
    reshard after forward (torch 2.1 `_runtime_utils._post_forward_reshard` skips the root) and whose
    unsharded gradient accumulates until its post-backward hook at the end of backward: 2 × V·h."""
    h = model.hidden
    return (3 * 12 * h * h + 2 * model.vocab * h) * act_bytes / mp


def breakdown(
    model: ModelConfig,
    parallel: ParallelConfig,
    precision: PrecisionConfig,
    micro_batch: int,
    hw: HardwareProfile,
    cal: Calibration,
    attention: str = "materialized",
    implementation: Implementation | None = None,
) -> MemoryBreakdown:
    """A rank's memory: this engine's own (`engine_breakdown`) on every profile, or, where the
    calibration says another code ran (its code switches: fitting/external.py CODE) or the
    implementation profile is another code's (`memory="code"`: implementation.py), that code's
    (`code_breakdown`)."""
    if prices_code(cal, implementation):
        return code_breakdown(model, parallel, precision, micro_batch, hw, cal, attention, implementation)
    return engine_breakdown(model, parallel, precision, micro_batch, hw, cal)


def prices_code(cal: Calibration, implementation: Implementation | None = None) -> bool:
    """Whether `breakdown` prices another code's memory (its code switches are set, or the
    implementation profile is another code's) rather than this engine's."""
    code = implementation is not None and implementation.memory == "code"
    return code or cal.fsdp or cal.fused_cross_entropy or cal.fp32_main_grads


def code_breakdown(
    model: ModelConfig,
    parallel: ParallelConfig,
    precision: PrecisionConfig,
    micro_batch: int,
    hw: HardwareProfile,
    cal: Calibration,
    attention: str = "materialized",
    implementation: Implementation | None = None,
) -> MemoryBreakdown:
    """The memory of the paper's 2020 codes and of the codes published runs used, from the formulas
    of the module docstring (`Calibration`'s code switches select FSDP, a fused cross-entropy and
    NeMo's fp32 main gradients; a code's implementation profile says its gradient copy)."""
    p_bytes = activation_dtype_bytes(precision, hw)
    mp, b = parallel.mp, micro_batch
    states = model_state_bytes(model.num_params, parallel.stage, parallel.dp, mp, precision.bytes_pgk)
    layer = layer_activation_bytes(model, b, mp, p_bytes, attention)
    one_ckpt = b * model.seq * model.hidden * p_bytes  # one layer's input, b·s·h elements
    if parallel.checkpoint_activations:
        if parallel.offload_activations:
            ckpt = 2 * one_ckpt / mp  # P_a+cpu: the partition in flight to/from the host
        else:
            ckpt = checkpoint_bytes(
                b, model.seq, model.hidden, model.layers, mp, parallel.partition_activations, p_bytes
            )
        working = cal.working_set_factor * layer + (one_ckpt if parallel.partition_activations else 0.0)
    else:
        ckpt = model.layers * layer  # every layer's activations are kept for backward
        working = (cal.working_set_factor - 1) * layer
    working += logits_bytes(model, b, mp, p_bytes, cal.fused_cross_entropy)
    grads = states["grad_bytes"]
    if parallel.stage == 0 and p_bytes < 4:
        buffers = 4.0 * model.num_params / mp  # fp32 flattened gradients of the whole replica shard
        grads = 0.0 if cal.fp32_main_grads else grads  # O2: the fp32 buffer is the only gradient copy
    elif parallel.stage == 0:
        buffers = 0.0
    elif parallel.stage == 3 and cal.fsdp:
        buffers = fsdp_gathered_bytes(model, mp, p_bytes)
    else:  # C_B: reduce + all-gather bucket (never larger than the gradients they hold, in the
        # gradients' bytes); fp32 copy of this rank's gradient shard for Adam
        bucket = min(
            parallel.bucket_bytes, states["grad_bytes"] * rule(parallel.stage).divisor("grad_bytes", parallel.dp)
        )
        buffers = 2.0 * bucket + cal.fp32_grad_shard * 4.0 * model.num_params / mp / parallel.dp
    # the reduction's flattened copy (none when the all-reduce runs in place on an fp32 buffer, and
    # none at dp = 1, where there is nothing to reduce)
    flat_copy = (parallel.stage == 0 and not cal.fp32_main_grads) or (parallel.stage == 1 and not cal.zero_os_stage1)
    copy_bytes = states["grad_bytes"]
    if implementation is not None and implementation.memory == "code":  # the code's own copy, as its source has it
        flat_copy = implementation.grad_copy == "transient" and parallel.stage <= 1
        if implementation.grad_copy_elems:
            copy_bytes = min(copy_bytes, implementation.grad_copy_elems * precision.bytes_pgk[1])
        if implementation.grad_copy == "resident" and parallel.dp > 1:  # PyTorch DDP's bucket contents
            buffers += states["grad_bytes"]
    flat_copy = flat_copy and parallel.dp > 1
    return MemoryBreakdown(
        param_bytes=states["param_bytes"],
        grad_bytes=grads,
        optimizer_bytes=states["optimizer_bytes"],
        checkpoint_bytes=ckpt,
        working_bytes=working,
        buffer_bytes=buffers,
        reduce_transient_bytes=copy_bytes if flat_copy else 0.0,
        usable_bytes=usable_bytes(hw, cal, parallel.contiguous_buffers),
        build_bytes=build_peak_bytes(states, 4.0 * model.largest_param_numel),  # drawn whole in fp32
    )


def engine_breakdown(
    model, parallel, precision, micro_batch: int, hw: HardwareProfile, cal: Calibration
) -> MemoryBreakdown:
    """This engine's own bytes (engine_memory.py, equal to `zerobench trace`'s), on any profile: a
    CPU host as its RSS grows (the runtime calibrate measured added), a GPU as its allocator hands
    out, against what the card leaves the allocator (`usable_bytes`, less NCCL's buffers and the
    CUDA context: outside the allocator, named in engine_memory.py)."""
    peak = engine_peak(model, parallel, precision, micro_batch, hw)
    parts = {k: peak[k] for k in ("param_bytes", "grad_bytes", "optimizer_bytes")}
    usable = hw.memory_bytes - peak["outside"] - allocator_bytes(hw, cal, parallel.contiguous_buffers)
    if hw.reserve_bytes is not None and not hw.ranks_share_compute:  # the driver's, measured on the card
        usable -= max(0.0, hw.reserve_bytes - hw.cuda_context_bytes)
    return MemoryBreakdown(
        **parts, checkpoint_bytes=peak["activations"], working_bytes=peak["transient"] + peak["prefetch"],
        buffer_bytes=peak["runtime"], reduce_transient_bytes=0.0, usable_bytes=usable,
        build_bytes=build_peak_bytes(parts, initial_draw_bytes(model, parallel.mp)) + peak["runtime"],
        moment=peak["moment"],
    )  # fmt: skip


def allocator_bytes(hw: HardwareProfile, cal: Calibration, contiguous_buffers: bool) -> float:
    """What the caching allocator holds beyond the tensors at the peak: measured on the card where
    the profile has it (`fragmentation_bytes`), else the fitted share of the card (choices.py), none
    with M_D's contiguous buffers (paper §6.1) and none on a CPU host (no caching allocator)."""
    if hw.fragmentation_bytes is not None:
        return hw.fragmentation_bytes
    if contiguous_buffers or hw.ranks_share_compute:
        return 0.0
    return cal.fragmentation * hw.memory_bytes


def usable_bytes(hw: HardwareProfile, cal: Calibration, contiguous_buffers: bool = False) -> float:
    """Device memory a training run's tensors may take: the card less what is never usable (the
    profile's measured reserve, else the fitted CUDA context and allocator reserve) and less what the
    caching allocator holds beyond the tensors at the peak (the profile's measured fragmentation; else
    the fitted share of the card, none with M_D's contiguous buffers, paper §6.1; none on a CPU host,
    which has no caching allocator)."""
    reserve = cal.reserve_bytes if hw.reserve_bytes is None else hw.reserve_bytes
    return hw.memory_bytes - reserve - allocator_bytes(hw, cal, contiguous_buffers)


def largest_fitting(fits, limit: int) -> int:
    """Largest n in [1, limit] with fits(n), for a `fits` that holds up to some n and never above
    it (memory grows with the batch and the depth); 0 when not even 1 fits. Doubling from 1, then a
    bisection: a depth is priced in time linear in it, so the probes stay near the answer rather
    than starting at `limit`'s half."""
    if not fits(1):
        return 0
    lo, hi = 1, 2  # lo fits; hi is the next to try
    while hi <= limit and fits(hi):
        lo, hi = hi, 2 * hi
    hi = min(hi, limit + 1)  # does not fit, or past the limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def max_micro_batch(
    model, parallel, precision, hw, cal, limit: int = 1 << 16, attention: str = "materialized", implementation=None
) -> int:
    """Largest micro-batch that fits (0 when not even one sequence does), under `implementation`'s memory."""
    return largest_fitting(
        lambda b: breakdown(model, parallel, precision, b, hw, cal, attention, implementation).fits, limit
    )


def max_layers(
    model: ModelConfig,
    parallel,
    precision,
    micro_batch: int,
    hw,
    cal,
    limit: int = 1 << 14,
    attention: str = "materialized",
) -> int:
    """Most layers of `model`'s width that fit at `micro_batch` (0 if none)."""
    return largest_fitting(
        lambda n: breakdown(dataclasses.replace(model, layers=n), parallel, precision, micro_batch, hw, cal,
                            attention).fits, limit,
    )  # fmt: skip
