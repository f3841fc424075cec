"""Step time, throughput and feasibility of one configuration; the record and the planning text.

Step time = compute + exposed MP communication + exposed DP communication + optimizer step + a
fixed overhead (network.py states the overlap rule). On a measured (calibrated) host the
communication terms include the time ranks wait for each other at their collectives. Throughput
follows the paper's convention (zerobench/flops.py: recomputation counted when checkpointing),
per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerobench.engine.config import ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.flops import step_flops
from zerobench.perfmodel import compute, network, schedule
from zerobench.perfmodel.constants import DEFAULT, Calibration
from zerobench.perfmodel.error_bands import band
from zerobench.perfmodel.feasibility import MemoryBreakdown, activation_dtype_bytes, breakdown, max_micro_batch
from zerobench.perfmodel.hardware import HardwareProfile, get_profile
from zerobench.perfmodel.host_cost import HOST_OP_S, host_excess, stage3_host_s
from zerobench.perfmodel.implementation import DEFAULT_IMPLEMENTATION, Implementation, list_form_host_s, variants
from zerobench.perfmodel.implementation import get as get_implementation
from zerobench.perfmodel.kernels import check_attention
from zerobench.trial import new_record, trial_columns
from zerobench.trial.errors import REFUSED, InputError


@dataclass(frozen=True)
class Prediction:
    fits: bool
    memory: MemoryBreakdown
    max_micro_batch: int
    compute_s: float
    mp_comm_s: float
    host_copy_s: float
    dp_comm_s: float
    optimizer_s: float
    overhead_s: float
    efficiency: float
    flops_per_gpu: float  # paper convention, per step
    model_flops_per_gpu: float  # without recomputation, for MFU
    peak_flops: float

    @property
    def step_time_s(self) -> float:
        return self.compute_s + self.mp_comm_s + self.host_copy_s + self.dp_comm_s + self.optimizer_s + self.overhead_s

    @property
    def tflops_per_gpu(self) -> float:
        return self.flops_per_gpu / self.step_time_s / 1e12

    @property
    def mfu(self) -> float:
        return self.model_flops_per_gpu / self.step_time_s / self.peak_flops


def validate(model: ModelConfig, parallel: ParallelConfig, hw: HardwareProfile) -> None:
    """Refuse layouts that cannot exist (Megatron's rules, paper appendix; whole-node MP groups).
    The vocabulary is padded to a multiple of mp, as Megatron does, so it is not checked."""
    for field, value in (("heads", model.heads), ("hidden", model.hidden)):
        if value % parallel.mp:
            raise InputError(f"{field}={value!r}: must be divisible by mp ({parallel.mp})")
    gpn = hw.gpus_per_node
    if (parallel.mp > gpn and parallel.mp % gpn) or (parallel.mp < gpn and gpn % parallel.mp):
        raise InputError(f"mp={parallel.mp!r}: an MP group must divide a node or span whole nodes ({gpn} GPUs)")


def layout(gpus: int, mp: int, **parallel_fields) -> ParallelConfig:
    """ParallelConfig for `gpus` GPUs at MP degree `mp` (DP = gpus / mp)."""
    if not isinstance(gpus, int) or gpus < 1 or gpus % mp:
        raise InputError(f"gpus={gpus!r}: must be a positive multiple of mp ({mp})")
    return ParallelConfig(dp=gpus // mp, mp=mp, **parallel_fields)


def predict(
    model: ModelConfig,
    parallel: ParallelConfig,
    precision: PrecisionConfig,
    train: TrainConfig,
    hardware: str | HardwareProfile,
    gpus_per_node: int | None = None,
    cal: Calibration = DEFAULT,
    attention: str = "materialized",
    implementation: str | Implementation = DEFAULT_IMPLEMENTATION,
) -> Prediction:
    """`attention`: `materialized` (s² scores kept, a separate softmax pass: the paper's 2020 code,
    used by the paper artifacts) or `fused` (flash-style: what today's codes and this engine run).
    `implementation`: the code priced (implementation.PROFILES): how it issues its collectives and, for the
    paper's codes, their own memory and overlaps."""
    hw = get_profile(hardware, gpus_per_node)
    validate(model, parallel, hw)
    check_attention(attention)
    impl = get_implementation(implementation)
    cal = impl.calibrated(cal.for_hardware(hw.name))  # the code's own switches (its overlaps)
    b, ga, mp = train.micro_batch, train.grad_accum, parallel.mp
    recompute = parallel.checkpoint_activations
    _, g_bytes, _ = precision.bytes_pgk
    act_bytes = activation_dtype_bytes(precision, hw)
    # a CPU profile is measured per core (one thread per rank): ranks share a core only past the
    # host's cores (`gpus_per_node` of a CPU profile)
    share = max(1.0, parallel.world_size / hw.gpus_per_node) if hw.ranks_share_compute else 1
    if hw.ranks_share_compute and parallel.world_size > 1:  # the other ranks' kernels share memory and cache
        share *= hw.concurrency_slowdown
    mem = breakdown(model, parallel, precision, b, hw, cal, attention, impl)
    mixed = hw.ranks_share_compute and precision.bytes_pgk[0] != 4  # a CPU host computes in fp32
    comp, eff = compute.compute_time(model, mp, b, ga, recompute, hw, cal, attention, act_bytes, share, mixed)
    mp_t, host_t = network.mp_comm_time(
        b, model.seq, model.hidden, model.layers, mp, act_bytes, recompute,
        parallel.partition_activations, parallel.offload_activations, hw, cal,
    )  # fmt: skip
    psi, (units, kept) = model.num_params / mp, schedule.stage3_units(model, mp, impl)
    reduce_s, exposed_s = network.dp_comm_times(psi, parallel.stage, parallel.dp, mp, g_bytes, hw, cal, ga, units,
                                                kept, impl.reduce_bucket_elems)  # fmt: skip
    # list-form collectives: host ops per rank per call; with a synchronize per gather the host's
    # work adds to the step, else it hides behind the device's as long as the device is the slower
    plan = schedule.dp_schedule(psi, parallel.stage, g_bytes, cal, ga, units, kept, impl.reduce_bucket_elems)
    calls = {op: sum(c.calls for c in plan if c.op == op) for op in ("all_gather", "reduce_scatter")}
    op_s = hw.op_overhead_s if hw.measured else HOST_OP_S
    list_host = list_form_host_s(calls["all_gather"], calls["reduce_scatter"], parallel.dp, impl, op_s)
    # on a measured host, ranks also wait for each other at their collectives (zero elsewhere)
    mp_calls = network.mp_calls_per_step(model.layers, recompute, ga)
    mp_wait, dp_wait = network.sync_waits(hw, parallel.dp, mp, parallel.stage, mp_calls, comp, ga)
    bwd_last = comp / ga * compute.backward_fraction(recompute)
    # What hides behind the last backward: P_g's bucketed reduce-scatter (paper §5.2) if switched on,
    # and PyTorch DDP's bucketed all-reduce (the Fig 8 baseline: stage 0 without MP), which DDP
    # launches from autograd hooks as each bucket's gradients are ready. Megatron's own DDP (mp > 1)
    # all-reduces after backward. On a CPU host nothing hides: gloo reduces on the cores that compute.
    hidden = (cal.overlap_grad_reduce and parallel.stage >= 2) or (cal.ddp_overlap and parallel.stage == 0 and mp == 1)
    hidden = hidden and not hw.ranks_share_compute
    updated = psi / parallel.dp if parallel.stage >= 1 else psi
    return Prediction(
        fits=mem.fits,
        memory=mem,
        max_micro_batch=max_micro_batch(model, parallel, precision, hw, cal, attention=attention, implementation=impl),
        compute_s=comp,
        mp_comm_s=mp_t * ga + network.mp_norm_time(mp, hw, cal) + mp_wait,
        host_copy_s=host_t * ga,
        dp_comm_s=max(0.0, reduce_s - (bwd_last if hidden else 0.0)) + exposed_s + dp_wait,
        optimizer_s=compute.optimizer_time(updated, hw, cal, share, clip=train.clip_norm > 0),
        overhead_s=(0.0 if hw.measured else cal.step_overhead_s)  # not measured: none assumed
        + stage3_host_s(model, parallel, ga, comp, precision.bytes_pgk[0], hw, cal)  # host-bound gathers
        + (list_host if impl.sync_per_gather else host_excess(list_host, comp)),
        efficiency=eff,
        flops_per_gpu=step_flops(model, b * ga, recompute) / mp,
        model_flops_per_gpu=step_flops(model, b * ga, False) / mp,
        peak_flops=hw.peak_flops,
    )


def model_record(
    model: ModelConfig,
    parallel: ParallelConfig,
    precision: PrecisionConfig,
    train: TrainConfig,
    hardware: str,
    gpus_per_node: int | None = None,
    cal: Calibration = DEFAULT,
    attention: str = "materialized",
    implementation: str = DEFAULT_IMPLEMENTATION,
) -> dict:
    """One `source: modelled` record (trial.TrialRecord's columns, time breakdown in the extras); its
    `implementation` extra names the profile it was priced with (implementation.py)."""
    # the configuration's columns as every source writes them; a modelled step has no step count
    fields = {**trial_columns(model, parallel, precision, train), "device": "modelled", "hardware": str(hardware)}
    fields["steps"] = None
    # how far to trust it: the held-out error of its regime (a number, or "unvalidated")
    fields["error_band_pct"] = band(str(hardware), parallel.world_size, parallel.mp, parallel.stage).value
    try:
        pred = predict(model, parallel, precision, train, hardware, gpus_per_node, cal, attention, implementation)
    except REFUSED as exc:
        return new_record("modelled", status="infeasible", error=str(exc), **fields)
    mem = pred.memory
    fields.update(
        param_bytes=mem.param_bytes, grad_bytes=mem.grad_bytes, optimizer_bytes=mem.optimizer_bytes,
        activation_bytes=mem.activation_bytes, peak_allocated_bytes=mem.total_bytes, build_peak_bytes=mem.build_bytes,
        peak_reserved_bytes=mem.cached_bytes(cal),
    )  # fmt: skip
    extra = {
        "max_micro_batch": pred.max_micro_batch,
        "buffer_bytes": mem.buffer_bytes,
        "usable_bytes": mem.usable_bytes,
        "attention": attention,
        "implementation": implementation,
    }
    if not pred.fits:
        needs = mem.total_bytes if mem.builds else max(mem.total_bytes, mem.build_bytes)
        phase = "" if mem.builds else " to build the engine" if mem.trains else " to build and to train"
        msg = (
            f"needs {needs / 1e9:.1f} GB per GPU{phase} ({mem.terms()}), {mem.usable_bytes / 1e9:.1f} GB usable; "
            f"largest micro-batch that fits: {pred.max_micro_batch}"
        )
        return new_record("modelled", status="oom", error=msg, extra=extra, **fields)
    step = pred.step_time_s
    samples = train.micro_batch * train.grad_accum * parallel.dp / step
    extra.update(
        compute_s=pred.compute_s, mp_comm_s=pred.mp_comm_s + pred.host_copy_s, dp_comm_s=pred.dp_comm_s,
        optimizer_s=pred.optimizer_s, overhead_s=pred.overhead_s, host_copy_s=pred.host_copy_s,
        gemm_efficiency=pred.efficiency,
    )  # fmt: skip
    return new_record(
        "modelled", step_time_s=step, step_time_min_s=step, step_time_max_s=step, samples_per_s=samples,
        tokens_per_s=samples * model.seq, tflops_per_gpu=pred.tflops_per_gpu, mfu=pred.mfu, extra=extra, **fields,
    )  # fmt: skip


def estimate_text(
    model: ModelConfig,
    parallel: ParallelConfig,
    precision: PrecisionConfig,
    train: TrainConfig,
    hardware: str,
    gpus_per_node: int | None = None,
    cal: Calibration = DEFAULT,
    attention: str = "fused",
    implementation: str = DEFAULT_IMPLEMENTATION,
) -> str:
    """The planning answer for a person: fits or not, memory by category, batch, speed, and how sure
    the speed is (the regime's band) under which implementation profile."""
    hw = get_profile(hardware, gpus_per_node)
    head = (
        f"{model.name} ({model.num_params / 1e9:.2f}B params) on {parallel.world_size} x {hw.gpu} "
        f"(dp={parallel.dp}, mp={parallel.mp}, stage {parallel.stage}, "
        f"micro-batch {train.micro_batch}, {attention} attention)"
    )
    try:
        pred = predict(model, parallel, precision, train, hw, None, cal, attention, implementation)
    except REFUSED as exc:
        return f"{head}\n  cannot exist: {exc}"
    m = pred.memory
    z = _size
    unit = "rank" if hw.ranks_share_compute else "GPU"
    verdict = (
        "yes"
        if pred.fits
        else "NO (out of memory while training)"
        if m.builds
        else (
            "NO (out of memory while building the engine; training alone would fit)"
            if m.trains
            else "NO (out of memory while building and while training)"
        )
    )
    lines = [
        head,
        f"  fits: {verdict} — training {z(m.total_bytes)}, construction {z(m.build_bytes)}, of "
        f"{z(m.usable_bytes)} usable per {unit}",
        f"  model states {z(m.model_state_bytes)} (params {z(m.param_bytes)}, grads {z(m.grad_bytes)}, "
        f"optimizer {z(m.optimizer_bytes)}); activations {z(m.activation_bytes)} (checkpoints "
        f"{z(m.checkpoint_bytes)}, working {z(m.working_bytes)}); buffers {z(m.buffer_bytes)}",
    ]
    if m.reduce_transient_bytes:  # the reduction's flat gradient copy, after backward (docs/perfmodel.md)
        phase = "the peak" if m.reduce_transient_bytes > m.activation_bytes else "below backward's peak"
        lines.append(
            f"  gradient reduction: +{z(m.reduce_transient_bytes)} flat copy of the gradients "
            f"in place of the activations ({phase})"
        )
    lines.append(f"  largest micro-batch that fits: {pred.max_micro_batch}")
    if pred.fits:
        t = pred.step_time_s
        parts = [
            ("compute", pred.compute_s),
            ("MP comm", pred.mp_comm_s + pred.host_copy_s),
            ("DP comm", pred.dp_comm_s),
            ("optimizer", pred.optimizer_s),
            ("overhead", pred.overhead_s),
        ]
        lines.append(
            f"  predicted {pred.tflops_per_gpu:.3g} TFLOPS/{unit} (MFU {pred.mfu:.0%}), step {t:.3g} s: "
            + ", ".join(f"{k} {v / t:.0%}" for k, v in parts)
        )
        lines.append(f"  {band(hw.name, parallel.world_size, parallel.mp, parallel.stage).text()}")
        for label, impl in variants(implementation).items():  # the profile's fragile terms at their range
            alt = predict(model, parallel, precision, train, hw, None, cal, attention, impl)
            lines.append(
                f"  sensitivity ({implementation}, assumed range): {label}: {alt.tflops_per_gpu:.3g} "
                f"TFLOPS/{unit}, step {alt.step_time_s:.3g} s"
            )
    lines.append(f"  implementation profile: {implementation} ({get_implementation(implementation).source})")
    return "\n".join(lines)


def _size(nbytes: float) -> str:
    """Bytes for a person: GB from 1 GB up, MiB below (a CPU trial's megabytes)."""
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 2**20:.1f} MiB"
