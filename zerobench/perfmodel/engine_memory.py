"""Peak memory of one rank of this engine, read from its code: what zerobench/engine/model.py,
parallel/ and zero/ hold at each moment of a training step where the device's live bytes can peak,
in the bytes `zerobench trace` counts (runtime/trace.py: the tensors, by the device they live
on) and held equal to it in tests/unit/test_engine_memory.py. On a GPU the caching allocator hands
out these bytes; what it holds beyond them, the CUDA context and NCCL's buffers are named apart
(`outside_allocator_bytes`, feasibility.py). On a CPU host, the runtime's own RSS that calibrate
measures is added (`runtime`).

Units: bytes per rank. t = b·s tokens of one micro-batch; U = t·h activations in the compute dtype
(`compute_bytes`: fp32 on a CPU host whatever the storage, the storage dtype on a GPU), replicated
over MP; P = t·h/N_m, one MP rank's slice.
- Model states (paper §5): the engine's own flat layout (zero/partition.py FlatLayout over this
  rank's parameter shapes, `rank_shapes`): stages 0–2 pack parameters in order into C_B buckets,
  padded to N_d; stage 3 makes one bucket per module (zero/stage3.py `module_layout`). Parameters
  are the padded flat buffer (stages 0–2) or this rank's chunks (stage 3); gradients the whole flat
  buffer (stages 0–1) or the chunks (2–3); Adam's fp32 moments and master the owned chunks
  (stage 0: everything).
- Forward keeps, per block (model.py Block, Megatron's split in parallel/tensor_parallel.py): the
  block's input, both LayerNorm outputs and the residual sum (4U), q/k/v, the attention output, the
  MLP's fc and GeLU outputs (12P), LayerNorm statistics and attention's log-sum-exp (fp32). With
  checkpointing, only each block's input (zero/activations.py: whole, 1/N_m with P_a, on the host
  with P_a+cpu, in one preallocated buffer with M_D), and the last block's output and ln_f's.
- The loss (model.py TiedVocab, or tensor_parallel.py's vocab-parallel cross-entropy over V/N_m
  columns): at MP 1 the logits, their fp32 copy and the fp32 log-softmax in forward, three fp32
  buffers at the start of backward; at MP > 1 the logits, their fp32 copy and the shifted logits
  that become the softmax and, in place, the gradient.
- Backward, block by block (with checkpointing, each block is recomputed first: its input gathered
  (P_a) or reloaded (P_a+cpu), its forward's tensors rebuilt beside the incoming gradient): the
  moments where the most is alive, each counted; the output layer's gradient of the tied embedding
  is held from the loss to the lookup's.
- Gradient buckets in flight (zero/stage1.py, stage2.py): stage 2 stages each bucket's gradients
  until it is reduce-scattered, with at most `MAX_IN_FLIGHT` reductions outstanding beside the
  bucket being filled; stage 1 keeps every reduced chunk until backward ends.
- The step: one piece's fp32 gradient at a time (zero/core.py), 16-bit gradients only.
- The token ids: each rank holds its own slice of the step's sequences on the device, its
  grad_accum micro-batches (runtime/batches.py, engine/step.py), b·grad_accum·(s+1) int64.
"""

from __future__ import annotations

import math
from functools import lru_cache

from zerobench.engine.config import ModelConfig, ParallelConfig, PrecisionConfig
from zerobench.engine.zero.partition import MAX_IN_FLIGHT, FlatLayout
from zerobench.perfmodel.hardware_profile import CUDA_CONTEXT_BYTES, HardwareProfile

FP32 = 4  # bytes of an fp32 element: a CPU host's compute dtype, the loss's, Adam's, statistics'
TOKEN = 8  # bytes of a token id (int64)


def rank_shapes(model: ModelConfig, mp: int) -> list[tuple[str, tuple[int, ...]]]:
    """This MP rank's parameters, named and shaped as the engine's model has them, in
    `named_parameters` order (model.py; split as parallel/megatron.py splits them)."""
    h, f = model.hidden, 4 * model.hidden
    rows = -(-model.vocab // mp)  # the vocabulary padded to a multiple of N_m, one rank's rows
    shapes = [("wte", (rows, h)), ("wpe", (model.seq, h))]
    for i in range(model.layers):
        b = f"blocks.{i}."
        shapes += [
            (b + "ln1.weight", (h,)), (b + "ln1.bias", (h,)),
            (b + "attn.qkv.weight", (3 * h // mp, h)), (b + "attn.qkv.bias", (3 * h // mp,)),
            (b + "attn.proj.weight", (h, h // mp)), (b + "attn.proj.bias", (h,)),
            (b + "ln2.weight", (h,)), (b + "ln2.bias", (h,)),
            (b + "mlp.fc.weight", (f // mp, h)), (b + "mlp.fc.bias", (f // mp,)),
            (b + "mlp.proj.weight", (h, f // mp)), (b + "mlp.proj.bias", (h,)),
        ]  # fmt: skip
    return shapes + [("ln_f.weight", (h,)), ("ln_f.bias", (h,))]


def initial_draw_bytes(model: ModelConfig, mp: int) -> int:
    """The most one parameter's initial value holds while the engine is built (model.py
    `initial_values`): the whole parameter in fp32 and, for one MP splits (parallel/megatron.py),
    this rank's fp32 slice of it beside it (tensor_parallel.py `Split.local`)."""
    h, f, rows = model.hidden, 4 * model.hidden, -(-model.vocab // mp)
    if mp == 1:  # nothing split: the value drawn is the parameter
        return FP32 * h * max(model.vocab, model.seq, f)
    split = max((model.vocab, rows), (f, f // mp), key=sum)  # the vocabulary's rows, or an MLP weight's
    return FP32 * h * max(sum(split), model.seq)  # wpe is replicated: drawn alone


# the modules that own parameters, in `named_modules` order, and how many parameters each owns
_BLOCK_MODULES = (2, 2, 2, 2, 2, 2)  # ln1, attn.qkv, attn.proj, ln2, mlp.fc, mlp.proj


@lru_cache(maxsize=256)
def flat_layout(
    model: ModelConfig, mp: int, dp: int, stage: int, bucket_numel: int, threshold: int
) -> tuple[FlatLayout, int]:
    """The engine's own layout of this rank's parameters: C_B buckets packed in order (stages 0–2,
    zero/core.py `packed_layout`) or one bucket per module, small tensors packed apart (stage 3,
    zero/stage3.py `module_layout`), and how many of its buckets are partitioned (at stage 3 those
    before the packed small tensors; every bucket otherwise)."""
    shapes = rank_shapes(model, mp)
    if stage < 3:
        layout = FlatLayout(shapes, dp, bucket_numel)
        return layout, len(layout.buckets)
    owners = [[0, 1]]  # the GPT itself owns wte and wpe
    i = 2
    for _ in range(model.layers):
        for n in _BLOCK_MODULES:
            owners.append(list(range(i, i + n)))
            i += n
    owners.append([i, i + 1])  # ln_f
    numel = [math.prod(s) for _, s in shapes]
    groups = [[j for j in g if numel[j] > threshold] for g in owners]
    groups = [g for g in groups if g]
    managed = len(groups)
    rest = [j for j in range(len(shapes)) if numel[j] <= threshold]
    if rest:
        packed = FlatLayout([shapes[j] for j in rest], 1, bucket_numel)
        groups += [[rest[k] for k in b.slots] for b in packed.buckets]
    return FlatLayout(shapes, dp, groups=groups), managed


def compute_bytes(precision: PrecisionConfig, hw: HardwareProfile) -> int:
    """Bytes per activation element: the compute dtype's. A CPU host computes in fp32 whatever the
    storage (config.PrecisionConfig); a GPU in the storage dtype. The hardware decides, not the
    precision's device field: a GPU profile modelled from a CPU command line is still a GPU."""
    return FP32 if hw.ranks_share_compute else precision.bytes_pgk[0]


def model_states(layout: FlatLayout, stage: int, managed: int, precision: PrecisionConfig) -> dict[str, float]:
    """param, grad and optimizer bytes of the engine built on `layout` (the module docstring)."""
    p, g = precision.bytes_pgk[:2]
    k = 2 * FP32 + (FP32 if p != FP32 else 0)  # Adam's moments, and an fp32 master of 16-bit weights
    padded, shard = layout.padded_numel, layout.shard_numel
    if stage == 3:  # managed buckets chunked, persistent ones whole on every rank
        chunks = sum(b.chunk for b in layout.buckets[:managed])
        whole = sum(b.padded for b in layout.buckets[managed:])
        return {"param_bytes": p * (chunks + whole), "grad_bytes": g * shard, "optimizer_bytes": k * shard}
    return {
        "param_bytes": p * padded,
        "grad_bytes": g * (padded if stage < 2 else shard),
        "optimizer_bytes": k * (padded if stage == 0 else shard),
    }


class _Buckets:
    """Gradient buffers alive in backward (zero/stage1.py, stage2.py), delivered one parameter at a
    time in backward's order: stage 2 stages a bucket from its first gradient until its
    reduce-scatter is waited for (at most `MAX_IN_FLIGHT` outstanding, the oldest waited for when
    a new one starts); stage 1 allocates each bucket's reduced chunk when it starts and keeps it
    until backward ends. Stage 0 reduces in place; one DP rank reduces nothing."""

    def __init__(self, layout: FlatLayout, stage: int, dp: int, g: int, accumulating: bool):
        self.layout, self.stage, self.g = layout, stage, g
        # after a step's first micro-batch, stage 2 reduce-scatters into a chunk-sized buffer that
        # is added to the rank's gradients once the reduction is done
        self.out = accumulating and stage != 1
        self.active = dp > 1 and stage in (1, 2, 3)
        self.pending = [len(b.slots) for b in layout.buckets]
        self.staged: dict[int, float] = {}
        self.in_flight: list[int] = []
        self.bytes = 0.0

    def deliver(self, j: int) -> float:
        """Parameter j's gradient handed over; returns the bytes alive at that moment (before its
        bucket, if complete, is reduced)."""
        if not self.active:
            return 0.0
        b = self.layout.slots[j].bucket
        bucket = self.layout.buckets[b]
        if self.stage != 1 and b not in self.staged:
            self.staged[b] = bucket.padded * self.g
            self.bytes += self.staged[b]
        at = self.bytes
        self.pending[b] -= 1
        if self.pending[b] == 0:
            if self.stage == 1:
                self.bytes += bucket.chunk * self.g
            else:
                while len(self.in_flight) > MAX_IN_FLIGHT - 1:
                    done = self.in_flight.pop(0)
                    self.bytes -= self.staged.pop(done) + self.out * self.layout.buckets[done].chunk * self.g
                self.in_flight.append(b)
                self.bytes += self.out * bucket.chunk * self.g
        return at


def engine_peak(
    model: ModelConfig,
    parallel: ParallelConfig,
    precision: PrecisionConfig,
    micro_batch: int,
    hw: HardwareProfile,
    grad_accum: int = 1,
) -> dict[str, float]:
    """Bytes per rank: the model states (param_bytes, grad_bytes, optimizer_bytes); `activations`,
    what forward keeps for backward; `transient`, the rest of the step's peak (the loss's buffers,
    a block rebuilt and its gradients, gradient buckets, the embedding's gradients, the step's
    fp32 piece, the token batch), at `moment`; `runtime` (a CPU host's own, measured by calibrate);
    `prefetch` (stage 3's gathers ahead of use, which a run holds and the one traced step does not);
    `outside` (on a GPU, the CUDA context and NCCL's buffers, outside the allocator). `tensor_peak`
    adds the tensors the trace counts."""
    peak = dict(_tensors(model, parallel, precision, micro_batch, compute_bytes(precision, hw), grad_accum))
    peak["runtime"] = hw.runtime_bytes + (hw.checkpoint_runtime_bytes if parallel.checkpoint_activations else 0.0)
    # outside the caching allocator, on a GPU: the CUDA context and NCCL's communicators
    gpu = not hw.ranks_share_compute
    peak["outside"] = (
        (hw.cuda_context_bytes + communicators(parallel.dp, parallel.mp) * nccl_allowance(hw)) if gpu else 0.0
    )
    return peak


@lru_cache(maxsize=1 << 15)  # ~1 kB an entry: a fit or a plan prices the same layout again and again
def _tensors(
    model: ModelConfig, parallel: ParallelConfig, precision: PrecisionConfig, micro_batch: int, a: int, grad_accum: int
) -> dict[str, float]:
    """`engine_peak`'s tensors, `a` bytes per activation element (`compute_bytes`): all of it but
    what the hardware adds (the runtime's, and what lies outside the allocator)."""
    m, dp, L, stage = parallel.mp, parallel.dp, model.layers, parallel.stage
    p, g = precision.bytes_pgk[:2]
    t, h = micro_batch * model.seq, model.hidden
    U, P = t * h * a, t * h // m * a  # an activation, replicated over MP / one MP rank's slice
    stats = 2 * t * FP32  # one LayerNorm's mean and reciprocal deviation, saved for backward
    lse = t * (model.heads // m) * FP32  # attention's log-sum-exp, saved for backward
    rows = -(-model.vocab // m)
    layout, managed = flat_layout(model, m, dp, stage, parallel.bucket_bytes // p, parallel.persistence_threshold)
    states = model_states(layout, stage, managed, precision)
    fixed = sum(states.values()) + micro_batch * grad_accum * (model.seq + 1) * TOKEN
    emb = rows * h * a  # one gradient of the tied embedding (this rank's rows)
    # 16-bit storage computed in fp32 (a CPU host): F.linear and layer_norm save each weight's cast
    # (model.py `_Cast`); stage 3 saves a token instead and casts again in backward
    cast = a if a != p and stage < 3 else 0
    recast = a if a != p and stage == 3 else 0
    # -- forward keeps (the module docstring) ------------------------------------------------------
    rest = 3 * U + 12 * P + lse + 2 * stats + (12 * h * h // m + 2 * h) * cast  # a block's, but its input and output
    block = rest + U  # with its output, the next block's input
    # the vocab-parallel lookup's local ids and mask; the tied embedding's cast, saved by the output layer
    ids = t * (TOKEN + 1) if m > 1 else 0
    other = ids + rows * h * cast
    ckpt, md = parallel.checkpoint_activations, parallel.contiguous_buffers
    pa, off = parallel.partition_activations and m > 1, parallel.offload_activations
    chunk = U // m if pa else U
    if ckpt:
        kept = 0 if off else L * chunk
        persistent = (U if md and pa else 0) + (chunk if md and off else 0)  # M_D's gather, reload buffers
        acts = kept + other + 2 * U + stats  # + the last block's output and ln_f's
    else:
        kept = persistent = 0
        acts = U + L * block + other + U + stats  # the embedding's output, the blocks, ln_f's output
    # stage 3 gathers a module's bucket for its forward and again for its backward, holding it until
    # its gradients are reduced (zero/stage3.py); the GPT's own (wte, wpe) from the forward's start
    # and again from the loss's backward to the end. One DP rank gathers nothing.
    gathers = stage == 3 and dp > 1
    size = [b.padded * p if gathers and b.index < managed else 0 for b in layout.buckets]  # persistent: whole
    root = size[layout.slots[0].bucket]
    moments: dict[str, float] = {}
    # -- the loss -------------------------------------------------------------------------------------
    logits = t * (rows if m > 1 else model.vocab)
    copy = FP32 if a != FP32 else 0  # `.float()` copies 16-bit logits
    moments["loss forward"] = fixed + root + acts + logits * (a + copy + FP32)
    if m == 1:  # log-softmax saved; its gradient and the NLL's beside it
        moments["loss backward"] = fixed + acts + 3 * logits * FP32
    else:  # the softmax made the gradient in place, cast back to the logits' dtype
        moments["loss backward"] = fixed + acts + logits * (FP32 + a)
    fixed += root  # from the output layer's backward, which reads wte, to the end
    moments["output layer backward"] = fixed + acts + logits * a + U + emb + rows * h * recast
    held = emb  # the output layer's gradient of the tied embedding, until the lookup's
    # -- backward, block by block ---------------------------------------------------------------
    buckets = _Buckets(layout, stage, dp, g, grad_accum > 1)
    first = [2 + 12 * i for i in range(L + 1)]  # each block's first parameter (wte, wpe, 12 a block, ln_f)
    for j in range(first[L], len(layout.slots)):  # ln_f's, before the last block
        buckets.deliver(j)
    X = 0 if md else U  # a rebuilt block's input: in M_D's buffers, or gathered, reloaded, kept whole
    y = G = U if ckpt else 0  # with checkpointing, the rebuilt block's output and its incoming gradient
    held_in = (U + 4 * P + lse + stats) + U  # ln1's output, q/k/v and attention's, the residual's gradient
    # each node of a block's backward: what is alive while it runs (its saved tensors, its incoming
    # gradient, its outputs), and after it, when its parameters' gradients are handed over (saved
    # tensors and incoming gradient released, a weight's gradient alive); the same in every block.
    # Parameters by their place in the block: ln1 w/b, qkv w/b, proj w/b, ln2 w/b, fc w/b, proj w/b
    numel = [layout.slots[first[0] + k].numel for k in range(12)] if L else []
    nodes = [
        (name, ws, after, params, sum(numel[k] for k in params) * (a + recast))
        for name, ws, after, params in (
            ("mlp.proj backward", U + y + rest + 4 * P, U + y + rest + 4 * P, (11, 10)),
            ("gelu backward", U + y + rest + 4 * P, 0, ()),
            ("mlp.fc backward", U + y + rest - 4 * P + U, U + y + rest - 8 * P, (9, 8)),
            ("ln2 backward", U + y + rest - 8 * P + U, U + y + held_in, (7, 6)),
            ("residual sum", U + y + held_in + U, 0, ()),
            ("attn.proj backward", G + y + held_in + P, G + y + held_in + P, (5, 4)),
            ("attention backward", G + y + held_in + 4 * P, 0, ()),
            ("qkv gradient", G + y + held_in - 4 * P - lse + 6 * P, 0, ()),
            ("attn.qkv backward", G + y + held_in - 4 * P - lse + 3 * P + U, G + y + 2 * U + stats, (3, 2)),
            ("ln1 backward", G + y + stats + 3 * U, G + y + 2 * U, (1, 0)),
        )
    ]  # fmt: skip
    block_top, block_at = -math.inf, None  # the blocks' highest moment, and where: (block, node[, after])
    for i in range(L - 1, -1, -1):
        w = [first[i] + k for k in range(12)]
        slots = [layout.slots[j] for j in w]
        if ckpt:  # checkpoints below i, the rebuilt block's output and its incoming gradient held
            base = fixed + held + ids + persistent + (kept if md else i * (0 if off else chunk)) + X
            live = {slots[k].bucket for k in range(0, 12, 2)}  # rebuilt: all gathered
            gathered = sum(size[b] for b in live)  # bytes of the buckets in `live`, kept as it changes
            if (v := base + buckets.bytes + U + rest + 2 * U + gathered) > block_top:
                block_top, block_at = v, (i, "rebuilt")
        else:  # blocks below i keep theirs (block i's input is block i-1's output)
            base = fixed + held + ids + U + i * block
            live, gathered = set(), 0
        # strictly higher only: the first of equal highs, in the order the moments happen
        for name, ws, after, params, grads in nodes:
            if params and slots[params[0]].bucket not in live:  # the module's parameters, gathered for its backward
                live.add(slots[params[0]].bucket)
                gathered += size[slots[params[0]].bucket]
            # the node's weight and bias gradients (and, at stage 3 on a CPU host, its weight cast again)
            if (v := base + ws + grads + buckets.bytes + gathered) > block_top:
                block_top, block_at = v, (i, name)
            for k in params:
                if (v := base + after + slots[k].numel * a + buckets.deliver(w[k]) + gathered) > block_top:
                    block_top, block_at = v, (i, name, "gradients handed over")
            for b in {slots[k].bucket for k in params} & live:  # released once its reduction started
                live.discard(b)
                gathered -= size[b]
    if block_at is not None:
        moments[block_at] = block_top
    # -- the embedding: the lookup's gradient beside the output layer's, then their sum ----------
    buckets.deliver(1)  # wpe, from the position add's backward
    base = fixed + persistent + ids + (kept if ckpt and md else 0)  # the root still gathered
    moments["embedding backward"] = base + buckets.bytes + held + U + (U if m > 1 else 0) + emb
    moments["tied embedding sum"] = base + 3 * emb + buckets.bytes
    moments["tied embedding sum, gradients handed over"] = base + emb + buckets.deliver(0)
    # -- the step: one piece's fp32 gradient at a time (16-bit gradients; fp32 are read in place) --
    if g != FP32:
        piece = max(b.padded if stage == 0 else b.chunk for b in layout.buckets)
        moments["step"] = fixed - root + persistent + (kept if ckpt and md else 0) + FP32 * piece
    top = max(moments, key=moments.get)
    moment = top if isinstance(top, str) else f"block {top[0]} " + ", ".join(top[1:])
    return {
        **states,
        "activations": acts,
        "transient": moments[top] - sum(states.values()) - acts,
        "moment": moment,
        # from its second micro-batch on, stage 3 gathers buckets ahead of use along the order the
        # first recorded (zero/gather.py), up to `prefetch_bytes`: a run's, not the one traced step's
        "prefetch": min(parallel.prefetch_bytes, sum(size)) if gathers else 0.0,
    }


def tensor_peak(peak: dict[str, float]) -> float:
    """The tensors' peak (no runtime, no NCCL)."""
    return peak["param_bytes"] + peak["grad_bytes"] + peak["optimizer_bytes"] + peak["activations"] + peak["transient"]


# NCCL's own device memory per communicator, outside the caching allocator: its FIFOs (NCCL_BUFFSIZE,
# 4 MiB by default, per channel and peer for each protocol; up to 32 channels on NVLink) and, on an
# NVSwitch node with NVLink SHARP, NVLS's buffers. An allowance, not a measurement: 544-688 MB per
# communicator on 4 NVLink A100s (NVIDIA/nccl#964), over 1 GB on H100/H200 nodes with NVLS
# (NVIDIA/nccl#864). scripts/gpu_node_check.sh measures it on its node (docs/gpu.md).
NCCL_COMMUNICATOR_BYTES = 2**30


# GPUs whose NVSwitch runs NVLink SHARP, where NCCL adds NVLS's buffers to each communicator
NVLS_GPUS = ("H100", "H200")
# NCCL's buffers per communicator without NVLS: the largest of 544-688 MB measured on 4 NVLink A100s
# (NVIDIA/nccl#964); an allowance for earlier GPUs too (a V100 node runs fewer channels).
NCCL_COMMUNICATOR_BYTES_NO_NVLS = 688e6


def nccl_allowance(hw: HardwareProfile) -> float:
    """NCCL's own bytes per communicator on `hw`'s GPU: the profile's, else one of the allowances
    above (not measurements)."""
    if hw.nccl_communicator_bytes is not None:
        return hw.nccl_communicator_bytes
    return NCCL_COMMUNICATOR_BYTES if any(g in hw.gpu for g in NVLS_GPUS) else NCCL_COMMUNICATOR_BYTES_NO_NVLS


def outside_allocator_bytes(dp: int, mp: int) -> float:
    """What a GPU rank of a dp × mp layout holds outside the caching allocator: the CUDA context
    (profile.CUDA_CONTEXT_BYTES) and NCCL's buffers per communicator (both assumptions)."""
    return CUDA_CONTEXT_BYTES + communicators(dp, mp) * NCCL_COMMUNICATOR_BYTES


def communicators(dp: int, mp: int) -> int:
    """The communicators a rank of a dp × mp layout makes (parallel/topology.py): WORLD, which is
    also the DP group at mp 1 and the MP group at dp 1, and where both exceed 1 its DP and MP groups;
    none alone. Each holds NCCL's buffers on a GPU (`NCCL_COMMUNICATOR_BYTES`); gloo on a CPU host."""
    if dp * mp == 1:
        return 0
    return 3 if dp > 1 and mp > 1 else 1
