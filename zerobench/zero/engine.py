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
overlap with the rest of backward; at most `MAX_IN_FLIGHT` buckets are in flight at once, which
bounds the staging memory of stage 2 to a constant number of C_B-sized buffers (§6.2).
"""

from __future__ import annotations

from collections import deque

import torch

from zerobench.comms import Comms
from zerobench.config import ParallelConfig, PrecisionConfig, TrainConfig
from zerobench.parallel.topology import ParallelContext
from zerobench.zero.optimizer import LossScaler, ShardedAdam, clip_, global_grad_norm
from zerobench.zero.partition import FlatLayout

MAX_IN_FLIGHT = 2  # buckets whose reduction may be outstanding at once


class ZeroEngine:
    """Wraps a model built by `zerobench.model`; owns its parameters, gradients and optimizer."""

    def __init__(
        self,
        model: torch.nn.Module,
        ctx: ParallelContext,
        parallel: ParallelConfig,
        precision: PrecisionConfig,
        train: TrainConfig,
        comms: Comms,
    ):
        if parallel.stage not in (0, 1, 2):
            raise ValueError(f"stage={parallel.stage}: ZeroEngine runs stages 0-2; use Stage3Engine")
        self.model, self.ctx, self.parallel, self.train, self.comms = model, ctx, parallel, train, comms
        self.stage = parallel.stage
        dp = ctx.dp
        self.dtype = precision.storage_dtype
        named = list(model.named_parameters())
        self.params = [p for _, p in named]
        self.device = dev = self.params[0].device
        elem = torch.empty((), dtype=self.dtype).element_size()
        self.layout = FlatLayout([(n, tuple(p.shape)) for n, p in named], dp.size, parallel.bucket_bytes // elem)
        self.flat_param = torch.zeros(self.layout.padded_numel, dtype=self.dtype, device=dev)
        for p, slot in zip(self.params, self.layout.slots):
            view = self.flat_param[slot.offset : slot.offset + slot.numel]
            view.copy_(p.detach().reshape(-1))
            p.data = view.view(slot.shape)

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
        self.optimizer = ShardedAdam([self.flat_param[lo:hi] for lo, hi in self.owned], train)
        self.scaler = LossScaler(precision.loss_scaling, precision.initial_loss_scale, precision.loss_scale_window)
        # The gradient is partitioned across DP from stage 1 on, so norms and overflow flags sum there.
        self.shard_groups = [dp] if self.stage >= 1 else []

        self._staging: dict[int, torch.Tensor] = {}
        self._pending: list[int] = []
        self._in_flight: deque = deque()
        self._reduce_now = True
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(self._hook(i))

    # -- backward -------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, last_micro_batch: bool = True) -> None:
        """Backward of one micro-batch's mean loss, scaled by 1/grad_accum (and the loss scale)."""
        self._reduce_now = last_micro_batch or self.stage == 2
        self._pending = [len(b.slots) for b in self.layout.buckets]
        (loss * (self.scaler.scale / self.train.grad_accum)).backward()
        self._drain(0)

    def _hook(self, index: int):
        slot = self.layout.slots[index]
        bucket = self.layout.buckets[slot.bucket]

        def hook(p: torch.Tensor) -> None:
            grad = p.grad.reshape(-1)
            if self.stage <= 1:
                self.flat_grad[slot.offset : slot.offset + slot.numel].add_(grad)
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
        accumulate = self.stage == 2  # stage 2 reduces every micro-batch into its shard

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
            self.last_grad_norm = float(global_grad_norm(grads, self.comms, self.shard_groups))
            clip_(grads, torch.tensor(self.last_grad_norm), self.train.clip_norm)
            self.optimizer.step(grads)
            self._sync_params()
        self._zero_grads()
        return not overflow

    def _sync_params(self) -> None:
        if self.stage == 0:
            return
        for bucket in self.layout.buckets:
            lo, hi = bucket.owned(self.ctx.dp.rank)
            mine = self.flat_param[lo:hi].clone()
            self.comms.all_gather(self.flat_param[bucket.start : bucket.start + bucket.padded], mine, self.ctx.dp)

    def _zero_grads(self) -> None:
        (self.flat_grad if self.stage <= 1 else self.grad_shard).zero_()

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter, whole and in fp32 (a copy), as a single-process model would hold it."""
        return {name: p.detach().float().clone() for name, p in self.model.named_parameters()}

    # -- accounting -----------------------------------------------------------------------------
    def model_state_bytes(self) -> dict[str, int]:
        """Bytes of the model states this rank holds, from the tensors themselves."""
        grads = self.flat_grad if self.stage <= 1 else self.grad_shard
        return {
            "param_bytes": self.flat_param.numel() * self.flat_param.element_size(),
            "grad_bytes": grads.numel() * grads.element_size(),
            "optimizer_bytes": self.optimizer.state_bytes(),
        }
