"""`zerobench calibrate` and its profile file: a profile round-trips, a bad or partial profile is
refused naming the field, a calibrated profile is found by path and by name, and the model reads
its measured rates (hand-derived step terms on a profile with one constant rate)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.records import TINY_STEP
from zerobench.engine.config import ModelConfig, ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.microbench import kernel_bench as calibrate_kernels
from zerobench.microbench import machine as calibrate
from zerobench.perfmodel import DEFAULT, compute, get_profile, network, predict, profile_file
from zerobench.perfmodel.hardware import HardwareProfile
from zerobench.perfmodel.kernels import gemm_rate, kernel_time
from zerobench.perfmodel.profile_file import KERNELS
from zerobench.runtime.trace import trace_step
from zerobench.trial import TrialSpec
from zerobench.trial.errors import InputError

FWD, BWD = 1e10, 2e10  # FLOP/s of every linear shape in the test profile, forward and backward
CF, CB = 1e-9, 3e-9  # seconds per element (attention: per unit of b·heads·s²·d) of every named kernel
MODEL = ModelConfig(layers=2, hidden=64, heads=4, seq=32, vocab=256)  # the hand-derived terms' model
HALF = MODEL.num_params * 4 / 2  # its fp32 gradients' per-rank ring volume at dp 2, stage 1
COLLECTIVES = (("all_reduce", 2, 1e-4, 1e9), ("reduce_scatter", 2, 2e-4, 5e8), ("all_gather", 2, 3e-4, 2.5e8))
CPU = HardwareProfile(
    name="test-cpu", gpu="test", peak_flops=FWD, memory_bytes=8 * 2**30, hbm_bw=2e9, gpus_per_node=2,
    intra_bw=1e9, nic_bw=1e9, nics_per_node=1, host_bw=2e9, intra_latency=1e-5, inter_latency=1e-5,
    measured=True, gemm_table=((64, 64, 64, FWD, BWD), (1024, 1024, 1024, FWD, BWD)),
    kernel_table=tuple((k, n, CF * n, CB * n) for k in KERNELS[:-2] for n in (1e3, 1e8))
    + tuple((k, n, c * n, 0.0) for k, c in (("adam", 5e-9), ("clip", 1e-9)) for n in (1e3, 1e8)),
    op_overhead_s=4e-6, ops_per_layer=100, ops_fixed=30,
    runtime_bytes=16 * 2**20, checkpoint_runtime_bytes=32 * 2**20, concurrency_slowdown=1.25,
    collectives=COLLECTIVES,  # measured curves on the α–β lines, HALF among their points
    collective_table=tuple((op, n, v, a + v / bw) for op, n, a, bw in COLLECTIVES for v in (1e3, HALF, 1e9)),
    ranks_share_compute=True, reserve_bytes=0.0,
)  # fmt: skip


def _doc(profile=CPU) -> dict:
    return {"format": profile_file.FORMAT, "profile": profile_file.to_dict(profile), "samples": {}}


def test_profile_round_trips(tmp_path):
    path = profile_file.save(CPU, tmp_path / "cpu.json", samples={"note": "kept"})
    assert profile_file.load(path) == CPU
    assert json.loads(path.read_text())["samples"] == {"note": "kept"}
    assert get_profile(str(path)) == CPU  # by path ...
    waits = dataclasses.replace(CPU, sync_table=((2, 0.02, 1e-3),), mp_sync_table=((2, 0.005, 2e-3),))
    assert profile_file.load(profile_file.save(waits, tmp_path / "waits.json")) == waits


def test_profile_found_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEROBENCH_PROFILES", str(tmp_path))
    profile_file.save(CPU, tmp_path / "mybox.json")
    assert get_profile("mybox") == CPU  # ... and by name in the profile directory
    assert calibrate.output_path("mybox") == tmp_path / "mybox.json"
    assert calibrate.output_path("out/x.json").name == "x.json"
    with pytest.raises(InputError, match="hardware='nobox'"):
        get_profile("nobox")


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda p: p.pop("peak_flops"), "peak_flops"),
        (lambda p: p.pop("gemm_table"), "gemm_table"),
        (lambda p: p.update(kernel_table=[r for r in p["kernel_table"] if r[0] != "adam"]), "no row of kernel 'adam'"),
        (lambda p: p.update(peak_flops=-1.0), "peak_flops"),
        (lambda p: p.update(hbm_bw="fast"), "hbm_bw"),
        (lambda p: p.update(gpus_per_node=0), "gpus_per_node"),
        (lambda p: p.update(gemm_table=[[64, 64, 64, 1e9]]), r"gemm_table\[0\]"),
        (lambda p: p.update(gemm_table=[[64, 0, 64, 1e9, 1e9]]), r"gemm_table\[0\]\.n"),
        (lambda p: p.update(gemm_table=[[64, 64, 64, 1e9, -1.0]]), r"gemm_table\[0\]\.backward_flops_per_s"),
        (lambda p: p.update(gemm_table=[]), "gemm_table"),
        (lambda p: p.update(kernel_table=[["gelu", 1e3, float("nan"), 0.0]]), r"kernel_table\[0\]\.forward_s"),
        (lambda p: p.update(kernel_table=[["conv", 1e3, 1e-6, 0.0]]), r"kernel_table\[0\]\.kernel"),
        (lambda p: p.update(kernel_table=p["kernel_table"][2:]), "kernel_table: no row of kernel 'layernorm'"),
        (lambda p: p.pop("runtime_bytes"), "runtime_bytes"),
        (lambda p: p.update(checkpoint_runtime_bytes=-1.0), "checkpoint_runtime_bytes"),
        (lambda p: p.update(ops_per_layer=1.5), "ops_per_layer"),
        (lambda p: p.update(concurrency_slowdown=0.5), "concurrency_slowdown"),
        (lambda p: p.update(collectives=[["broadcast", 2, 0.0, 1e9]]), r"collectives\[0\]\.op"),
        (lambda p: p.update(collectives=[["all_reduce", 1, 0.0, 1e9]]), r"collectives\[0\]\.size"),
        (lambda p: p.update(collective_table=[]), "collective_table: no row of all_reduce over 2 ranks"),
        (lambda p: p.update(collective_table=[["all_reduce", 2, -1.0, 1e-3]]), r"collective_table\[0\]\.volume"),
        (lambda p: p.update(sync_table=[[2, 0.0, 1e-3]]), r"sync_table\[0\]\.compute_s"),
        (lambda p: p.update(sync_table=[[2, 0.01, -1e-3]]), r"sync_table\[0\]\.wait_s"),
        (lambda p: p.update(sync_table=[[1, 0.01, 1e-3]]), r"sync_table\[0\]\.size"),
        (lambda p: p.update(mp_sync_table=[[2, 0.01, -1e-3]]), r"mp_sync_table\[0\]\.wait_s"),
        (lambda p: p.update(mp_sync_table=[[2, 0.01]]), r"mp_sync_table\[0\]"),
        (lambda p: p.update(measured="yes"), "measured"),
        (lambda p: p.update(colour="red"), "colour"),
    ],
)
def test_bad_or_partial_profile_is_refused_naming_the_field(tmp_path, change, field):
    doc = _doc()
    change(doc["profile"])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=field):
        profile_file.load(path)
    assert not (tmp_path / "bad.json.tmp").exists()


def test_not_a_profile_file_is_refused(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"profile": {}}))
    with pytest.raises(InputError, match="format"):
        profile_file.load(path)
    path.write_text("{not json")
    with pytest.raises(InputError, match="cannot read"):
        profile_file.load(path)


def test_alpha_beta_fit_recovers_a_line():
    # t = 50 us + v / 2 GB/s: α is the smallest message's time (its 16 bytes take 8 ns), β the
    # bandwidth of the large messages beyond α; one slow small message does not move β
    points = [(v, 50e-6 + v / 2e9) for v in (16, 1e5, 1e6, 1e7)] + [(4096, 4e-3)]
    alpha, bw = calibrate._fit_alpha_beta(points)
    assert alpha == pytest.approx(50e-6, rel=1e-3) and bw == pytest.approx(2e9, rel=1e-3)


def test_collectives_take_each_calls_median_over_the_runs():
    # three runs of the benchmark at one group size, the second in a slow spell (every call 4x)
    def run(slow):
        rows = [[op, v, slow * (50e-6 + v / 2e9)] for op in ("all_reduce", "reduce_scatter", "all_gather")
                for v in (16.0, 2.0**18, 2.0**22)]  # fmt: skip
        return {2: {"rows": rows, "sync": [[0.002, slow * 1e-3], [0.2, slow * 5e-3]]}}

    coll, curve, syncs = calibrate.collectives([run(1.0), run(4.0), run(1.1)], lambda _: None)
    assert [r[:2] for r in coll] == [["all_reduce", 2], ["reduce_scatter", 2], ["all_gather", 2]]
    alpha, bw = coll[0][2:]  # the middle run's
    assert alpha == pytest.approx(1.1 * 50e-6, rel=1e-3) and bw == pytest.approx(2e9 / 1.1, rel=1e-3)
    assert curve[2] == ["all_reduce", 2, 2.0**22, pytest.approx(1.1 * (50e-6 + 2**22 / 2e9))]
    assert syncs == [[2, 0.002, pytest.approx(1.1e-3)], [2, 0.2, pytest.approx(5.5e-3)]]


def test_rate_lookups():
    table = dataclasses.replace(CPU, gemm_table=((64, 64, 64, 1e9, 2e9), (4096, 4096, 4096, 4e10, 5e10)))
    assert gemm_rate(table, 64, 64, 64) == 1e9 and gemm_rate(table, 4096, 4096, 4096, backward=True) == 5e10
    assert 1e9 < gemm_rate(table, 512, 512, 512) < 4e10  # between its neighbours
    # past the largest measured FLOPs (calibrate's cap): the shape halved along its widest
    # dimension into range, (256, 65536, 256) -> (256, 16384, 256), not its thin neighbours' mix
    wide = dataclasses.replace(CPU, gemm_table=((64, 16384, 64, 1e9, 1e9), (256, 16384, 256, 3e10, 3e10)))
    assert gemm_rate(wide, 256, 65536, 256) == 3e10
    assert gemm_rate(wide, 256, 8192, 256) < 3e10  # within range: interpolated as before
    kt = dataclasses.replace(CPU, kernel_table=(("gelu", 1e3, 1e-6, 2e-6), ("gelu", 1e5, 3e-4, 0.0)))
    # per element: 1 ns forward at 1e3, 3 ns at 1e5; halfway in log size 2 ns, times 1e4 elements
    assert kernel_time(kt, "gelu", 1e4) == pytest.approx((2e-5, 1e-5))
    assert kernel_time(kt, "gelu", 10.0) == pytest.approx((1e-8, 2e-8))  # the end rates outside
    assert kernel_time(kt, "gelu", 1e6) == pytest.approx((3e-3, 0.0))


def _one_rank_compute_by_hand(b: int) -> float:
    """MODEL's compute seconds per step at micro-batch `b` on one rank of CPU, by hand: each linear
    1x forward and 2x its FLOPs backward at the table's rates; every named kernel per element; the
    grads copied once; the per-op cost of 100 ops per layer and 30 besides."""
    t, h, s, v, psi = b * 32, 64, 32, 256, MODEL.num_params
    linears = 2 * t * 12 * h * h  # qkv, proj, fc1, fc2: 3h² + h² + 4h² + 4h² per token, 2 FLOPs each
    gemm = 2 * (linears / FWD + 2 * linears / BWD) + 2 * t * h * v * (1 / FWD + 2 / BWD)  # 2 layers + logits
    per_layer = 2 * t * h + 4 * t * h + 2 * t * h + b * s * s * h  # 2 layernorms, GeLU, 2 adds, attention
    # + loss, final norm, the tied embedding's dense gradient and its add to the logits', copy
    kernels = 2 * per_layer * (CF + CB) + (t * v + t * h + v * h) * (CF + CB) + v * h * CF + psi * CF
    return gemm + kernels + (2 * 100 + 30) * 4e-6


def test_measured_profile_terms_hand_derived():
    # one rank, no checkpointing, fp32 on CPU: the compute by hand (above); Adam and clip per
    # parameter; no fixed overhead
    model = MODEL
    b = 4
    pred = predict(model, ParallelConfig(dp=1, mp=1), PrecisionConfig("fp32", "cpu"), TrainConfig(micro_batch=b), CPU,
                   attention="fused")  # fmt: skip
    h, s, psi = 64, 32, model.num_params
    assert pred.compute_s == pytest.approx(_one_rank_compute_by_hand(b))
    assert pred.optimizer_s == pytest.approx(psi * 6e-9) and pred.overhead_s == 0.0
    # two ranks on the 2-core host own a core each but slow each other (x1.25 measured), four
    # share the cores too (x2); stage 1's reduce-scatter and all-gather of 4-byte values cost
    # alpha + ring volume / bandwidth as measured, exposed (gloo reduces on the computing cores)
    two = predict(model, ParallelConfig(dp=2, mp=1, stage=1), PrecisionConfig("fp32", "cpu"),
                  TrainConfig(micro_batch=b), CPU, attention="fused")  # fmt: skip
    four = predict(model, ParallelConfig(dp=4, mp=1, stage=1), PrecisionConfig("fp32", "cpu"),
                   TrainConfig(micro_batch=b), CPU, attention="fused")  # fmt: skip
    assert two.compute_s == pytest.approx(1.25 * pred.compute_s)
    assert four.compute_s == pytest.approx(2.5 * pred.compute_s)
    assert two.dp_comm_s == pytest.approx(2e-4 + HALF / 5e8 + 3e-4 + HALF / 2.5e8)
    # materialized attention: the scores and context products as GEMMs, and a softmax pass over
    # a·b·s² scores, in place of the fused kernel
    mat = predict(model, ParallelConfig(dp=1, mp=1), PrecisionConfig("fp32", "cpu"), TrainConfig(micro_batch=b), CPU,
                  attention="materialized")  # fmt: skip
    scores = 2 * 2 * b * s * s * h  # QKᵀ and P·V, 2 FLOPs per multiply-add
    delta = 2 * (scores / FWD + 2 * scores / BWD + (4 * b * s * s - b * s * s * h) * (CF + CB))
    assert mat.compute_s - pred.compute_s == pytest.approx(delta)
    # bf16 storage computed in fp32: every weight cast up and every gradient cast down, 2 more copies
    bf16 = predict(model, ParallelConfig(dp=1, mp=1), PrecisionConfig("bf16", "cpu"), TrainConfig(micro_batch=b), CPU,
                   attention="fused")  # fmt: skip
    assert bf16.compute_s - pred.compute_s == pytest.approx(2 * psi * CF)


def test_collective_curve_is_read_between_and_beyond_its_points():
    # log-log between measured messages; the smallest one's time below them; the fitted
    # bandwidth beyond the largest; `calls` calls each of its share of the volume
    hw = dataclasses.replace(CPU, collective_table=(("all_reduce", 2, 1e3, 1e-4), ("all_reduce", 2, 1e5, 1e-2)) + tuple(
        r for r in CPU.collective_table if r[0] != "all_reduce"))  # fmt: skip
    group = network.ring(2, 1, hw, DEFAULT)
    assert group.all_reduce(1e4) == pytest.approx(1e-3)  # volume 1e4: halfway in log, 1e-3 s
    assert group.all_reduce(10.0) == pytest.approx(1e-4)
    assert group.all_reduce(1e6 + 1e5) == pytest.approx(1e-2 + 1e6 / 1e9)
    assert group.all_reduce(2e4, calls=2) == pytest.approx(2e-3)
    assert network.ring(1, 1, hw, DEFAULT).all_reduce(1e6) == 0.0


def test_ranks_wait_for_each_other_as_measured():
    # a sync after 2 ms of compute costs 0.4 ms, after 20 ms 2 ms, after 200 ms 16 ms: linear
    # between the points and from nothing, proportional beyond
    rows = ((2, 0.002, 4e-4), (2, 0.02, 2e-3), (2, 0.2, 0.016))
    hw = dataclasses.replace(CPU, sync_table=rows)
    assert network.sync_wait(rows, 2, 0.001) == pytest.approx(2e-4)
    assert network.sync_wait(rows, 2, 0.011) == pytest.approx(4e-4 + 1.6e-3 / 2)
    assert network.sync_wait(rows, 2, 0.4) == pytest.approx(0.032)
    assert network.sync_wait(rows, 1, 0.4) == 0.0 and network.sync_wait((), 2, 0.4) == 0.0
    # MP: each all-reduce of the step; DP stages 0-2: once per step; stage 3: once per micro-batch
    mp, dp = network.sync_waits(hw, 1, 2, 0, 40, 0.4, 2)
    assert mp == pytest.approx(40 * network.sync_wait(rows, 2, 0.01)) and dp == 0.0
    assert network.sync_waits(hw, 2, 1, 2, 40, 0.4, 4) == (0.0, pytest.approx(0.032))
    assert network.sync_waits(hw, 2, 1, 3, 40, 0.4, 4) == (0.0, pytest.approx(4 * network.sync_wait(rows, 2, 0.1)))
    # in a prediction they join the communication terms, and nothing else moves
    train, precision = TrainConfig(micro_batch=4), PrecisionConfig("fp32", "cpu")
    plain = predict(MODEL, ParallelConfig(dp=2, stage=1), precision, train, CPU, attention="fused")
    waits = predict(MODEL, ParallelConfig(dp=2, stage=1), precision, train, hw, attention="fused")
    assert waits.dp_comm_s - plain.dp_comm_s == pytest.approx(network.sync_wait(rows, 2, plain.compute_s))
    assert waits.compute_s == plain.compute_s and waits.mp_comm_s == plain.mp_comm_s == 0.0


def test_mp_all_reduces_wait_what_the_engine_steps_measured():
    # MP reads the engine's own MP steps (mp_sync_table) where they were measured, the matmul
    # benchmark's table where not; DP keeps the matmul benchmark's
    matmul, steps = ((2, 0.002, 4e-4), (2, 0.02, 2e-3)), ((2, 0.001, 1e-3), (2, 0.01, 3e-3))
    train, precision = TrainConfig(micro_batch=4, grad_accum=2), PrecisionConfig("fp32", "cpu")
    mp2 = ParallelConfig(mp=2)
    plain = predict(MODEL, mp2, precision, train, CPU, attention="fused")
    calls = network.mp_calls_per_step(MODEL.layers, False, 2)
    assert calls == 2 * (4 * MODEL.layers + 2 + 3) + 1  # per micro-batch, and the gradient norm once
    for tables, rows in (({"sync_table": matmul}, matmul), ({"sync_table": matmul, "mp_sync_table": steps}, steps)):
        got = predict(MODEL, mp2, precision, train, dataclasses.replace(CPU, **tables), attention="fused")
        wait = calls * network.sync_wait(rows, 2, plain.compute_s / calls)
        assert got.mp_comm_s - plain.mp_comm_s == pytest.approx(wait) and wait > 0
        assert got.compute_s == plain.compute_s and got.dp_comm_s == plain.dp_comm_s
    # the gradient norm's all-reduce is on the curve: 8 bytes, the all-reduce's α
    norm = network.mp_norm_time(2, CPU, DEFAULT)
    assert norm == pytest.approx(COLLECTIVES[0][2] + 8 / COLLECTIVES[0][3], rel=0.05) and norm > 0
    assert network.mp_norm_time(1, CPU, DEFAULT) == 0.0


def test_unknown_attention_is_refused():
    with pytest.raises(InputError, match="attention"):
        predict(
            ModelConfig(layers=2, hidden=64, heads=4),
            ParallelConfig(),
            PrecisionConfig(),
            TrainConfig(),
            CPU,
            attention="sparse",
        )


def test_calibrate_refuses_a_bad_device():
    with pytest.raises(InputError, match="device"):
        calibrate.calibrate("tpu")


def _fake_clock(monkeypatch, slow_pass: int):
    """Replace the benchmarks' timers: a stacked forward + backward of leaves of n elements in all
    takes n ns forward and 2n ns backward, 3x as long in sweep `slow_pass` (a slow spell), and a
    timed loop 1.28 ms per call. Returns the per-sweep call log."""
    calls = []

    def stacked(make, device, min_s=0.02, first=None):
        forward, leaves = first or make()
        out = forward()  # the benchmark's own kernel runs, forward and backward, once
        out.backward(calibrate.torch.ones_like(out))
        n = sum(t.numel() for t in leaves)
        calls.append(n)
        slow = 3.0 if (len(calls) - 1) // per_sweep[0] == slow_pass else 1.0
        return slow * n * 1e-9, slow * 2 * n * 1e-9

    per_sweep = [1]
    monkeypatch.setattr(calibrate_kernels, "stacked_forward_backward", stacked)
    monkeypatch.setattr(calibrate_kernels, "timed", lambda fn, device, min_s=0.05, reps=3: 1.28e-3)
    return calls, per_sweep


def test_linear_benchmark_on_a_tiny_grid(monkeypatch):
    monkeypatch.setitem(calibrate_kernels.GEMM_DIMS, "cpu", (8, 16))
    calls, per_sweep = _fake_clock(monkeypatch, slow_pass=1)
    per_sweep[0] = 8  # shapes per sweep of the grid
    lines = []
    rows = calibrate_kernels.gemm_table("cpu", calibrate.torch.float32, lines.append, passes=3)
    assert [r[:3] for r in rows] == [[m, n, k] for m in (8, 16) for n in (8, 16) for k in (8, 16)]
    assert len(calls) == 3 * 8 and len(lines) == 1 and "linear" in lines[0]
    for m, n, k, fwd, bwd in rows:  # by hand: x (m·k), w (n·k) and b (n) take (mk + nk + n) ns forward
        ns = (m * k + n * k + n) * 1e-9  # the slow second sweep is the median's outlier, not its value
        assert fwd == pytest.approx(2 * m * n * k / ns) and bwd == pytest.approx(4 * m * n * k / (2 * ns))


def test_kernel_benchmark_times_every_kernel_the_model_reads(monkeypatch):
    monkeypatch.setitem(calibrate_kernels.KERNEL_NUMEL, "cpu", (2**14,))
    monkeypatch.setitem(calibrate_kernels.OPTIMIZER_NUMEL, "cpu", (2**10, 2**12))
    monkeypatch.setitem(calibrate_kernels.ATTENTION_SHAPES, "cpu", ((2, 16, 8),))
    _fake_clock(monkeypatch, slow_pass=-1)
    rows = calibrate_kernels.kernel_table("cpu", calibrate.torch.float32, lambda _: None, passes=1)
    assert {r[0] for r in rows} == set(KERNELS)  # what profile_file requires of a measured profile
    for name, size, fwd, bwd in rows:
        if name == "attention":  # size b·heads·s²·d; its leaves q, k, v hold 3·b·heads·s·d elements
            assert size == 2 * 16 * 16 * 8 and (fwd, bwd) == pytest.approx((3 * 2 * 16 * 8e-9, 6 * 2 * 16 * 8e-9))
        elif name in ("copy", "adam", "clip"):  # timed in a loop, forward only
            assert (fwd, bwd) == (1.28e-3, 0.0)
        else:  # stacked: the fake's n ns over all the leaves, of which the first is the size
            assert bwd == pytest.approx(2 * fwd) and fwd >= size * 1e-9
    assert [r[1] for r in rows if r[0] in ("adam", "clip")] == [2**10, 2**10, 2**12, 2**12]  # parameters


def test_optimizer_is_read_at_the_parameters_a_rank_updates():
    # Adam 1 ns/param at 1M parameters and 2 ns at 100M (a shard that outgrows the cache): 10M,
    # halfway in log size, at 1.5 ns; the clip only when clipping; beyond the table its end rate
    hw = dataclasses.replace(CPU, kernel_table=tuple(r for r in CPU.kernel_table if r[0] != "adam")
                             + (("adam", 1e6, 1e-3, 0.0), ("adam", 1e8, 0.2, 0.0)))  # fmt: skip
    assert compute.optimizer_time(1e7, hw, DEFAULT, clip=False) == pytest.approx(1.5e-9 * 1e7)
    assert compute.optimizer_time(1e7, hw, DEFAULT) == pytest.approx(2.5e-9 * 1e7)  # + 1 ns of clip
    assert compute.optimizer_time(1e9, hw, DEFAULT, share=2, clip=False) == pytest.approx(2 * 2e-9 * 1e9)


def test_op_count_of_the_model(monkeypatch):
    # The oracle: one Block's ops counted on its own with a dispatch mode of this test's, forward and
    # backward from a leaf input (whose gradient accumulation, one detach, a block inside the model
    # does not have); the rest of the model is the one-layer model's count less the block's.
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from zerobench.engine.model import GPT

    class Ops(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = GPT(ModelConfig(layers=1, hidden=64, heads=4, seq=16, vocab=64))
    x, grad, idx = torch.randn(2, 16, 64, requires_grad=True), torch.ones(2, 16, 64), torch.randint(0, 64, (2, 16))
    with Ops() as block:
        model.blocks[0](x).backward(grad)
    model.zero_grad(set_to_none=True)
    with Ops() as whole:
        model(idx, idx).backward()
    # the per-op cost: the chain's 64 ops, each a forward and a backward node, in 1.28 ms
    monkeypatch.setattr(calibrate_kernels, "timed", lambda fn, device, min_s=0.05, reps=3: 1.28e-3)
    per_op, (per_layer, fixed) = calibrate_kernels.op_overhead("cpu", lambda _: None)
    assert per_op == pytest.approx(1.28e-3 / (2 * 64))
    assert per_layer == block.n - 1 and fixed == whole.n - per_layer


def test_model_vs_measured_rows_from_a_record():
    from zerobench.artifacts.tables.vs_measured import model_vs_measured

    record = dict(
        status="ok", model="tiny", layers=2, hidden=64, heads=4, seq=32, vocab=256, dp=2, mp=1, stage=1,
        bucket_bytes=2**20, checkpoint_activations=False, partition_activations=False, offload_activations=False,
        contiguous_buffers=False, precision="fp32", device="cpu", micro_batch=4, grad_accum=1, steps=2,
        num_params=1000, step_time_s=0.5, step_time_min_s=0.4, step_time_max_s=0.6, rss_growth_bytes=64 * 2**20,
        comm={"reduce_scatter/dp": {"seconds": 0.2}, "all_gather/dp": {"seconds": 0.1}},
    )  # fmt: skip
    # the step judged on the system allocator, the memory on jemalloc (zerobench/runtime/allocator.py)
    jemalloc = dict(record, allocator="jemalloc")
    df = model_vs_measured([record, jemalloc, dict(record, status="oom", error="over budget")], CPU)
    assert len(df) == 3
    step, mem, oom = df.iloc[0], df.iloc[1], df.iloc[2]
    # by hand (MODEL at dp 2, stage 1, b 4): both ranks' compute x1.25 (they share the host), the
    # reduce-scatter and all-gather of half the fp32 gradients on the measured curves, Adam and clip
    # (6 ns per parameter) over half the parameters at the same x1.25
    psi = MODEL.num_params
    by_hand = 1.25 * _one_rank_compute_by_hand(4) + (2e-4 + HALF / 5e8 + 3e-4 + HALF / 2.5e8) + 1.25 * psi / 2 * 6e-9
    assert step.ours == pytest.approx(by_hand) and step.expected == 0.5 and step.allocator == "system"
    assert step.error_pct == pytest.approx(100 * (by_hand - 0.5) / 0.5)
    assert step.measured_comm_s == pytest.approx(0.15)  # 0.3 s of collectives over 2 steps
    # memory: the engine's peak as its trace counts it (perfmodel/engine_memory.py is held to it),
    # plus the runtime's own
    spec = TrialSpec(MODEL, ParallelConfig(dp=2, stage=1, bucket_bytes=2**20), PrecisionConfig("fp32", "cpu"),
                     TrainConfig(micro_batch=4))  # fmt: skip
    peak = trace_step(spec)["peak_bytes"] + 16 * 2**20
    assert mem.expected == 64 and mem.ours == pytest.approx(peak / 2**20)
    assert mem.allocator == "jemalloc" and "memory" in mem.key and "step" not in mem.key
    assert oom.status == "oom" and oom.ours != oom.ours  # NaN: nothing predicted for a failed trial


def test_model_vs_measured_judges_a_trials_step_on_the_median_of_its_runs():
    from zerobench.artifacts.tables.vs_measured import model_vs_measured

    record = TINY_STEP
    # three runs of one trial, the second in a slow spell, and a run of another micro-batch
    runs = [dict(record, step_time_s=t) for t in (0.50, 0.80, 0.46)] + [dict(record, micro_batch=8, step_time_s=1.0)]
    df = model_vs_measured(runs, CPU)
    assert len(df) == 2 and df.runs.tolist() == [3, 1]
    assert df.expected.tolist() == [0.50, 1.0]  # the slow run does not move the median
    assert df.measured_runs_s.iloc[0] == "0.5 0.8 0.46"
    assert df.runs_spread_pct.iloc[0] == pytest.approx(100 * (0.80 - 0.46) / 0.50)


def test_external_runs_file_is_cited_split_and_predictable():
    from zerobench.fitting.external import DATA, summary, validate

    df = validate()
    assert len(df) >= 20 and df.citation.str.len().min() > 20
    assert set(df.split) == {"fit", "validation"} and df.source.nunique() >= 3
    assert {"a100-80gb", "h100-80gb"} <= set(df.hardware)
    assert df.predicted.notna().all() and (df.predicted > 0).all()
    table = summary(df)
    assert table.points.iloc[-1] == (df.split == "validation").sum()
    assert table.mape_pct.iloc[-1] <= 15.0  # the target on the validation rows (8.0% when written)
    assert DATA.name == "external_runs.csv"


def test_largest_model_under_a_budget_counts_more_than_model_states():
    from zerobench.artifacts.tables.vs_measured import _configs, largest_under_budget, predicted_peak_bytes
    from zerobench.perfmodel.feasibility import breakdown

    cap = 64 * 2**20
    record = dict(
        model="tiny", layers=2, hidden=256, heads=8, seq=128, vocab=256, dp=4, mp=1, stage=2, bucket_bytes=2**21,
        checkpoint_activations=False, partition_activations=False, offload_activations=False,
        contiguous_buffers=False, precision="bf16", device="cpu", micro_batch=1, grad_accum=1, mem_cap_bytes=cap,
    )  # fmt: skip
    params = largest_under_budget(record, CPU)
    model, parallel, precision, train = _configs(record)
    per_layer = dataclasses.replace(model, layers=2).num_params - dataclasses.replace(model, layers=1).num_params
    layers = int((params - model.num_params) // per_layer) + 2  # the deepest whole model below the crossing
    budget = dataclasses.replace(CPU, memory_bytes=float(cap))
    at, above = (
        breakdown(dataclasses.replace(model, layers=n), parallel, precision, 1, budget, DEFAULT, "fused")
        for n in (layers, layers + 1)
    )
    assert at.fits and not above.fits  # the boundary, found by bisection, checked one layer either side
    # between them, the budget is crossed where the line through their peaks meets it
    share = (params - dataclasses.replace(model, layers=layers).num_params) / per_layer
    assert at.total_bytes + share * (above.total_bytes - at.total_bytes) == pytest.approx(cap)
    assert predicted_peak_bytes(record, budget, layers) == at.total_bytes
    assert params < cap / (2 + 2 / 4 + 12 / 4)  # below the bare formula: activations and buffers count


def test_mp_step_benchmark_reads_the_engine_record(monkeypatch):
    # three rounds of each shape: 14 MP all-reduces a step (tiny's 2 layers: 2 x 4 + 2 + 3, and the
    # gradient norm) taking 20, 50 (a slow spell) and 10 ms per step: the median, 20 ms, is kept
    from zerobench.microbench import engine_runs as calibrate_runs

    calls, ran, spent = 14, [], iter([0.02, 0.05, 0.01] * 3)

    def fake_run(args):
        ran.append(args)
        return {"steps": 10, "step_time_s": 0.1, "comm": {"all_reduce/mp": {"calls": 10 * calls,
                                                                            "seconds": 10 * next(spent)}}}  # fmt: skip

    monkeypatch.setattr(calibrate_runs, "_run", fake_run)
    shapes = calibrate_runs.MP_STEP_SHAPES
    monkeypatch.setattr(calibrate_runs, "MP_STEP_SHAPES", shapes[:1])
    # a profile whose MP all-reduce takes 1 ms at any size, on its curve and its α–β line alike
    flat = dataclasses.replace(
        CPU, collectives=(("all_reduce", 2, 1e-3, 1e18), *COLLECTIVES[1:]),
        collective_table=(("all_reduce", 2, 1.0, 1e-3), ("all_reduce", 2, 1e12, 1e-3),
                          *(r for r in CPU.collective_table if r[0] != "all_reduce")),
    )  # fmt: skip
    rows = calibrate_runs.mp_step_waits(flat, lambda _: None, rounds=3)
    (hidden, seq, b), ((size, between, wait),) = shapes[0], rows
    assert len(ran) == 3 and all(a[a.index("--hidden") + 1] == str(hidden) for a in ran)
    assert all(a[a.index("--mp") + 1] == "2" for a in ran)
    assert size == 2 and wait == pytest.approx(0.02 / calls - 1e-3)  # the median run's per call, less the curve
    # between two calls: the modelled compute of an MP 2 rank of tiny at this shape (fused attention,
    # the kernel the engine runs), by hand as in _one_rank_compute_by_hand, x1.25 for two ranks
    h, s, v, layers = hidden, seq, MODEL.vocab, MODEL.layers
    t, psi = b * s, dataclasses.replace(MODEL, hidden=h, seq=s).num_params
    lin = 2 * t * 6 * h * h  # qkv, proj, fc1, fc2 halved; QKᵀ and P·V run inside the fused kernel
    gemm = layers * (lin / FWD + 2 * lin / BWD) + 2 * t * h * (v / 2) * (1 / FWD + 2 / BWD)
    layer = 2 * t * h + t * 4 * h / 2 + 2 * t * h + b * s * s * h / 2  # 2 layernorms, GeLU, 2 adds, attention
    kernels = layers * layer * (CF + CB) + (t * v / 2 + t * h + v / 2 * h) * (CF + CB) + (v / 2 * h + psi / 2) * CF
    compute = 1.25 * (gemm + kernels + (layers * 100 + 30) * 4e-6)
    assert between == pytest.approx(compute / calls)  # as modelled, not as the slow host ran it
    calls = 15  # an engine that runs another count than the model's is refused
    with pytest.raises(RuntimeError, match="15 MP all-reduces per step; the model counts 14"):
        calibrate_runs.mp_step_waits(CPU, lambda _: None, rounds=1)


def test_calibrate_takes_a_median_of_several_sweeps_unless_told(monkeypatch, tmp_path):
    # a GPU's first sweep loads each kernel lazily and picks cuBLAS algorithms: the median of the
    # default sweeps sets it aside (docs/gpu.md); one sweep only when asked for
    seen = []

    def fake(device, sizes, name, log, passes):
        seen.append(passes)
        raise RuntimeError("stop")

    monkeypatch.setattr(calibrate, "calibrate", fake)
    for passes in (None, 1):
        with pytest.raises(RuntimeError):
            calibrate.main("cuda", str(tmp_path / "p.json"), (2,), passes)
    assert seen == [calibrate_kernels.GEMM_PASSES, 1]
    assert calibrate_kernels.GEMM_PASSES >= 3  # a median that outvotes one odd sweep
