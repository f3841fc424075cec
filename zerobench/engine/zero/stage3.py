"""Stage 3, P_os+g+p: parameters partitioned too (paper §5.3, communication §7.2.2).

Keeps: this rank's 1/N_d chunk of each bucket's parameters, gradients and optimizer states —
(p + g + k)·shard bytes between steps, the shard being Ψ/N_d plus bucket padding. A bucket is one
module's own parameters (a Linear's weight and bias, a LayerNorm's, the GPT's wte and wpe), so a
module costs one all-gather. When the blocks are compiled (zerobench/engine/compile.py) a block's
buckets are gathered together before it and released after it, so no hook runs inside a graph.
Tensors of at most `persistence_threshold` elements stay whole on every rank instead (packed into
C_B buckets after the others).

Frees: a module's gathered bucket right after its forward (forward post-hook), and in backward as
soon as its gradients are reduced, unless it is held for a use close ahead (`reuse_bytes`, gather.py;
off by default). Between forward and backward nothing else gathered stays alive: the
tensors autograd saves that are a partitioned parameter, a view of one or its compute-dtype cast
(`self.w(weight)` in model.py) are packed as tokens (`saved_tensors_hooks`), and unpacking one
gathers the bucket again. A recomputed (checkpointed) block re-gathers through the forward
pre-hooks. Released parameters point at a zero-stride expansion of one scalar: the right shape on
no storage, because autograd accumulates a gradient to the shape of `p.data` (an empty tensor there
fails) and a bucket whose weights backward never reads is not gathered just for that.

Communicates, per micro-batch and rank, over the padded buckets: forward all-gather Ψ, backward
all-gather Ψ (every bucket of the GPT is read by backward), and stage 2's reduce-scatter Ψ, each
(N_d−1)/N_d — the paper's 3Ψ, 1.5x data parallelism; m micro-batches cost 3mΨ(N_d−1)/N_d. Adam
updates the shard and nothing is gathered after the step, except the persistent tensors: their Ψ_p
costs a reduce-scatter per micro-batch and one all-gather after the step, (m + 1)Ψ_p instead of
3mΨ_p. When and how much is gathered ahead (prefetch) or held for reuse is gather.py's; reuse moves
less than 3Ψ (the root bucket, held from the forward's end into backward: 3Ψ − Ψ_root).

On one DP rank (N_d = 1) a bucket's chunk is the whole bucket and there is nothing to gather:
every parameter is a view of the shard for good, so no module hooks gather, copy or free, and
gradients go straight into the shard (stage2.PartitionedGradients). Saved weights are still
packed as tokens where the compute dtype differs from the storage dtype (a 16-bit model on CPU),
so the fp32 casts are remade in backward rather than kept, as at any N_d.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from zerobench.engine.compile import compiled
from zerobench.engine.parallel.comms import Comms, Handle
from zerobench.engine.zero.core import ZeroEngine, exhausted
from zerobench.engine.zero.gather import GatheredBuckets
from zerobench.engine.zero.partition import MAX_IN_FLIGHT, FlatLayout, overlaps
from zerobench.engine.zero.stage2 import PartitionedGradients


def module_layout(model: torch.nn.Module, named, nd: int, threshold: int, bucket_bytes: int, dtype):
    """One bucket per module that owns parameters of more than `threshold` elements directly, in
    module order; the others (persistent) packed into C_B buckets after them. Returns the layout,
    (module, bucket) pairs, the number of partitioned buckets and every bucket's name."""
    index = {id(p): i for i, (_, p) in enumerate(named)}
    groups, names, modules, taken = [], [], [], set()
    for mname, module in model.named_modules():
        mine = [index[id(p)] for p in module.parameters(recurse=False) if p.numel() > threshold]
        mine = [i for i in mine if i not in taken]  # a shared parameter goes to its first owner
        if mine:
            modules.append((module, len(groups)))
            groups.append(mine)
            names.append(mname or "(root)")
            taken.update(mine)
    managed = len(groups)
    shapes = [(n, tuple(p.shape)) for n, p in named]
    rest = [i for i in range(len(named)) if i not in taken]
    if rest:
        packed = FlatLayout([shapes[i] for i in rest], 1, bucket_bytes // dtype.itemsize)
        for b in packed.buckets:
            groups.append([rest[j] for j in b.slots])
            names.append(f"(persistent {b.index})")
    return FlatLayout(shapes, nd, groups=groups), modules, managed, names


@dataclass(frozen=True)
class _Token:
    """A saved tensor that is (a view of) parameter `index` or of its cast to `dtype`."""

    index: int
    dtype: torch.dtype | None  # None: the parameter's own storage
    size: torch.Size
    stride: tuple[int, ...]
    offset: int  # storage offset: in the bucket buffer, or in the cast copy


class Stage3(ZeroEngine):
    """Besides the common interface: `gathered` (GatheredBuckets: counters and the recorded
    order), `bucket_names`, `managed` (buckets [0, managed) are partitioned), `packed` (saved
    tensors replaced by tokens, by kind)."""

    stage = 3

    def __init__(self, model, ctx, parallel, precision, train, comms, device=None, values=None):
        super().__init__(model, ctx, parallel, precision, train, comms, device, values)
        dp = ctx.dp
        layout, modules, self.managed, self.bucket_names = module_layout(
            model, self.named, dp.size, parallel.persistence_threshold, parallel.bucket_bytes, self.dtype
        )
        self.layout = layout
        self._place(layout)
        grads = PartitionedGradients(layout, dp, comms, self.pool)
        owned = [b.owned(dp.rank) for b in layout.buckets]
        r = dp.rank
        persistent = [self.whole[b.index][r * b.chunk : (r + 1) * b.chunk] for b in layout.buckets[self.managed :]]
        self._attach(layout, owned, self._shard_pieces + persistent, grads, partitioned=True)
        self.gathered = GatheredBuckets(
            layout, self._shard_pieces, self._point, parallel, dp, comms, self.pool, self.bucket_names
        )
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._uses: dict[int, int] = {}  # forward: calls of the owning module under way
        self._in_backward = False
        self.packed = {"view": 0, "cast": 0}
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self.whole_shard = dp.size == 1  # the shard is every bucket, whole: nothing to gather
        casts = precision.compute_dtype != precision.storage_dtype  # weights cast as they are used
        if not self.whole_shard or casts:
            model.register_forward_pre_hook(self._begin_forward)
            model.register_forward_hook(self._end_forward, always_call=True)
        if self.whole_shard:
            for b in range(self.managed):
                self._point(b, self._shard_pieces[b])
            return
        for module, buckets in _units(model, modules) if compiled(model) else [(m, [b]) for m, b in modules]:
            module.register_forward_pre_hook(self._pre_hook(buckets))
            module.register_forward_hook(self._post_hook(buckets))

    # -- storage --------------------------------------------------------------------------------
    def _place(self, layout: FlatLayout) -> None:
        """This rank's chunk of every partitioned bucket into `shard`, persistent buckets whole in
        `whole`, each written from the parts of the parameters' initial values that meet it, one
        parameter at a time (no whole bucket is built: at N_d = 400 a chunk meets one or two
        parameters), padding zero."""
        rank, dtype, buckets = self.ctx.dp.rank, self.dtype, layout.buckets
        ranges = [b.owned(rank) if b.index < self.managed else (b.start, b.start + b.padded) for b in buckets]
        self.shard = torch.zeros(sum(b.chunk for b in buckets[: self.managed]), dtype=dtype, device=self.device)
        self._shard_pieces = list(self.shard.split([b.chunk for b in buckets[: self.managed]]))
        self.whole = {b.index: torch.zeros(b.padded, dtype=dtype, device=self.device) for b in buckets[self.managed :]}
        dest = self._shard_pieces + [self.whole[b.index] for b in buckets[self.managed :]]
        parts: list[list[tuple[int, int, int]]] = [[] for _ in layout.slots]  # per parameter: (bucket, lo, hi)
        for i, j, lo, hi in overlaps(layout.slots, ranges):
            parts[j].append((i, lo, hi))
        with torch.no_grad():
            for j in range(len(layout.slots)):
                value = next(self._values)  # not enumerate's: its reused tuple holds the last value
                flat, offset = value.reshape(-1), layout.slots[j].offset
                for i, lo, hi in parts[j]:
                    dest[i][lo - ranges[i][0] : hi - ranges[i][0]].copy_(flat[lo - offset : hi - offset])
                del value, flat  # before the next is drawn: one full parameter at a time
            exhausted(self._values)
        # a released parameter's data, one per shape (shared: it has no storage of its own to
        # write), made here so that releasing dispatches no op
        released = torch.zeros((), dtype=dtype, device=self.device)
        shapes = {layout.slots[i].shape for b in buckets[: self.managed] for i in b.slots}
        self._released = {shape: released.expand(shape) for shape in shapes}
        for b in buckets:
            self._point(b.index, self.whole.get(b.index))

    def _point(self, b: int, flat: torch.Tensor | None) -> None:
        """Parameters of bucket b become views of `flat` (one op each), or released (None)."""
        bucket = self.layout.buckets[b]
        for i in bucket.slots:
            slot = self.layout.slots[i]
            if flat is None:
                self.params[i].data = self._released[slot.shape]
            else:  # as_strided's offset counts from the storage's start, not from the view's
                offset = flat.storage_offset() + slot.offset - bucket.start
                self.params[i].data = flat.as_strided(slot.shape, _strides(slot.shape), offset)

    # -- forward: gather before a module, release after it --------------------------------------
    def _begin_forward(self, module, args) -> None:
        self.gathered.start_micro_batch()
        self._saved_hooks.__enter__()

    def _end_forward(self, module, args, output) -> None:
        self._saved_hooks.__exit__(None, None, None)
        self.pool.clear()  # what backward gathers first (the root, the last block) is not what forward freed last

    def _pre_hook(self, buckets: list[int]):
        def hook(module, args) -> None:
            for b in buckets:
                if not self._in_backward:  # in backward (recomputation) the bucket is held until its grads
                    self._uses[b] = self._uses.get(b, 0) + 1
                self.gathered.fetch(b, self._in_backward)

        return hook

    def _post_hook(self, buckets: list[int]):
        def hook(module, args, output) -> None:
            if self._in_backward:
                return
            for b in buckets:
                self._uses[b] -= 1
                if self._uses[b] == 0:
                    self.gathered.done(b)

        return hook

    def _pack(self, t: torch.Tensor):
        base = t._base if t._is_view() else t
        i, dtype = self._index.get(id(base)), None
        fn = base.grad_fn
        if i is None and fn is not None and type(fn).__name__ == "ToCopyBackward0":
            i = self._index.get(id(getattr(fn.next_functions[0][0], "variable", None)))
            dtype = base.dtype
            if i is not None and base.shape != self.params[i].shape:
                i = None
        if i is None or self.layout.slots[i].bucket >= self.managed or (self.whole_shard and dtype is None):
            return t  # kept whole (persistent, or every bucket at N_d = 1): saving it costs nothing
        self.packed["cast" if dtype is not None else "view"] += 1
        return _Token(i, dtype, t.size(), t.stride(), t.storage_offset())

    def _unpack(self, saved):
        if not isinstance(saved, _Token):
            return saved
        if self.whole_shard:  # a cast: the parameter is there for good
            return self.params[saved.index].detach().to(saved.dtype).as_strided(saved.size, saved.stride, saved.offset)
        buf = self.gathered.fetch(self.layout.slots[saved.index].bucket, in_backward=True)
        base = buf if saved.dtype is None else self.params[saved.index].detach().to(saved.dtype)
        return base.as_strided(saved.size, saved.stride, saved.offset)

    # -- backward: stage 2's reduce-scatter, then release -----------------------------------------
    def backward(self, loss: torch.Tensor, last_micro_batch: bool = True) -> None:
        self._in_backward = True
        try:
            self._backward(loss, reduce=True, last_micro_batch=last_micro_batch)
        finally:
            self._in_backward = False
        self.gathered.end_micro_batch()  # normally nothing left: released when their grads were reduced
        self.pool.clear()

    def _reduce(self, bucket) -> None:
        self._drain(MAX_IN_FLIGHT - 1)
        self._start(bucket, *self.grads.reduce(bucket))
        if bucket.index in self.gathered.ready and not self._uses.get(bucket.index):
            self.gathered.done(bucket.index)

    # -- step -----------------------------------------------------------------------------------
    def _send(self, i: int) -> Handle:
        """Only persistent buckets are whole on every rank: gather their updated chunks, in place
        (this rank's chunk is where the gather puts it, as core.gather_updated); on one rank Adam
        updated them where they are."""
        whole = self.whole.get(i)
        if whole is None or self.whole_shard:
            return Handle(None, None)
        return self.comms.all_gather(whole, self.optimizer.params[i], self.ctx.dp, async_op=True)

    # -- inspection -----------------------------------------------------------------------------
    def transient_states(self):
        gathered = [(t, "param") for t in self.gathered.buffers.values()]
        return [(t, "grad") for t in self.grads.staging.values()] + gathered

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter whole, in fp32 (a copy). Collective: every DP rank must call it. Its
        gathers go on a ledger of their own: an export is not training traffic."""
        comms, out = Comms(), {}
        for bucket in self.layout.buckets:
            flat = self.whole.get(bucket.index)
            if flat is None:
                flat = torch.empty(bucket.padded, dtype=self.dtype, device=self.device)
                comms.all_gather(flat, self._shard_pieces[bucket.index], self.ctx.dp)
            for i in bucket.slots:
                slot = self.layout.slots[i]
                lo = slot.offset - bucket.start
                out[slot.name] = flat[lo : lo + slot.numel].view(slot.shape).float().clone()
        return {name: out[name] for name, _ in self.model.named_parameters()}


def _units(model: torch.nn.Module, modules: list[tuple[torch.nn.Module, int]]):
    """(module, buckets) pairs to gather and release together when the blocks are compiled
    (zerobench/engine/compile.py): a block's buckets around the block, so its compiled compute
    runs with every parameter gathered and no hook inside a graph (FSDP2's unit, torchtitan's
    compile unit); modules outside the blocks keep their own."""
    owner = {id(m): block for block in model.blocks for m in block.modules()}
    units: dict[int, tuple[torch.nn.Module, list[int]]] = {}
    for module, b in modules:
        unit = owner.get(id(module), module)
        units.setdefault(id(unit), (unit, []))[1].append(b)
    return list(units.values())


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major (contiguous) strides of `shape`, in elements."""
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
