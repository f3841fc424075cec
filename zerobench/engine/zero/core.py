"""What every ZeRO-DP stage shares (paper §5): the flat buffers, hooks that report each bucket's
gradients complete, the collectives in flight, and the step on the pieces this rank owns — unscale,
overflow check, global-norm clipping, Adam (§5.1) — after which each updated piece can be sent.
When nothing needs the whole gradient before Adam (no clipping, no loss scaling, fp32), the step
starts while the last reductions are still in flight: otherwise the last bucket's reduction (the
one holding the embedding, completed last by backward) is waited for with nothing to do
(docs/engine-measurements.md says where that was seen).

Each stage's own file says what it keeps, frees and communicates, and when: stage0.py (plain data
parallelism), stage1.py (P_os), stage2.py (P_os+g), stage3.py (P_os+g+p).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

import torch

from zerobench.engine.config import ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.engine.parallel.comms import Comms, Handle
from zerobench.engine.parallel.topology import Group, ParallelContext
from zerobench.engine.zero.buffers import BufferPool
from zerobench.engine.zero.optimizer import LossScaler, ShardedAdam, clip_coef, global_grad_norm, upcast
from zerobench.engine.zero.partition import Bucket, FlatLayout, Slot, counted_ranges
from zerobench.stages import rule


def packed_layout(named: list[tuple[str, torch.Tensor]], nd: int, bucket_bytes: int, dtype) -> FlatLayout:
    """Parameters packed in order into buckets of C_B bytes (§6.2) for `nd` ranks."""
    return FlatLayout([(n, tuple(p.shape)) for n, p in named], nd, bucket_bytes // dtype.itemsize)


def place_flat(values: Iterator[torch.Tensor], layout: FlatLayout, dtype, device) -> torch.Tensor:
    """One flat buffer (returned) with each parameter's initial value, taken one at a time from
    `values`, written into its slot."""
    flat = torch.zeros(layout.padded_numel, dtype=dtype, device=device)
    for slot in layout.slots:
        value = next(values)  # not zip's: its reused result tuple holds the last value while the next is drawn
        flat[slot.offset : slot.offset + slot.numel].copy_(value.reshape(-1))
        del value  # before the next is drawn: one full parameter at a time
    exhausted(values)
    return flat


def exhausted(values: Iterator[torch.Tensor]) -> None:
    """Every initial value taken: one more is an error, and the values' generator ends (its frame,
    and the small tensors it holds, freed now)."""
    if next(values, None) is not None:
        raise ValueError("values: more initial values than the model has parameters")


def adopt(model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> None:
    """Every parameter of `model` (built on the meta device, or materialized) replaced by one of
    `dtype` on `device` that holds no storage — a zero-stride expansion of one element — keeping
    its attributes (an MP split). The engine then points each at its place in the flat buffer or
    shard: nothing of the whole model is ever allocated (DeepSpeed's zero.Init, FSDP2's meta init)."""
    zero = torch.zeros((), dtype=dtype, device=device)
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            new = torch.nn.Parameter(zero.expand(p.shape), requires_grad=p.requires_grad)
            new.__dict__.update({k: v for k, v in p.__dict__.items() if k not in new.__dict__})
            setattr(module, name, new)


def gather_updated(comms: Comms, flat: torch.Tensor, bucket: Bucket, dp: Group) -> Handle:
    """Start the all-gather that brings every rank's updated chunk of `bucket` into `flat`. In
    place: this rank's chunk already sits where the gather puts it (NCCL and gloo allow it)."""
    lo, hi = bucket.owned(dp.rank)
    return comms.all_gather(flat[bucket.start : bucket.start + bucket.padded], flat[lo:hi], dp, async_op=True)


class FullGradients:
    """A gradient buffer as long as the flat parameters (stages 0 and 1); `pieces` are its `owned`
    ranges, what the optimizer reads. Backward writes each gradient into its slot and micro-batches
    accumulate there; the first micro-batch of a step (`fresh`) overwrites last step's values, so
    there is no Ψ-element memset per step."""

    def __init__(self, layout: FlatLayout, owned: list[tuple[int, int]], dtype, device):
        self.flat = torch.zeros(layout.padded_numel, dtype=dtype, device=device)
        self.pieces = [self.flat[lo:hi] for lo, hi in owned]
        self.fresh = True

    def take(self, slot: Slot, grad: torch.Tensor) -> None:
        piece = self.flat[slot.offset : slot.offset + slot.numel]
        piece.copy_(grad) if self.fresh else piece.add_(grad)

    def of(self, bucket: Bucket) -> torch.Tensor:
        return self.flat[bucket.start : bucket.start + bucket.padded]


class ZeroEngine:
    """The interface of every stage: `model`, `backward`, `step`, `model_state_bytes`,
    `full_parameters`, `sync_parameters`, `transient_states`, and what a checkpoint reads
    (`layout`, `owned`, `optimizer`, `scaler`, `stage`, `ctx`, `dtype`, `device`).

    A stage's constructor runs `__init__` (common fields only), builds its layout, parameter storage
    and gradients (`grads`: FullGradients, or stage2.PartitionedGradients), then `_attach`, which
    makes the optimizer over the pieces it owns and hooks every parameter. Nothing here calls into
    the stage before that. In backward the hooks hand each gradient to `grads.take` and each
    complete bucket to the stage's `_reduce(bucket)`; in the step, `_send(i)` brings updated piece
    i to the ranks that need it."""

    stage: int

    def __init__(
        self,
        model: torch.nn.Module,
        ctx: ParallelContext,
        parallel: ParallelConfig,
        precision: PrecisionConfig,
        train: TrainConfig,
        comms: Comms,
        device: torch.device | None = None,
        values: Iterable[torch.Tensor] | None = None,
    ):
        if parallel.stage != self.stage:
            raise ValueError(f"stage={parallel.stage}: {type(self).__name__} runs stage {self.stage}")
        self.model, self.ctx, self.parallel, self.train, self.comms = model, ctx, parallel, train, comms
        self.dtype = precision.storage_dtype
        first = next(model.parameters())
        self.device = device or first.device
        if self.device.type == "meta":
            raise ValueError("device: a model on the meta device needs the device to build on")
        if values is None:
            if first.device.type == "meta":
                raise ValueError("values: a model on the meta device needs its initial values")
            values = [p.detach() for p in model.parameters()]  # a materialized model: its own values
        # the initial values, consumed once, in parameter order, by the stage's placement
        self._values: Iterator[torch.Tensor] = iter(values)
        adopt(model, self.dtype, self.device)
        self.named = list(model.named_parameters())
        self.params = [p for _, p in self.named]
        self.scaler = LossScaler(precision.loss_scaling, precision.initial_loss_scale, precision.loss_scale_window)
        self.pool = BufferPool(self.dtype, self.device)  # freed bucket buffers, reused within a pass
        self._in_flight: deque = deque()  # (bucket, handle, finish) of the reductions under way, in issue order
        self._reduce_now = True
        # The step may start while the last micro-batch's reductions are in flight, waiting for each
        # piece's just before its Adam update, when nothing needs the whole gradient first (no
        # clipping, no loss scaling) and the optimizer reads the reduced gradients in place (fp32).
        self._overlap_step = train.clip_norm <= 0 and not self.scaler.enabled and self.dtype == torch.float32

    def _flat(self) -> FlatLayout:
        """Stages 0–2: the parameters packed in order into C_B buckets of one flat buffer,
        `flat_param`, filled with their initial values; from here on each parameter is a view of
        it. Returns the layout."""
        layout = packed_layout(self.named, self.ctx.dp.size, self.parallel.bucket_bytes, self.dtype)
        self.flat_param = place_flat(self._values, layout, self.dtype, self.device)
        for p, slot in zip(self.params, layout.slots):
            p.data = self.flat_param[slot.offset : slot.offset + slot.numel].view(slot.shape)
        return layout

    def _attach(self, layout: FlatLayout, owned, param_pieces, grads, partitioned: bool) -> None:
        """The optimizer over `param_pieces` (flat [lo, hi) `owned`) reading `grads.pieces`, and
        the hooks. `partitioned`: the gradient is split over DP."""
        self.layout, self.owned, self.grads, self.grad_pieces = layout, owned, grads, grads.pieces
        self.optimizer = ShardedAdam(param_pieces, self.train)
        # Norms and overflow flags sum over the groups the gradient is split across: DP once it is
        # partitioned, and MP (the paper's N_d × N_m), where replicated parameters count on MP
        # rank 0 only (None: count every element).
        self.shard_groups = ([self.ctx.dp] if partitioned else []) + [self.ctx.mp]
        mp = self.ctx.mp
        self._counted = counted_ranges(layout.slots, owned, self.params, mp.rank) if mp.size > 1 else None
        self._pending = [len(b.slots) for b in layout.buckets]
        for p, slot in zip(self.params, layout.slots):
            p.register_post_accumulate_grad_hook(self._hook(slot, layout.buckets[slot.bucket]))

    def _hook(self, slot: Slot, bucket: Bucket):
        def hook(p: torch.Tensor) -> None:
            self.grads.take(slot, p.grad.reshape(-1))
            p.grad = None
            self._pending[bucket.index] -= 1
            if self._pending[bucket.index] == 0 and self._reduce_now:
                self._reduce(bucket)

        return hook

    def _backward(self, loss: torch.Tensor, reduce: bool, last_micro_batch: bool) -> None:
        """Backward of one micro-batch's mean loss, scaled by 1/(grad_accum·N_d) (and the loss
        scale): the sum that the reductions compute is then the average, with no division pass
        over the gradients. With `reduce`, each bucket's reduction starts once it is complete; the
        last micro-batch's may still be in flight when it returns (`_overlap_step`)."""
        self._drain(0)
        self._reduce_now = reduce and self.ctx.dp.size > 1  # on one DP rank every reduction is the identity
        self._pending = [len(b.slots) for b in self.layout.buckets]
        (loss * (self.scaler.scale / (self.train.grad_accum * self.ctx.dp.size))).backward()
        if not (last_micro_batch and self._overlap_step):
            self._drain(0)
        self.grads.fresh = False
        self.pool.clear()

    def _start(self, bucket: Bucket, handle: Handle, finish=lambda: None) -> None:
        """A bucket's reduction is in flight; `finish` runs once it is done."""
        self._in_flight.append((bucket.index, handle, finish))

    def _drain(self, keep: int) -> None:
        """Wait for the oldest reductions until at most `keep` are in flight."""
        while len(self._in_flight) > keep:
            _, handle, finish = self._in_flight.popleft()
            handle.wait()
            finish()

    def _drain_through(self, bucket: int) -> None:
        """Wait for the reductions issued up to and including bucket's (if it is in flight)."""
        while any(b == bucket for b, _, _ in self._in_flight):
            self._drain(len(self._in_flight) - 1)

    def step(self) -> bool:
        """Check overflow, clip by the global norm, unscale, Adam on the owned pieces, each piece
        sent (`_send`) while Adam works on the next. False when an fp16 overflow skipped the step.
        The next backward overwrites the gradients. With reductions still in flight
        (`_overlap_step`), Adam takes first the pieces already reduced, then the others in the
        order their reductions were issued, waiting for each; the norm (recorded, not applied)
        follows: Adam does not write the gradients, so it is the same number.

        16-bit gradients stay where they are, as §5 counts them: the overflow check and the norm
        read them piece by piece, and each piece's fp32 gradient (unscaled, clipped) is made just
        before its update and dropped after it, so the step holds one piece in fp32 at a time, not
        a 4 B/param copy of the whole gradient. Unscaled fp32 views are clipped in place (the next
        backward overwrites them)."""
        if self._in_flight:
            self._overlapped_step()
            return True
        scale = self.scaler.scale  # the backward's, before `update` may change it
        overflow = self.scaler.found_overflow(self.grad_pieces, self.comms, self.shard_groups)
        self.scaler.update(overflow)
        if not overflow:
            self.last_grad_norm = self._grad_norm(self.grad_pieces, scale)
            coef = clip_coef(self.last_grad_norm, self.train.clip_norm)

            def fp32(g: torch.Tensor) -> torch.Tensor:
                g = upcast(g, scale)
                return g if coef is None else g.mul_(coef)

            sends = []
            self.optimizer.step(self.grad_pieces, fp32=fp32, after_piece=lambda i: sends.append(self._send(i)))
            for handle in sends:
                handle.wait()
        self.grads.fresh = True
        return not overflow

    def _overlapped_step(self) -> None:
        flying = [b for b, _, _ in self._in_flight]
        order = [i for i in range(len(self.grad_pieces)) if i not in flying] + flying
        sends = []
        self.optimizer.step(
            self.grad_pieces,
            order=order,
            before_piece=self._drain_through,
            after_piece=lambda i: sends.append(self._send(i)),
        )
        for handle in sends:
            handle.wait()
        self.last_grad_norm = self._grad_norm(self.grad_pieces)
        self.grads.fresh = True
        self.pool.clear()  # the staging buffers the last reductions handed back

    def _grad_norm(self, grads: list[torch.Tensor], unscale: float = 1.0) -> torch.Tensor:
        """The global norm of `grads` / `unscale` over the shard groups, each element counted once
        (`_counted` across MP). Kept a tensor: a traced step (FakeTensorMode, runtime/trace.py)
        has no value to read."""
        counted = grads if self._counted is None else [grads[i][lo:hi] for i, lo, hi in self._counted]
        return global_grad_norm(counted or [grads[0][:0]], self.comms, self.shard_groups, unscale)

    @property
    def partitions_optimizer(self) -> bool:
        """P_os (paper §5.1): each DP rank holds and updates only its chunk of the optimizer
        states (stages 1–3, stages.py); at stage 0 every rank updates everything."""
        return "optimizer_bytes" in rule(self.stage).partitions

    def _send(self, i: int) -> Handle:
        """Bring updated piece i to the ranks that need it: nothing where every rank updated it
        itself (stage 0); under P_os every rank's updated chunk of bucket i all-gathered into the
        flat parameters (stages 1 and 2; stage 3 says otherwise)."""
        if not self.partitions_optimizer:
            return Handle(None, None)
        return gather_updated(self.comms, self.flat_param, self.layout.buckets[i], self.ctx.dp)

    def sync_parameters(self) -> None:
        """Bring every rank's parameters up to date after the owned pieces were overwritten from
        outside the step (a checkpoint load): every piece sent at once."""
        for handle in [self._send(i) for i in range(len(self.owned))]:
            handle.wait()

    def transient_states(self):
        """(tensor, category) of the model states a step allocates and frees: none here."""
        return ()

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter, whole and in fp32 (a copy), as a single-process model would hold it."""
        return {name: p.detach().float().clone() for name, p in self.model.named_parameters()}

    def model_state_bytes(self) -> dict[str, int]:
        """Bytes of the model states this rank holds: the storage behind the pieces the optimizer
        updates and reads, and the optimizer's own."""
        return {
            "param_bytes": _storage_bytes(self.optimizer.params),
            "grad_bytes": _storage_bytes(self.grad_pieces),
            "optimizer_bytes": self.optimizer.state_bytes(),
        }


def _storage_bytes(tensors) -> int:
    storages = {}
    for t in tensors:
        st = t.untyped_storage()
        storages[id(st)] = st  # held, so an id is never reused while counting
    return sum(st.nbytes() for st in storages.values())
