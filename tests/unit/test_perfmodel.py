"""Unit tests of the performance model: FLOPs convention, α–β collectives, memory feasibility,
refusal of impossible layouts, the record and the planning text."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from zerobench.engine.config import PRESETS, ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.flops import step_flops
from zerobench.perfmodel import (
    DEFAULT,
    estimate_text,
    get_profile,
    layout,
    model_record,
    nccl_table,
    network,
    predict,
    schedule,
)
from zerobench.perfmodel.compute import flops_per_gpu
from zerobench.perfmodel.feasibility import breakdown, code_breakdown, max_micro_batch
from zerobench.perfmodel.kernels import layer_gemms
from zerobench.perfmodel.paper_setups import PAPER_PRECISION, zero_parallel
from zerobench.trial.errors import InputError

V100 = get_profile("v100-32gb-dgx2")
FP16 = PrecisionConfig(mode="fp16", device="cuda")


def test_flops_convention_against_the_gemms_counted_one_by_one():
    # An independent count: the layer's GEMMs by shape (kernels.layer_gemms, 2·m·n·k each), run
    # forward, recomputed and backward (2x), plus the logits GEMM (t·h·V, 2 FLOPs each) forward and
    # backward, never recomputed. The paper's 96·B·s·L·h²(1 + s/6h + V/16Lh) must equal it.
    model = ModelConfig(layers=2, hidden=64, heads=4, seq=32, vocab=256)
    b = 3
    layer = sum(2 * m * n * k * count for _, m, n, k, count in layer_gemms(model, b, 1))
    logits = 2 * b * 32 * 64 * 256
    assert step_flops(model, b, recompute=True) == pytest.approx(4 * 2 * layer + 3 * logits)
    assert step_flops(model, 3, recompute=False) == pytest.approx(3 / 4 * step_flops(model, 3, recompute=True))
    # per GPU: one replica's work split across its MP group; grad accumulation multiplies it
    assert flops_per_gpu(model, mp=2, micro_batch=3, grad_accum=2, recompute=True) == pytest.approx(
        4 * 6 * 7_602_176 / 2
    )


def test_tflops_is_the_papers_flops_over_step_time():
    # The paper's count (§10, after Narayanan et al.) by hand, not through flops.py: ZeRO-100B
    # (125 layers, h 8192, seq 1024, V 50257) on 400 GPUs at MP 16 is DP 25, so 32 per GPU is
    # 800 samples a step: 96·B·s·L·h²·(1 + s/6h + V/16Lh) = 6.7547e17 FLOPs with recomputation.
    model, par = PRESETS["gpt-100b"], zero_parallel(400, 16, "C4")
    assert (model.layers, model.hidden, model.seq, model.vocab) == (125, 8192, 1024, 50257)
    flops = 96 * 800 * 1024 * 125 * 8192**2 * (1 + 1024 / (6 * 8192) + 50257 / (16 * 125 * 8192))
    assert flops == pytest.approx(6.7547448612e17)
    pred = predict(model, par, PAPER_PRECISION, TrainConfig(micro_batch=32), "v100-32gb-dgx2")
    assert pred.tflops_per_gpu == pytest.approx(flops / 400 / pred.step_time_s / 1e12)
    # the same FLOPs over twice the batch per step: twice the work in the step it predicts
    double = predict(model, par, PAPER_PRECISION, TrainConfig(micro_batch=32, grad_accum=2), "v100-32gb-dgx2")
    assert double.tflops_per_gpu == pytest.approx(2 * flops / 400 / double.step_time_s / 1e12)


def test_alpha_beta_ring_times():
    # one node, 4 members: a plain NVSwitch ring
    ring = network.Ring(per_node=4, nodes=1, intra_bw=100e9, inter_bw=5e9, intra_latency=5e-6, inter_latency=1e-5)
    nbytes = 1e9
    assert ring.all_reduce(nbytes) == pytest.approx(2 * 3 / 4 * nbytes / 100e9 + 6 * 5e-6)
    assert ring.reduce_scatter(nbytes) == pytest.approx(3 / 4 * nbytes / 100e9 + 3 * 5e-6)
    assert ring.all_gather(nbytes) == ring.reduce_scatter(nbytes)
    # one member per node on 5 nodes: a plain InfiniBand ring at the per-GPU share
    ib = network.Ring(per_node=1, nodes=5, intra_bw=100e9, inter_bw=5e9, intra_latency=5e-6, inter_latency=1e-5)
    assert ib.all_reduce(nbytes) == pytest.approx(2 * 4 / 5 * nbytes / 5e9 + 8 * 1e-5)
    # 4 per node on 2 nodes: intra reduce-scatter, then the inter ring carries 1/4 of the data
    hier = network.Ring(per_node=4, nodes=2, intra_bw=100e9, inter_bw=5e9, intra_latency=5e-6, inter_latency=1e-5)
    expected = 3 / 4 * nbytes / 100e9 + 3 * 5e-6 + 1 / 2 * nbytes / 4 / 5e9 + 1e-5
    assert hier.reduce_scatter(nbytes) == pytest.approx(expected)
    assert network.Ring(1, 1, 1e9, 1e9, 1e-5, 1e-5).all_reduce(nbytes) == 0.0


def test_groups_use_the_links_they_cross():
    cal = DEFAULT
    # MP 16 inside a DGX-2: NVSwitch only
    mp16 = network.ring(16, 1, V100, cal)
    assert (mp16.per_node, mp16.nodes) == (16, 1)
    assert mp16.intra_bw == pytest.approx(150e9 * cal.nvlink_efficiency)
    # ZeRO's DP group at MP 16: one GPU per node -> the per-GPU share of 8 x 12.5 GB/s
    dp = network.ring(25, 16, V100, cal)
    assert (dp.per_node, dp.nodes) == (1, 25)
    assert dp.inter_bw == pytest.approx(100e9 / 16 * cal.ib_efficiency)
    # Megatron MP 32 spans two nodes: the same all-reduce is much slower than inside one node
    mp32 = network.ring(32, 1, V100, cal)
    assert (mp32.per_node, mp32.nodes) == (16, 2)
    assert mp32.all_reduce(1e8) > 1.5 * mp16.all_reduce(1e8)
    assert network.placement(128, 1, 16) == (16, 8)
    # DP traffic: 2Ψ for stages 0-2 (all-reduce = reduce-scatter + all-gather), 3Ψ for stage 3
    r0, e0 = network.dp_comm_times(1e9, 0, 25, 16, 2, V100, cal)
    r2, e2 = network.dp_comm_times(1e9, 2, 25, 16, 2, V100, cal)
    r3, e3 = network.dp_comm_times(1e9, 3, 25, 16, 2, V100, cal)
    # the bytes agree; the latency differs by NCCL's pick (an all-reduce may run as a tree)
    assert r0 + e0 == pytest.approx(r2 + e2, rel=1e-2)
    assert r3 + e3 == pytest.approx(1.5 * (r2 + e2), rel=1e-2)
    # P_os: reduce-scatter as stage 2 (DeepSpeed May 2020); ZeRO-OS's all-reduce is 1.5x that
    r1, e1 = network.dp_comm_times(1e9, 1, 25, 16, 2, V100, cal)
    a1, g1 = network.dp_comm_times(1e9, 1, 25, 16, 2, V100, cal.replace(zero_os_stage1=True))
    assert (r1, e1) == (r2, e2)
    assert a1 + g1 == pytest.approx(1.5 * (r2 + e2), rel=1e-2)


def test_reduction_transient_is_one_more_copy_of_the_gradients():
    """The paper's 2020 codes (code_breakdown): DeepSpeed's P_os reduce-scatters a flat copy of every
    gradient, ZeRO-OS all-reduces in place, Megatron's DDP coalesces; this engine does neither."""
    breakdown = code_breakdown
    model, stage1 = PRESETS["gpt-60b-scaling"], ParallelConfig(dp=25, mp=16, stage=1, checkpoint_activations=True)
    psi = model.num_params / 16  # per MP rank
    m = breakdown(model, stage1, FP16, 1, V100, DEFAULT)
    assert m.reduce_transient_bytes == m.grad_bytes == 2 * psi  # the flat fp16 copy of every gradient
    assert m.activation_bytes < m.reduce_transient_bytes  # at batch 1 the reduction is the peak ...
    zero_os = breakdown(model, stage1, FP16, 1, V100, DEFAULT.replace(zero_os_stage1=True))
    assert zero_os.reduce_transient_bytes == 0.0
    # ... so the copy adds what it holds beyond the activations it replaces, compared with ZeRO-OS
    assert m.total_bytes - zero_os.total_bytes == pytest.approx(2 * psi - m.activation_bytes)
    big = breakdown(model, stage1, FP16, 64, V100, DEFAULT)  # at batch 64 backward is the peak:
    big_os = breakdown(model, stage1, FP16, 64, V100, DEFAULT.replace(zero_os_stage1=True))
    assert big.activation_bytes > 2 * psi and big.total_bytes == pytest.approx(big_os.total_bytes)
    for stage in (2, 3):  # stages 2-3 reduce bucket by bucket during backward: no full copy
        other = dataclasses.replace(stage1, stage=stage)
        assert breakdown(model, other, FP16, 1, V100, DEFAULT).reduce_transient_bytes == 0.0
    megatron = breakdown(model, dataclasses.replace(stage1, stage=0), FP16, 1, V100, DEFAULT)
    assert megatron.reduce_transient_bytes == megatron.grad_bytes == 2 * psi  # local DDP's coalesced buffer


def test_mp_volume_is_six_allreduces_per_layer_with_checkpointing():
    """Per layer 6 all-reduces of b·s·h with checkpointing, 4 without; 2 more per micro-batch (the
    vocab-parallel embedding, the logits' input gradient) and the loss's 3 of b·s fp32. The count
    is the engine's own (tests/distributed/test_model_parallel.py::test_mp_communication_volume)."""
    cal = DEFAULT
    t6, _ = network.mp_comm_time(4, 1024, 8192, 10, 16, 2, True, False, False, V100, cal)
    t4, _ = network.mp_comm_time(4, 1024, 8192, 10, 16, 2, False, False, False, V100, cal)
    ring = network.ring(16, 1, V100, cal)
    one, loss = ring.all_reduce(4 * 1024 * 8192 * 2), 3 * ring.all_reduce(4 * 1024 * 4)
    assert t6 == pytest.approx(62 * one + loss) and t4 == pytest.approx(42 * one + loss)
    assert network.mp_comm_time(4, 1024, 8192, 10, 1, 2, True, False, False, V100, cal) == (0.0, 0.0)


def test_max_batch_monotone_in_memory():
    model, par = PRESETS["gpt-60b-scaling"], zero_parallel(128, 16, "C4")
    batches = [
        max_micro_batch(model, par, PAPER_PRECISION, dataclasses.replace(V100, memory_bytes=gib * 2**30), DEFAULT)
        for gib in (24, 32, 40, 48, 80)
    ]
    assert batches == sorted(batches) and batches[-1] > batches[0]


def test_more_dp_never_more_model_state_memory_nor_smaller_batch():
    model = PRESETS["gpt-60b-scaling"]
    for stage in (0, 1, 2, 3):
        states = [
            breakdown(model, ParallelConfig(dp=dp, mp=16, stage=stage), FP16, 1, V100, DEFAULT).model_state_bytes
            for dp in (1, 2, 4, 8, 25, 64)
        ]
        # the engine pads each bucket to a multiple of N_d (zero/partition.py): under N_d elements more
        assert all(b <= a * (1 + 1e-6) for a, b in zip(states, states[1:], strict=False)), stage
    batches = [
        max_micro_batch(model, zero_parallel(16 * dp, 16), PAPER_PRECISION, V100, DEFAULT) for dp in (4, 8, 16, 25)
    ]
    assert batches == sorted(batches)


def test_refuses_layouts_that_cannot_exist():
    model = PRESETS["gpt-100b"]  # 64 heads
    with pytest.raises(InputError, match="heads"):
        odd = dataclasses.replace(model, heads=24, hidden=8184)
        predict(odd, ParallelConfig(dp=1, mp=16), FP16, TrainConfig(), "v100-32gb-dgx2")
    with pytest.raises(InputError, match="gpus"):
        layout(100, 16)
    with pytest.raises(InputError, match="mp"):
        predict(model, ParallelConfig(dp=1, mp=32), FP16, TrainConfig(), "h100-80gb", gpus_per_node=12)
    with pytest.raises(InputError, match="hardware"):
        get_profile("tpu-v9")
    rec = model_record(dataclasses.replace(model, heads=24, hidden=8184), ParallelConfig(dp=2, mp=16), FP16,
                       TrainConfig(), "v100-32gb-dgx2")  # fmt: skip
    assert rec["status"] == "infeasible" and "heads" in rec["error"]


def test_record_ok_and_oom():
    rec = model_record(PRESETS["gpt-100b"], zero_parallel(400, 16, "C4"), PAPER_PRECISION, TrainConfig(micro_batch=32),
                       "v100-32gb-dgx2")  # fmt: skip
    assert rec["source"] == "modelled" and rec["status"] == "ok"
    assert rec["world_size"] == 400 and rec["global_batch"] == 800
    assert rec["tflops_per_gpu"] > 0 and 0 < rec["mfu"] < 1
    for key in ("compute_s", "mp_comm_s", "dp_comm_s", "optimizer_s", "overhead_s", "max_micro_batch"):
        assert key in rec
    assert rec["peak_allocated_bytes"] <= 32 * 2**30
    plain = ParallelConfig(dp=25, mp=16, stage=0)
    oom = model_record(PRESETS["gpt-100b"], plain, FP16, TrainConfig(), "v100-32gb-dgx2")
    assert oom["status"] == "oom" and "GB" in oom["error"] and oom["tflops_per_gpu"] is None


def test_gpus_per_node_override_and_today_profiles():
    for name in ("a100-80gb", "h100-80gb", "h200-141gb"):
        hw = get_profile(name)
        assert hw.gpus_per_node == 8 and hw.peak_flops > V100.peak_flops
    assert get_profile("h100-80gb", gpus_per_node=4).gpus_per_node == 4
    # MP 16 on 8-GPU nodes crosses nodes and is slower than on a 16-GPU node of the same GPUs
    model, train = PRESETS["gpt-100b"], TrainConfig(micro_batch=8)
    par = zero_parallel(128, 16, "C4")
    slow = predict(model, par, PAPER_PRECISION, train, "h100-80gb")
    fast = predict(model, par, PAPER_PRECISION, train, "h100-80gb", gpus_per_node=16)
    assert slow.mp_comm_s > fast.mp_comm_s


def test_estimate_text():
    text = estimate_text(PRESETS["gpt-100b"], zero_parallel(400, 16, "C4"), PAPER_PRECISION,
                         TrainConfig(micro_batch=32), "v100-32gb-dgx2")  # fmt: skip
    assert "fits: yes" in text and "largest micro-batch" in text and "TFLOPS/GPU" in text
    bad = estimate_text(PRESETS["gpt-100b"], ParallelConfig(dp=25, mp=16), FP16, TrainConfig(), "v100-32gb-dgx2")
    assert "NO" in bad
    assert "gradient reduction" not in text  # stage 2 reduces bucket by bucket: no flat copy
    p_os = estimate_text(PRESETS["gpt-60b-scaling"], zero_parallel(128, 16, "C2"), PAPER_PRECISION,
                         TrainConfig(micro_batch=4), "v100-32gb-dgx2")  # fmt: skip
    assert "gradient reduction" not in p_os  # nor this engine's P_os (engine_memory.py): no flat copy
    # DeepSpeed's P_os of 2020 reduce-scattered a flat copy of every gradient (code_breakdown)
    copy_gb = 2 * PRESETS["gpt-60b-scaling"].num_params / 16 / 1e9  # fp16 gradients of one MP rank
    paper_code = code_breakdown(PRESETS["gpt-60b-scaling"], zero_parallel(128, 16, "C2"), FP16, 4, V100, DEFAULT)
    assert paper_code.reduce_transient_bytes / 1e9 == pytest.approx(copy_gb)


def test_perfmodel_never_imports_torch():
    code = "import sys, zerobench.artifacts.tables.in_process; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_unaligned_head_size_runs_attention_off_tensor_cores():
    from zerobench.perfmodel.compute import compute_time

    model = PRESETS["gpt-1.5b"]  # 1600 / 16 = head size 100, not a multiple of 8
    slow, eff = compute_time(model, 1, 24, 1, True, V100, DEFAULT)
    fast, _ = compute_time(model, 1, 24, 1, True, dataclasses.replace(V100, tensor_core_align=1), DEFAULT)
    # QK^T and softmax.V: 2·s²·h FLOPs each per sequence and layer, run forward, recomputed and
    # backward (2x): 16·b·L·s²·h, moved from the tensor-core rate to the CUDA cores' 31.4 TFLOPS
    s, h, n = model.seq, model.hidden, model.layers
    extra = 16 * 24 * n * s * s * h / eff * (1 / 31.4e12 - 1 / 125e12)
    assert slow - fast == pytest.approx(extra)
    aligned = dataclasses.replace(model, heads=20)  # head size 80: aligned, no penalty
    assert compute_time(aligned, 1, 24, 1, True, V100, DEFAULT)[0] < slow


def test_ddp_all_reduce_hides_behind_backward_megatron_does_not():
    model, train = PRESETS["ddp-1.16b"], TrainConfig(micro_batch=8)
    ddp = ParallelConfig(dp=128, mp=1, stage=0, checkpoint_activations=True)
    hidden = predict(model, ddp, PAPER_PRECISION, train, "v100-32gb-dgx2")
    exposed = predict(model, ddp, PAPER_PRECISION, train, "v100-32gb-dgx2",
                      cal=DEFAULT.replace(ddp_overlap=False))  # fmt: skip
    assert exposed.dp_comm_s > 0 and hidden.dp_comm_s < exposed.dp_comm_s
    # PyTorch DDP buckets all-reduce during backward: only what outlasts the last backward shows
    # what hides is at most the last backward (3 of 4 passes with recomputation)
    assert exposed.dp_comm_s - hidden.dp_comm_s <= 0.75 * hidden.compute_s + 1e-12
    megatron = ParallelConfig(dp=25, mp=16, stage=0, checkpoint_activations=True)  # Megatron's DDP: after backward
    big = PRESETS["gpt-60b-scaling"]  # 32 heads: divisible by mp 16
    on = predict(big, megatron, PAPER_PRECISION, TrainConfig(micro_batch=1), "v100-32gb-dgx2")
    off = predict(big, megatron, PAPER_PRECISION, TrainConfig(micro_batch=1), "v100-32gb-dgx2",
                  cal=DEFAULT.replace(ddp_overlap=False))  # fmt: skip
    assert on.dp_comm_s == pytest.approx(off.dp_comm_s)


def test_stage3_regathers_every_micro_batch_one_collective_per_module():
    ring = network.Ring(per_node=4, nodes=1, intra_bw=100e9, inter_bw=5e9, intra_latency=5e-6, inter_latency=1e-5)
    # three collectives of the same total bytes pay three times the three ring steps' latency
    assert ring.all_gather(1e9, calls=3) - ring.all_gather(1e9) == pytest.approx(2 * 3 * 5e-6)
    # a model of 4 layers owns 6 x 4 + 2 parameter modules (zero/stage3.py), all its parameters
    model = PRESETS["cpu-10m"]
    modules = schedule.stage3_modules(model)
    assert len(modules) == 26 == 6 * model.layers + 2 and sum(modules) == model.num_params
    psi = sum(modules)
    one, _ = network.dp_comm_times(psi, 3, 25, 16, 2, V100, DEFAULT, micro_batches=1, modules=modules)
    four, _ = network.dp_comm_times(psi, 3, 25, 16, 2, V100, DEFAULT, micro_batches=4, modules=modules)
    assert four == pytest.approx(4 * one)  # 3mΨ: nothing is kept between micro-batches
    # priced by NCCL's model, the split adds latency, at most Simple's per extra call (each call takes
    # NCCL's cheapest protocol, never slower than Simple) and at least LL's
    whole, _ = network.dp_comm_times(psi, 3, 25, 16, 2, V100, DEFAULT)
    simple = nccl_table.latency("all_gather", "ring", "Simple", 1, 25)
    ll = nccl_table.latency("all_gather", "ring", "LL", 1, 25)
    assert 3 * 25 * ll < one - whole <= 3 * 25 * simple
    two, _ = network.dp_comm_times(psi, 2, 25, 16, 2, V100, DEFAULT, micro_batches=4, modules=modules)
    assert two < one  # stage 2 reduces once per step, whatever the accumulation


def test_buckets_never_larger_than_the_gradients_they_hold():
    """The paper codes' C_B buffers (code_breakdown): a reduce and an all-gather bucket, never larger
    than the gradients."""
    breakdown = code_breakdown
    tiny = ModelConfig(layers=2, hidden=64, heads=4, seq=32, vocab=256)  # ~0.1M parameters
    par = ParallelConfig(dp=2, mp=1, stage=2, bucket_bytes=25 * 2**20)
    m = breakdown(tiny, par, PrecisionConfig("fp32", "cpu"), 1, V100, DEFAULT)
    # two buckets of the whole model's fp32 gradients (less than 25 MiB), plus the fp32 shard
    assert m.buffer_bytes == pytest.approx(2 * 4 * tiny.num_params + 4 * tiny.num_params / 2)
    big = breakdown(PRESETS["gpt-60b-scaling"], dataclasses.replace(par, mp=16), FP16, 1, V100, DEFAULT)
    assert big.buffer_bytes == pytest.approx(2 * 25 * 2**20 + 4 * PRESETS["gpt-60b-scaling"].num_params / 16 / 2)
