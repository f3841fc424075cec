"""PyTorch's own data-parallel engines as peers, each at the ZeRO stage it corresponds to:
DDP (stage 0, bucketed all-reduce overlapped with backward), `ZeroRedundancyOptimizer` over DDP
(stage 1: optimizer states split by whole parameters, updated parameters broadcast from their
owner), and FSDP2 `fully_shard` per transformer block plus the root, without resharding after
forward (parameters gathered once per step and kept through backward: ≈ stage 2) and with it
(gathered again for backward: stage 3). Adam and global-norm clipping as our engine does them; on
CUDA Adam's fused kernel (as our engine's), collectives over an NCCL group (workload.device_group),
and a bf16 trial FSDP2's own mixed precision (`MixedPrecisionPolicy`: fp32 parameters and
gradient reduction, bf16 compute), as torchtitan sets it."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from zerobench.peers.workload import Unavailable, device_group, finish_step, rank_batches, reference_model


def check(impl: str, spec) -> None:
    if spec.train.grad_accum != 1:
        raise Unavailable(f"grad_accum={spec.train.grad_accum}: the torch peers here take one micro-batch per step")
    mode = spec.precision.mode
    if mode != "fp32" and not (mode == "bf16" and impl.startswith("fsdp2")):
        raise Unavailable(f"precision={mode}: {impl} runs fp32 here (FSDP2 also bf16, by its own policy)")


def versions() -> dict:
    return {"torch": torch.__version__}


def _adam(params, train, cls=torch.optim.Adam, **extra):
    return cls(params, lr=train.lr, betas=train.betas, eps=train.eps, weight_decay=train.weight_decay, **extra)


class Trainer:
    def __init__(self, impl: str, spec):
        self.spec, self.train = spec, spec.train
        self.rank = dist.get_rank()
        self.device = torch.device(spec.precision.device)
        group = device_group(spec.precision.device)
        fused = {"fused": True} if self.device.type == "cuda" else {}
        model = reference_model(spec)
        bucket_mb = spec.parallel.bucket_bytes / 2**20  # the same C_B as our engine's buckets
        if impl in ("ddp", "zero-redundancy-optimizer"):
            self.model = DDP(model, bucket_cap_mb=bucket_mb, process_group=group)
            # The built-in all-reduce hook, registered from Python so its dist.all_reduce calls are
            # visible to the collective observer (the C++ default issues them out of sight).
            self.model.register_comm_hook(None, default_hooks.allreduce_hook)
            if impl == "ddp":
                self.opt = _adam(self.model.parameters(), self.train, **fused)
            else:
                from torch.distributed.optim import ZeroRedundancyOptimizer

                self.opt = _adam(
                    self.model.parameters(),
                    self.train,
                    cls=ZeroRedundancyOptimizer,
                    optimizer_class=torch.optim.Adam,
                    process_group=group,
                    **fused,
                )
            self.note = f"DDP bucket_cap_mb={bucket_mb:g}"
        elif impl.startswith("fsdp2"):
            from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            reshard = impl == "fsdp2-reshard"
            if group is None:
                mesh = init_device_mesh("cpu", (spec.parallel.dp,))
            else:
                mesh = DeviceMesh.from_group(group, self.device.type)
            policy = MixedPrecisionPolicy()  # fp32 throughout
            if spec.precision.mode == "bf16":
                policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                model.set_dtypes(torch.float32, torch.bfloat16)  # compute in what FSDP2 casts to, not back
            for block in model.blocks:
                fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
            fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
            self.model = model
            self.opt = _adam(model.parameters(), self.train, **fused)
            self.note = f"fully_shard per block + root, reshard_after_forward={reshard}" + (
                ", MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)" if spec.precision.mode == "bf16" else ""
            )
        else:
            raise ValueError(f"impl={impl!r}: not a torch peer")

    def step(self, step: int) -> float:
        ((x, y),) = rank_batches(self.spec, self.rank, step)  # one micro-batch (see check)
        loss = self.model(x.to(self.device), y.to(self.device))
        return finish_step(loss, self.model, self.opt, self.train.clip_norm)


def build(impl: str, spec) -> Trainer:
    return Trainer(impl, spec)
