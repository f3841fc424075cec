"""DeepSpeed ZeRO stages 0–3 as peers, on CPU: `DS_ACCELERATOR=cpu`, the gloo backend (DeepSpeed
adopts the world the harness opened) and torch's Adam (`torch_adam: true`, `adam_w_mode: false`),
fp32, DeepSpeed's own defaults otherwise, clipping by the global norm as our engine does."""

from __future__ import annotations

import importlib.util
import os
import sys

from zerobench.peers.workload import Unavailable, rank_batches, reference_model


def check(impl: str, spec) -> None:
    if importlib.util.find_spec("deepspeed") is None:
        raise Unavailable("deepspeed is not installed (pip install 'zerobench[peers]' with DS_BUILD_OPS=0)")
    if spec.precision.mode != "fp32":
        raise Unavailable(f"precision={spec.precision.mode}: the DeepSpeed peers run fp32 only on CPU")


def versions() -> dict:
    from importlib.metadata import version

    return {"deepspeed": version("deepspeed")} if importlib.util.find_spec("deepspeed") else {}


def config(stage: int, spec) -> dict:
    t = spec.train
    return {
        "train_batch_size": spec.global_batch,
        "train_micro_batch_size_per_gpu": t.micro_batch,
        "gradient_accumulation_steps": t.grad_accum,
        "gradient_clipping": t.clip_norm,
        "optimizer": {
            "type": "Adam",
            "params": {
                "lr": t.lr,
                "betas": list(t.betas),
                "eps": t.eps,
                "weight_decay": t.weight_decay,
                "torch_adam": True,
                "adam_w_mode": False,
            },
        },  # fmt: skip
        "zero_optimization": {"stage": stage},
        "steps_per_print": 2**31,
        "wall_clock_breakdown": False,
    }


class Trainer:
    def __init__(self, impl: str, spec):
        os.environ["DS_ACCELERATOR"] = "cpu"
        import deepspeed
        import torch.distributed as dist

        self.spec = spec
        self.rank = dist.get_rank()
        # DeepSpeed reads these even when the process group exists; the harness opened it already.
        os.environ.update(RANK=str(self.rank), LOCAL_RANK=str(self.rank), WORLD_SIZE=str(dist.get_world_size()))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "1")  # unused: the world is already initialized
        # DeepSpeed's shared-memory CPU kernel serves only inference_all_reduce; building it is a JIT
        # C++ compile of minutes on first use. Training collectives go through torch.distributed.
        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # (deepspeed.comm.torch is torch)
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        stage = int(impl.rsplit("-", 1)[1])
        model = reference_model(spec)
        self.engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=config(stage, spec)
        )
        self.note = f"zero_optimization.stage={stage}, DeepSpeed defaults otherwise"

    def step(self, step: int) -> float:
        total = 0.0
        mbs = rank_batches(self.spec, self.rank, step)
        for x, y in mbs:
            loss = self.engine(x, y)
            self.engine.backward(loss)
            self.engine.step()  # DeepSpeed steps the optimizer at the accumulation boundary only
            total += loss.item()
        return total / len(mbs)


def build(impl: str, spec) -> Trainer:
    return Trainer(impl, spec)
