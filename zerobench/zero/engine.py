"""The ZeRO-DP engine, stages 0–2 (paper §5.1–5.2, communication §7.2.1).

Stage 0 is plain data parallelism: replicated optimizer, gradients all-reduced. Stage 1 (P_os)
keeps the full gradient buffer but reduce-scatters it so each rank updates only its shard of the
optimizer states, then all-gathers the updated parameters. Stage 2 (P_os+g) also partitions the
gradients: each bucket's gradients are reduce-scattered as soon as backward has produced them and
only this rank's chunk is kept. Per step and rank, stage 0 moves 2Ψ(N_d−1)/N_d elements
(all-reduce), stages 1 and 2 Ψ(N_d−1)/N_d in reduce-scatter plus Ψ(N_d−1)/N_d in all-gather — the
paper's 2Ψ. With m micro-batches of accumulation, stages 0 and 1 reduce once (on the last
micro-batch, accumulating locally first) while stage 2 reduce-scatters every micro-batch:
(m + 1)Ψ(N_d−1)/N_d, the price of not holding a full gradient buffer.

Reductions are issued from post-accumulate-grad hooks bucket by bucket, asynchronously, so they
overlap with the rest of backward. Stage 2 keeps at most `MAX_IN_FLIGHT` buckets in flight, which
bounds its staging memory to a constant number of C_B-sized buffers (§6.2); stages 0 and 1 reduce
out of the full gradient buffer they hold anyway, so backward never waits on them (stage 1's
reduce-scatter outputs, C_B/N_d each, add at most Ψ/N_d elements while in flight).
"""

from __future__ import annotations

from collections import deque

import torch

from zerobench.comms import Comms, Handle
from zerobench.config import ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.parallel.tensor_parallel import counted_ranges
from zerobench.parallel.topology import ParallelContext
from zerobench.zero.optimizer import LossScaler, ShardedAdam, clip_, global_grad_norm
from zerobench.zero.partition import FlatLayout

MAX_IN_FLIGHT = 2  # stage 2: buckets whose reduction may be outstanding at once


class ZeroEngine:
    """Wraps a model built by `zerobench.model`; owns its parameters, gradients and optimizer."""

    STAGES = (0, 1, 2)  # Stage3Engine (stage3.py) reuses this class's gradient path and step

    def __init__(
        self,
        model: torch.nn.Module,
        ctx: ParallelContext,
        parallel: ParallelConfig,
        precision: PrecisionConfig,
        train: TrainConfig,
        comms: Comms,
    ):
        if parallel.stage not in self.STAGES:
            raise ValueError(f"stage={parallel.stage}: {type(self).__name__} runs stages {self.STAGES}")
        self.model, self.ctx, self.parallel, self.train, self.comms = model, ctx, parallel, train, comms
        self.stage = parallel.stage
        dp = ctx.dp
        self.dtype = precision.storage_dtype
        named = list(model.named_parameters())
        self.params = [p for _, p in named]
        self.device = dev = self.params[0].device
        self.layout = self._make_layout(named)
        self._place_parameters()

        # The pieces this rank updates: whole buckets at stage 0, its chunk of each at stages 1–2.
        if self.stage == 0:
            self.owned = [(b.start, b.start + b.padded) for b in self.layout.buckets]
        else:
            self.owned = [b.owned(dp.rank) for b in self.layout.buckets]
        if self.stage <= 1:
            self.flat_grad = torch.zeros(self.layout.padded_numel, dtype=self.dtype, device=dev)
            self.grad_pieces = [self.flat_grad[lo:hi] for lo, hi in self.owned]
        else:
            self.grad_shard = torch.zeros(self.layout.shard_numel, dtype=self.dtype, device=dev)
            self.grad_pieces = list(self.grad_shard.split([b.chunk for b in self.layout.buckets]))
        self.optimizer = ShardedAdam(self._param_pieces(), train)
        self.scaler = LossScaler(precision.loss_scaling, precision.initial_loss_scale, precision.loss_scale_window)
        # The gradient is partitioned across DP from stage 1 on, so norms and overflow flags sum there.
        self.shard_groups = [dp] if self.stage >= 1 else []
        # MP ranks hold different slices (paper's N_d × N_m): norms and overflow flags sum over MP
        # too, counting replicated parameters on MP rank 0 only (None: count every element).
        self.shard_groups.append(ctx.mp)
        mp = ctx.mp
        self._counted = counted_ranges(self.layout.slots, self.owned, self.params, mp.rank) if mp.size > 1 else None

        self._staging: dict[int, torch.Tensor] = {}
        self._pending: list[int] = []
        self._in_flight: deque = deque()
        self._reduce_now = True
        self._first_micro_batch = True  # no gradient accumulated since the last step
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(self._hook(i))

    def _make_layout(self, named: list[tuple[str, torch.Tensor]]) -> FlatLayout:
        """Parameters packed in order into buckets of C_B bytes."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        shapes = [(n, tuple(p.shape)) for n, p in named]
        return FlatLayout(shapes, self.ctx.dp.size, self.parallel.bucket_bytes // elem)

    def _place_parameters(self) -> None:
        """Move every parameter into one flat buffer; from here on they are views of it."""
        self.flat_param = torch.zeros(self.layout.padded_numel, dtype=self.dtype, device=self.device)
        for p, slot in zip(self.params, self.layout.slots):
            view = self.flat_param[slot.offset : slot.offset + slot.numel]
            view.copy_(p.detach().reshape(-1))
            p.data = view.view(slot.shape)

    def _param_pieces(self) -> list[torch.Tensor]:
        """The parameter storage this rank's optimizer updates, one piece per bucket (`owned`)."""
        return [self.flat_param[lo:hi] for lo, hi in self.owned]

    # -- backward -------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, last_micro_batch: bool = True) -> None:
        """Backward of one micro-batch's mean loss, scaled by 1/grad_accum (and the loss scale)."""
        self._reduce_now = last_micro_batch or self.stage >= 2
        self._pending = [len(b.slots) for b in self.layout.buckets]
        (loss * (self.scaler.scale / self.train.grad_accum)).backward()
        self._drain(0)
        self._first_micro_batch = False

    def _hook(self, index: int):
        slot = self.layout.slots[index]
        bucket = self.layout.buckets[slot.bucket]

        def hook(p: torch.Tensor) -> None:
            grad = p.grad.reshape(-1)
            if self.stage <= 1:
                piece = self.flat_grad[slot.offset : slot.offset + slot.numel]
                # The first micro-batch overwrites last step's values: no Ψ-element memset per step.
                piece.copy_(grad) if self._first_micro_batch else piece.add_(grad)
            else:
                staging = self._staging.get(bucket.index)
                if staging is None:
                    staging = self._staging[bucket.index] = torch.zeros(
                        bucket.padded, dtype=self.dtype, device=self.device
                    )
                lo = slot.offset - bucket.start
                staging[lo : lo + slot.numel].copy_(grad)
            p.grad = None
            self._pending[bucket.index] -= 1
            if self._pending[bucket.index] == 0 and self._reduce_now:
                self._reduce(bucket)

        return hook

    def _reduce(self, bucket) -> None:
        if self.stage >= 2:
            self._drain(MAX_IN_FLIGHT - 1)
        dp = self.ctx.dp
        if self.stage == 0:
            buf = self.flat_grad[bucket.start : bucket.start + bucket.padded]
            handle = self.comms.all_reduce(buf, dp, async_op=True)
            self._in_flight.append((handle, lambda: buf.div_(dp.size)))
            return
        if self.stage == 1:
            src = self.flat_grad[bucket.start : bucket.start + bucket.padded]
        else:
            src = self._staging.pop(bucket.index)  # freed once the reduce-scatter is done
        dst = self.grad_pieces[bucket.index]
        out = torch.empty(bucket.chunk, dtype=self.dtype, device=self.device)
        handle = self.comms.reduce_scatter(out, src, dp, async_op=True)
        accumulate = self.stage >= 2  # stages 2 and 3 reduce every micro-batch into their shard

        def finish(out=out, dst=dst):
            out.div_(dp.size)
            dst.add_(out) if accumulate else dst.copy_(out)

        self._in_flight.append((handle, finish))

    def _drain(self, keep: int) -> None:
        while len(self._in_flight) > keep:
            handle, finish = self._in_flight.popleft()
            handle.wait()
            finish()

    # -- step -----------------------------------------------------------------------------------
    def step(self) -> bool:
        """Unscale, check overflow, clip by the global norm, Adam on the shard, then bring every
        rank's parameters up to date. Returns False when an fp16 overflow skipped the step."""
        # fp32 views are clipped in place (they are zeroed after the step); 16-bit ones are upcast.
        grads = [g if g.dtype == torch.float32 else g.float() for g in self.grad_pieces]
        if self.scaler.enabled:
            for g in grads:
                g.div_(self.scaler.scale)
        overflow = self.scaler.found_overflow(grads, self.comms, self.shard_groups)
        self.scaler.update(overflow)
        if not overflow:
            counted = grads if self._counted is None else [grads[i][lo:hi] for i, lo, hi in self._counted]
            # kept a tensor: a traced step (FakeTensorMode, zerobench/trace.py) has no value to read
            self.last_grad_norm = global_grad_norm(counted or [grads[0][:0]], self.comms, self.shard_groups)
            clip_(grads, self.last_grad_norm, self.train.clip_norm)
            # Each bucket's updated chunk goes out while Adam works on the next bucket's.
            gathers = []
            self.optimizer.step(grads, after_piece=lambda i: gathers.append(self._gather_bucket(i)))
            for handle in gathers:
                handle.wait()
        self._zero_grads()
        return not overflow

    def sync_parameters(self) -> None:
        """Bring every rank's parameters up to date after the owned pieces were overwritten from
        outside the step (a checkpoint load)."""
        self._sync_params()

    def _sync_params(self) -> None:
        handles = [self._gather_bucket(i) for i in range(len(self.layout.buckets))]
        for handle in handles:  # every bucket in flight at once
            handle.wait()

    def _gather_bucket(self, i: int) -> Handle:
        """Start the all-gather that brings bucket i's updated chunks to every rank. In place:
        this rank's chunk already sits where the gather puts it (NCCL and gloo allow it), so
        there is no staging copy. Nothing to do at stage 0, where every rank updated it all."""
        if self.stage == 0:
            return Handle(None, None)
        bucket = self.layout.buckets[i]
        lo, hi = bucket.owned(self.ctx.dp.rank)
        out = self.flat_param[bucket.start : bucket.start + bucket.padded]
        return self.comms.all_gather(out, self.flat_param[lo:hi], self.ctx.dp, async_op=True)

    def _zero_grads(self) -> None:
        self._first_micro_batch = True  # stages 0–1: the next backward overwrites the full buffer
        if self.stage >= 2:  # the shard accumulates every micro-batch's reduce-scatter
            self.grad_shard.zero_()

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter, whole and in fp32 (a copy), as a single-process model would hold it."""
        return {name: p.detach().float().clone() for name, p in self.model.named_parameters()}

    # -- accounting -----------------------------------------------------------------------------
    def _param_bytes(self) -> int:
        return self.flat_param.numel() * self.flat_param.element_size()

    def model_state_bytes(self) -> dict[str, int]:
        """Bytes of the model states this rank holds, from the tensors themselves."""
        grads = self.flat_grad if self.stage <= 1 else self.grad_shard
        return {
            "param_bytes": self._param_bytes(),
            "grad_bytes": grads.numel() * grads.element_size(),
            "optimizer_bytes": self.optimizer.state_bytes(),
        }
