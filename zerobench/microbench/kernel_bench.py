"""The compute microbenchmarks of `zerobench calibrate`: each kernel one training step of this
engine runs, timed as the step runs it (through autograd, forward and backward apart, a fresh
output per call), on one core (CPU) or one GPU. perfmodel/kernels.py reads the results.

- `linear`: F.linear with a bias, the engine's every GEMM (model.py: qkv, proj, fc, the tied
  logits) over a grid of (tokens, fan-in, fan-out); forward one GEMM, backward two and a sum.
  Timed cold, as a step runs them (each weight read once per pass, every other layer between):
  a stack of copies forward, outputs kept, then backward in reverse (here the forward of a
  128-512-token linear ran 1.2-1.7x as long this way as in a loop on one copy).
- named kernels by size: `layernorm`, `gelu` (tanh form, as the model), `residual_add`,
  `cross_entropy` (log-softmax and NLL over t × V logits; `vocab_cross_entropy`, Megatron's over
  vocab-sharded logits, parallel/tensor_parallel.py, for mp > 1), `attention` (torch's fused
  scaled_dot_product_attention, causal; its size is heads·b·s²·d) and `softmax` (the
  materialized attention's pass, for the paper's 2020 kernel), `copy` (into an existing buffer),
  `embedding` (F.embedding's lookup and its dense weight gradient: a zeroed V·h tensor and the
  rows' scatter-add; its size is V·h).
- the step after backward by the parameters a rank updates: `adam` (zero/optimizer.py's
  ShardedAdam, fused on CPU) and `clip` (`global_grad_norm` + `clip_`); see `_optimizer_rows`.
- per-op cost: Python, dispatcher and autograd time of an op whose arithmetic is negligible, and
  the number of such ops a layer and the rest of the model run, counted on the plain model.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from zerobench.clock import device_clock, windowed_median
from zerobench.engine.config import ModelConfig, TrainConfig
from zerobench.engine.model import GPT
from zerobench.engine.parallel.comms import Comms
from zerobench.engine.parallel.tensor_parallel import TensorParallel, VocabShard, vocab_parallel_cross_entropy
from zerobench.engine.parallel.topology import Group
from zerobench.engine.zero.optimizer import ShardedAdam, clip_, global_grad_norm

# Linear grid per device: each dimension from these values (log-spaced); shapes above the FLOP
# cap are skipped (saturated: the model reads them halved into the measured range, kernels.gemm_rate).
GEMM_DIMS = {"cpu": (64, 256, 1024, 4096, 16384), "cuda": (256, 1024, 4096, 16384)}
GEMM_FLOP_CAP = {"cpu": 8e9, "cuda": 2e12}
# sweeps of the linear grid and of the kernels; each row keeps its median, which 5 sweeps hold against
# two odd ones (a GPU's first loads each kernel lazily and picks cuBLAS algorithms; docs/gpu.md)
GEMM_PASSES = 5
# bytes a stack of linears outgrows: 4x a CPU core's L2 (2 MiB here), past a GPU's L2 (50-60 MiB)
EVICT_BYTES = {"cpu": 8 * 2**20, "cuda": 256 * 2**20}
KERNEL_NUMEL = {"cpu": (2**14, 2**17, 2**20, 2**23), "cuda": (2**20, 2**24, 2**27)}
# (b·heads, s, head size) of the attention benchmark, the sizes the sheets run
ATTENTION_SHAPES = {
    "cpu": ((8, 64, 32), (32, 128, 32), (48, 256, 64), (16, 512, 64)),
    "cuda": ((64, 1024, 64), (128, 2048, 128), (64, 4096, 128)),
}
# parameters of the optimizer benchmark (16 B each: fp32 parameter, gradient and two moments)
# (CPU: half-octaves where a shard outgrows the cache here, between 2M and 8M parameters)
OPTIMIZER_NUMEL = {
    "cpu": tuple(int(2 ** (e / 2)) for e in range(40, 47)) + (2**24, 2**25, 2**26),
    "cuda": (2**24, 2**26, 2**28),
}
CHAIN = 64  # ops in the per-op cost benchmark


def timed(fn, device: str, min_s: float = 0.05, reps: int = 3) -> float:
    """Median seconds of `fn()` over `reps` timings, each repeating it for at least `min_s`, on the
    device clock (each call's work done before the clock is read, the warm-up's before the first)."""
    return windowed_median(fn, device_clock(device), min_s, reps)


def stacked_forward_backward(make, device: str, min_s: float = 0.02, first=None) -> tuple[float, float]:
    """(forward s, backward s) per call of `make()`'s (forward closure, leaves), run as a step runs
    its layers: a stack of independent copies (enough that they outgrow EVICT_BYTES) through
    forward in order, then backward in reverse, so that each copy's weight and saved input were
    evicted by the others before it is used (rotating buffers). The mean over `min_s` or one pass,
    after a pass that warms up; the callers take medians over sweeps. `first`: a copy the caller
    already made, the stack's first."""
    first = first or make()
    out = first[0]()
    nbytes = (sum(t.numel() for t in first[1]) + out.numel()) * out.element_size()
    stack = [first] + [make() for _ in range(min(256, max(1, -(-EVICT_BYTES[device] // nbytes))))]
    clock = device_clock(device)
    grad = torch.randn_like(out)
    for warm in (True, False):
        f = b = 0.0
        n, t_end = 0, time.perf_counter() + min_s
        while n == 0 or (not warm and time.perf_counter() < t_end):
            t0 = clock()
            outs = [forward() for forward, _ in stack]
            t1 = clock()
            for out in reversed(outs):
                out.backward(grad)
            f, b, n = f + t1 - t0, b + clock() - t1, n + len(stack)
            for _, leaves in stack:
                for t in leaves:
                    t.grad = None
    return f / n, b / n


def _leaf(*shape, device, dtype) -> torch.Tensor:
    return torch.randn(*shape, device=device, dtype=dtype).requires_grad_()


def median_rows(tables: list[list], first: int) -> list[list]:
    """Row by row over equal tables (sweeps, runs): the first `first` fields of the first table's
    row, then the median of each later field over the tables."""
    return [
        [*rows[0][:first], *(statistics.median(col) for col in zip(*(r[first:] for r in rows)))]
        for rows in zip(*tables)
    ]


def gemm_table(device: str, dtype: torch.dtype, log, passes: int = GEMM_PASSES) -> list[list]:
    """Rows (tokens m, fan-out n, fan-in k, forward FLOP/s, backward FLOP/s) of F.linear, cold:
    each shape's median over `passes` sweeps of the whole grid, so that a shared host's slow
    second lands on one sample of a shape rather than on all of them."""
    dims = GEMM_DIMS[device]
    shapes = [(m, n, k) for m in dims for n in dims for k in dims if 2 * m * n * k <= GEMM_FLOP_CAP[device]]

    def make(m, n, k):
        x, w, b = (
            _leaf(m, k, device=device, dtype=dtype),
            _leaf(n, k, device=device, dtype=dtype),
            _leaf(n, device=device, dtype=dtype),
        )
        return (lambda: F.linear(x, w, b)), [x, w, b]

    samples = [[stacked_forward_backward(lambda s=s: make(*s), device) for s in shapes] for _ in range(passes)]
    rows = [
        [m, n, k, 2 * m * n * k / fwd, 4 * m * n * k / max(bwd, 1e-9)]
        for (m, n, k), (fwd, bwd) in zip(shapes, median_rows(samples, 0), strict=True)
    ]
    log(
        f"linear: {len(rows)} shapes x {passes} passes, {dtype}, forward best {max(r[3] for r in rows) / 1e9:.1f} "
        f"GFLOP/s, backward best {max(r[4] for r in rows) / 1e9:.1f}"
    )
    return rows


def _kernel_makers(numel: int, device: str, dtype) -> dict:
    """name -> make(), each call of which gives (forward closure, leaves) over fresh tensors of
    about `numel` elements (`copy`: no leaves, forward only)."""
    h, tokens = 256, max(numel // 8192, 1)  # h: row width of the normalised tensors; logits rows

    def leaf(*shape, dt=dtype):
        return _leaf(*shape, device=device, dtype=dt)

    def layernorm():
        x, w, b = leaf(numel // h, h), leaf(h), leaf(h)
        return (lambda: F.layer_norm(x, (h,), w, b, eps=1e-5)), [x, w, b]

    def gelu():
        x = leaf(numel // h, h)
        return (lambda: F.gelu(x, approximate="tanh")), [x]

    def residual_add():  # backward: the residual stream's two gradient paths meet in one add
        x, y = leaf(numel // h, h), leaf(numel // h, h)
        return (lambda: x + y), [x, y]

    def loss(vocab_parallel: bool):  # over the engine's fp32 logits
        logits, target = leaf(tokens, 8192, dt=torch.float32), torch.randint(0, 8192, (tokens,), device=device)
        if not vocab_parallel:
            return (lambda: F.cross_entropy(logits, target)), [logits]
        # Megatron's loss over vocab-sharded logits (mp > 1): its own passes, not the fused kernel
        tp, shard = TensorParallel(Group("mp", 1, 0), Comms()), VocabShard(8192, 0, 8192)  # a group of one
        return (lambda: vocab_parallel_cross_entropy(logits, target, shard, tp)), [logits]

    def softmax():
        scores = leaf(numel // 128, 128)
        return (lambda: F.softmax(scores, dim=-1)), [scores]

    def copy():  # into an existing buffer, as the engine's hooks copy each gradient into its flat slot
        src, dst = torch.randn(numel, device=device, dtype=dtype), torch.empty(numel, device=device, dtype=dtype)
        return (lambda: dst.copy_(src)), []

    def embedding():  # the lookup of a micro-batch's tokens in the V·h tied embedding matrix
        table = leaf(numel // h, h)
        idx = torch.randint(0, table.shape[0], (512,), device=device)
        return (lambda: F.embedding(idx, table)), [table]

    return {
        "layernorm": layernorm,
        "gelu": gelu,
        "residual_add": residual_add,
        "cross_entropy": lambda: loss(False),
        "vocab_cross_entropy": lambda: loss(True),
        "softmax": softmax,
        "copy": copy,
        "embedding": embedding,
    }


def kernel_table(device: str, dtype: torch.dtype, log, passes: int = GEMM_PASSES) -> list[list]:
    """Rows (kernel, size, forward s, backward s); size in elements, attention's heads·b·s²·d.
    Each the median over `passes` sweeps of every size, as the linear grid."""
    rows = median_rows([_kernel_sweep(device, dtype) for _ in range(passes)], 2)
    for size in sorted({r[1] for r in rows}):
        done = [f"{r[0]} {(r[2] + r[3]) * 1e3:.2f} ms" for r in rows if r[1] == size]
        log(f"kernels at size {size:.0f} (forward + backward, median of {passes}): " + ", ".join(done))
    return rows


def _kernel_sweep(device: str, dtype: torch.dtype) -> list[list]:
    """One sweep: (kernel, size, forward s, backward s) of every named kernel at every size, timed
    as the linears are (a stack of copies, forward in order, backward reversed: in a loop over one
    copy layernorm ran 0.53x as long, GeLU 0.92x, attention 0.88x); `copy` (forward only) in a loop."""
    makers = [
        (None, name, make)
        for numel in KERNEL_NUMEL[device]
        for name, make in _kernel_makers(numel, device, dtype).items()
    ]

    def attention(bh, s, d):
        q, k, v = (_leaf(1, bh, s, d, device=device, dtype=dtype) for _ in range(3))
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), [q, k, v]

    shapes = ATTENTION_SHAPES[device]  # (b·heads, s, d); size b·heads·s²·d
    makers += [(bh * s * s * d, "attention", lambda a=(bh, s, d): attention(*a)) for bh, s, d in shapes]
    rows = []
    for size, name, make in makers:
        fn, leaves = make()
        if leaves:  # size: the first leaf's elements (the loss: t x V logits; embedding: V x h) unless given
            rows.append([name, size or leaves[0].numel(), *stacked_forward_backward(make, device, first=(fn, leaves))])
        else:
            rows.append([name, fn().numel(), timed(fn, device, 0.02), 0.0])
    return rows + _optimizer_rows(device)


def _optimizer_rows(device: str) -> list[list]:
    """Rows ("adam" | "clip", parameters, seconds per step, 0.0): Adam and the clip over one fp32
    piece of each size, in a loop. Sizes span the last-level cache's edge because the time per
    parameter changes across it, and the model reads a rank at its own count (docs/perfmodel.md,
    "Calibrated profiles", gives the readings)."""

    def times(n: int) -> tuple[float, float]:  # its tensors freed on return: 2^26 holds 1 GiB
        p = torch.zeros(n, device=device)
        g, opt, comms = torch.randn_like(p), ShardedAdam([p], TrainConfig()), Comms()
        clip = timed(lambda: clip_([g], global_grad_norm([g], comms, []), 1.0), device)
        return timed(lambda: opt.step([g]), device), clip

    rows = []
    for n in OPTIMIZER_NUMEL[device]:
        adam, clip = times(n)
        rows += [["adam", n, adam, 0.0], ["clip", n, clip, 0.0]]
    return rows


class _OpCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def op_overhead(device: str, log) -> tuple[float, tuple[int, int]]:
    """(seconds per op of negligible arithmetic, forward + backward; (ops per layer, ops of the
    rest of the model) counted on the plain model's forward and backward)."""

    x = torch.ones(1, device=device, requires_grad=True)

    def chain():
        y = x
        for _ in range(CHAIN):
            y = y * 1.0
        y.backward()
        x.grad = None

    per_op = timed(chain, device) / (2 * CHAIN)  # each op: its forward and its backward node
    counts = []
    for layers in (1, 2):
        model = GPT(ModelConfig(layers=layers, hidden=64, heads=4, seq=16, vocab=64)).to(device)
        idx = torch.randint(0, 64, (2, 16), device=device)
        with _OpCount() as count:
            model(idx, idx).backward()
        counts.append(count.ops)
    per_layer = counts[1] - counts[0]
    log(f"ops: {per_op * 1e6:.1f} us each; {per_layer} per layer, {counts[0] - per_layer} besides")
    return per_op, (per_layer, counts[0] - per_layer)
