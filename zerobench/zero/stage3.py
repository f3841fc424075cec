"""ZeRO-DP stage 3, P_os+g+p (paper §5.3, communication §7.2.2).

Parameters live only as this rank's 1/N_d chunk of each bucket, and a bucket is one module's own
parameters (a Linear's weight and bias, a LayerNorm's, the GPT's wte and wpe), so every module
costs one all-gather. A module's forward pre-hook gathers its bucket and its forward post-hook
releases it. Backward gathers again where autograd needs the weights: tensors autograd saves that
are a managed parameter, a view of one or its compute-dtype cast (`self.w(weight)` in model.py)
are packed as tokens (`saved_tensors_hooks`) and unpacking one re-gathers the bucket, so neither
the gathered weights nor their fp32 casts stay alive from forward to backward; a recomputed
(checkpointed) block re-gathers through the same forward pre-hooks. In backward a gathered bucket
is held until its gradients are complete; then stage 2's path (ZeroEngine) reduce-scatters them
into this rank's gradient chunk and the bucket is released. The optimizer updates the shard and
nothing is gathered after the step.

Released parameters point at a zero-stride expansion of one scalar: the right shape on no
storage, because autograd accumulates a gradient to the shape of `p.data` (an empty tensor there
fails) and a bucket whose weights backward never reads is not gathered just for that.

Prefetch: the order in which buckets are gathered (forward and backward) is recorded during the
first micro-batch; from then on each gather issues asynchronous gathers of the next buckets in that
order, while the bytes gathered ahead of use stay within `prefetch_bytes` and all gathered bytes
(in use and ahead) within `max_live_bytes`. A bucket the program needs is gathered regardless of
prefetch; if that alone breaks `max_live_bytes` the step fails naming the field. Under activation
checkpointing a block's buckets are all alive during its backward (with the root's wte, held from
the logits' backward to the embedding's): the bound must allow it.

Communication per micro-batch and rank, over the padded buckets: forward all-gather Ψ, backward
all-gather Ψ (every bucket of the GPT is read by backward), reduce-scatter Ψ, each (N_d−1)/N_d —
the paper's 3Ψ, 1.5x data parallelism. Parameters are not kept between micro-batches, so m
micro-batches cost 3mΨ(N_d−1)/N_d. Tensors of at most `persistence_threshold` elements stay whole
on every rank (bucketed by C_B like stage 2): their Ψ_p costs a reduce-scatter per micro-batch and
one all-gather after the step, (m + 1)Ψ_p instead of 3mΨ_p, and p·Ψ_p bytes instead of p·Ψ_p/N_d.
Model states between steps: (p + g + k)·shard bytes, the shard being Ψ/N_d plus bucket padding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from zerobench.comms import Comms, Handle
from zerobench.config import ConfigError
from zerobench.zero.engine import ZeroEngine
from zerobench.zero.partition import FlatLayout


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major (contiguous) strides of `shape`, in elements."""
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


@dataclass(frozen=True)
class _Token:
    """A saved tensor that is (a view of) parameter `index` or of its cast to `dtype`."""

    index: int
    dtype: torch.dtype | None  # None: the parameter's own storage
    size: torch.Size
    stride: tuple[int, ...]
    offset: int  # storage offset: in the bucket buffer, or in the cast copy


class Stage3Engine(ZeroEngine):
    """ZeroEngine's interface (backward, step, model_state_bytes, full_parameters, layout) at
    stage 3. Counters: `live_gathered_bytes`, `peak_live_gathered_bytes`, `gathers`, `prefetches`,
    `trace_misses`, `packed`; `gather_order` is the recorded order (bucket names), `forward_order` its
    forward part."""

    STAGES = (3,)

    def __init__(self, model, ctx, parallel, precision, train, comms):
        super().__init__(model, ctx, parallel, precision, train, comms)
        self.elem = torch.empty((), dtype=self.dtype).element_size()
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._buffers: dict[int, torch.Tensor] = {}  # gathered (or arriving) bucket buffers
        self._handles: dict[int, object] = {}  # their all-gathers still to wait for
        self._ready: set[int] = set()  # buckets requested and in use
        self._uses: dict[int, int] = {}  # forward: calls of the owning module under way
        self.live_gathered_bytes = self.peak_live_gathered_bytes = 0
        self.gathers = self.prefetches = self.trace_misses = 0
        self.packed = {"view": 0, "cast": 0}  # saved tensors replaced by tokens, by kind
        self._trace: list[tuple[int, bool]] = []  # (bucket, in backward) in gather order
        self._traced = False
        self._cursor: int | None = 0  # next place in the trace; None: off it
        self._in_backward = False
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        model.register_forward_pre_hook(self._begin_forward)
        model.register_forward_hook(self._end_forward, always_call=True)
        for module, b in self._module_bucket:
            module.register_forward_pre_hook(self._pre_hook(b))
            module.register_forward_hook(self._post_hook(b))

    # -- layout and storage ---------------------------------------------------------------------
    def _make_layout(self, named) -> FlatLayout:
        """One bucket per module that owns parameters directly, in module order; persistent
        tensors packed into C_B buckets after them."""
        threshold = self.parallel.persistence_threshold
        index = {id(p): i for i, (_, p) in enumerate(named)}
        groups, names, self._module_bucket, taken = [], [], [], set()
        for mname, module in self.model.named_modules():
            mine = [index[id(p)] for p in module.parameters(recurse=False) if p.numel() > threshold]
            mine = [i for i in mine if i not in taken]  # a shared parameter goes to its first owner
            if mine:
                self._module_bucket.append((module, len(groups)))
                groups.append(mine)
                names.append(mname or "(root)")
                taken.update(mine)
        self.managed = len(groups)  # buckets [0, managed) are partitioned; the rest persist
        shapes = [(n, tuple(p.shape)) for n, p in named]
        rest = [i for i in range(len(named)) if i not in taken]
        if rest:
            packed = FlatLayout([shapes[i] for i in rest], 1, self.parallel.bucket_bytes // self.dtype.itemsize)
            for b in packed.buckets:
                groups.append([rest[j] for j in b.slots])
                names.append(f"(persistent {b.index})")
        self.bucket_names = names
        return FlatLayout(shapes, self.ctx.dp.size, groups=groups)

    def _place_parameters(self) -> None:
        """This rank's chunk of every partitioned bucket into `shard`, concatenated from the parts of
        the parameters that overlap it (no whole bucket is built: at N_d = 400 a chunk overlaps one
        or two parameters); persistent buckets whole."""
        rank, dtype = self.ctx.dp.rank, self.dtype
        managed = self.layout.buckets[: self.managed]
        parts, self.whole = [], {}
        with torch.no_grad():
            for bucket in self.layout.buckets:
                keep = bucket.index < self.managed
                lo, hi = (rank * bucket.chunk, (rank + 1) * bucket.chunk) if keep else (0, bucket.padded)
                mine = []  # [lo, hi) of the bucket: parameter parts, then zero padding
                for i in bucket.slots:
                    a = self.layout.slots[i].offset - bucket.start
                    start, end = max(a, lo), min(a + self.layout.slots[i].numel, hi)
                    if start < end:
                        mine.append(self.params[i].reshape(-1)[start - a : end - a].to(dtype))
                done = sum(t.numel() for t in mine)
                if done < hi - lo:
                    mine.append(torch.zeros(hi - lo - done, dtype=dtype, device=self.device))
                if keep:
                    parts += mine
                else:
                    self.whole[bucket.index] = torch.cat(mine)
            self.shard = torch.cat(parts) if parts else torch.zeros(0, dtype=dtype, device=self.device)
        self._shard_pieces = list(self.shard.split([b.chunk for b in managed]))
        released = torch.zeros((), dtype=self.dtype, device=self.device)
        # a released parameter's data, one per shape (shared: it has no storage of its own to
        # write), made here so that releasing dispatches no op
        shapes = {self.layout.slots[i].shape for b in managed for i in b.slots}
        self._released = {shape: released.expand(shape) for shape in shapes}
        for bucket in self.layout.buckets:
            self._point(bucket, self.whole.get(bucket.index))

    def _point(self, bucket, flat: torch.Tensor | None) -> None:
        """Parameters of `bucket` become views of `flat` (one op each), or released (None)."""
        for i in bucket.slots:
            if flat is None:
                self.params[i].data = self._released[self.layout.slots[i].shape]
            else:
                slot = self.layout.slots[i]
                self.params[i].data = flat.as_strided(slot.shape, _strides(slot.shape), slot.offset - bucket.start)

    def _param_pieces(self) -> list[torch.Tensor]:
        rank = self.ctx.dp.rank
        return [
            self._shard_pieces[b.index] if b.index < self.managed else self.whole[b.index][rank * b.chunk :][: b.chunk]
            for b in self.layout.buckets
        ]

    def _param_bytes(self) -> int:
        return (self.shard.numel() + sum(t.numel() for t in self.whole.values())) * self.elem

    def gathered_bytes(self, b: int) -> int:
        """Bytes of bucket `b` when gathered (whole, padded)."""
        return self.layout.buckets[b].padded * self.elem

    # -- gather, release, prefetch --------------------------------------------------------------
    def _gather(self, b: int, prefetch: bool) -> None:
        bucket = self.layout.buckets[b]
        buf = torch.empty(bucket.padded, dtype=self.dtype, device=self.device)
        self._buffers[b] = buf
        self.live_gathered_bytes += self.gathered_bytes(b)
        self.peak_live_gathered_bytes = max(self.peak_live_gathered_bytes, self.live_gathered_bytes)
        self._handles[b] = self.comms.all_gather(buf, self._shard_pieces[b], self.ctx.dp, async_op=prefetch)
        self.gathers += 1
        self.prefetches += prefetch

    def _release(self, b: int) -> None:
        self._handles.pop(b).wait()  # a prefetch nobody used may still be arriving
        del self._buffers[b]
        self._ready.discard(b)
        self.live_gathered_bytes -= self.gathered_bytes(b)
        self._point(self.layout.buckets[b], None)

    def _fetch(self, b: int) -> None:
        """Bucket `b` gathered and its parameters pointing at it (the program needs it now)."""
        if b in self._ready:
            return
        if b not in self._buffers:
            self._make_room(b)
            self._gather(b, prefetch=False)
        self._handles[b].wait()
        self._point(self.layout.buckets[b], self._buffers[b])
        self._ready.add(b)
        self._follow_trace(b)

    def _make_room(self, b: int) -> None:
        bound = self.parallel.max_live_bytes
        if self.live_gathered_bytes + self.gathered_bytes(b) > bound:  # drop prefetches the program did not follow
            for ahead in [a for a in self._buffers if a not in self._ready]:
                self._release(ahead)
        need = self.live_gathered_bytes + self.gathered_bytes(b)
        if need > bound:
            raise ConfigError(
                f"max_live_bytes={bound}: stage 3 needs {need} bytes of gathered parameters alive at once "
                f"(gathering {self.bucket_names[b]})"
            )

    def _follow_trace(self, b: int) -> None:
        if not self._traced:
            self._trace.append((b, self._in_backward))
        elif self._cursor is None:  # off the recorded order in this micro-batch already
            return
        elif self._cursor < len(self._trace) and self._trace[self._cursor][0] == b:
            self._cursor += 1
            self._prefetch()
        else:  # the program left the recorded order: gather on demand for the rest of the micro-batch
            self.trace_misses += 1
            self._cursor = None

    def _prefetch(self) -> None:
        ahead = sum(self.gathered_bytes(a) for a in self._buffers if a not in self._ready)
        for b, _ in self._trace[self._cursor :]:
            if b in self._ready:  # gathered again only after this use is released
                break
            if b in self._buffers:
                continue
            n = self.gathered_bytes(b)
            if ahead + n > self.parallel.prefetch_bytes or self.live_gathered_bytes + n > self.parallel.max_live_bytes:
                break
            self._gather(b, prefetch=True)
            ahead += n

    # -- hooks ----------------------------------------------------------------------------------
    def _begin_forward(self, module, args) -> None:
        if not self._traced:
            self._trace.clear()
        self._cursor = 0
        self._saved_hooks.__enter__()

    def _end_forward(self, module, args, output) -> None:
        self._saved_hooks.__exit__(None, None, None)

    def _pre_hook(self, b: int):
        def hook(module, args) -> None:
            if not self._in_backward:  # in backward (recomputation) the bucket is held until its grads
                self._uses[b] = self._uses.get(b, 0) + 1
            self._fetch(b)

        return hook

    def _post_hook(self, b: int):
        def hook(module, args, output) -> None:
            if self._in_backward:
                return
            self._uses[b] -= 1
            if self._uses[b] == 0:
                self._release(b)

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
        if i is None or self.layout.slots[i].bucket >= self.managed:
            return t
        self.packed["cast" if dtype is not None else "view"] += 1
        return _Token(i, dtype, t.size(), t.stride(), t.storage_offset())

    def _unpack(self, saved):
        if not isinstance(saved, _Token):
            return saved
        b = self.layout.slots[saved.index].bucket
        self._fetch(b)
        base = self._buffers[b] if saved.dtype is None else self.params[saved.index].detach().to(saved.dtype)
        return base.as_strided(saved.size, saved.stride, saved.offset)

    # -- backward and step ----------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, last_micro_batch: bool = True) -> None:
        self._in_backward = True
        try:
            super().backward(loss, last_micro_batch)
        finally:
            self._in_backward = False
        self._traced = True
        for b in list(self._buffers):  # normally none: released when their gradients were reduced
            self._release(b)

    def _reduce(self, bucket) -> None:
        super()._reduce(bucket)
        if bucket.index in self._ready and not self._uses.get(bucket.index):
            self._release(bucket.index)

    def _gather_bucket(self, i: int) -> Handle:
        """Only persistent buckets are whole on every rank: gather their updated chunks."""
        whole = self.whole.get(i)
        if whole is None:
            return Handle(None, None)
        return self.comms.all_gather(whole, self.optimizer.params[i].clone(), self.ctx.dp, async_op=True)

    # -- inspection -----------------------------------------------------------------------------
    @property
    def gather_order(self) -> list[str]:
        return [self.bucket_names[b] for b, _ in self._trace]

    @property
    def forward_order(self) -> list[str]:
        return [self.bucket_names[b] for b, backward in self._trace if not backward]

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
