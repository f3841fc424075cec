"""Peak memory of this engine on a measured profile (one `zerobench calibrate` wrote): on a CPU host
in the bytes a rank's RSS grows by, on a GPU in the bytes its caching allocator hands out; what
zerobench/engine/model.py and zero/ keep at their peak, plus on a CPU the runtime's own that
calibrate measures. The paper's codes on datasheet profiles are feasibility.py's.

Read from the code, in the categories `zerobench trace` counts (runtime/trace.py: param,
grad, optimizer; activation, what forward keeps; temporary, what backward and the step make and
free), and checked against it in tests/unit/test_engine_memory.py. Activations are in the compute
dtype (`compute_bytes`): fp32 on a CPU host whatever the storage, the storage dtype on a GPU:
- model states: the paper's formula per stage (zerobench/memory.py, §5);
- saved for backward, per token of one layer on one MP rank (model.py's Block): the block input
  and the residual sum (layernorm inputs), both layernorm outputs (linear inputs): 4h replicated
  over MP; q, k, v (3h/mp), the attention output and its re-laid copy for the projection
  (2h/mp), the MLP's fc output and GeLU output (8h/mp): 4h + 13h/mp elements; where the compute
  dtype is not the storage's (16-bit storage on a CPU), each weight's fp32 cast (model.py's
  `_Cast`), which F.linear saves: 4 bytes per Ψ/mp (not at stage 3, which casts again in backward);
- with checkpointing, each block's input instead (b·s·h, /mp with P_a; about none on the host
  with P_a+cpu), and later one block recomputed with its gradients (2 × a layer's saved bytes);
- the loss (model.py's TiedVocab, `logits.float()`): the fp32 log-softmax over b·s × V/mp logits is saved, and its
  backward holds two more such buffers (the NLL gradient and the log-softmax gradient): 3 × at
  the start of backward, beside the activations; Megatron's vocab-parallel loss (mp > 1,
  parallel/tensor_parallel.py) holds the logits and one buffer it works in place: 2 ×;
- the tied embedding at the end of backward, when the activations are freed: its gradient from
  the lookup, from the output layer, and their sum (3 × V/mp × h), beside stage 2's or 3's
  reduce bucket and stage 3's gathered embedding; the peak is the largest of the three moments;
- stage 3's buckets gathered ahead of use through forward and backward (its prefetch, bounded by
  `prefetch_bytes` and by the whole model), beside the activations; `zerobench trace` runs one
  step, whose first micro-batch records the order to prefetch along, so it sees none;
- the step: the model states plus, with 16-bit gradients, one piece's fp32 gradient, made just
  before its Adam update and dropped after it (zero/core.py): a piece is at most a bucket or the
  largest parameter, split over the ranks that share it;
- the runtime (CPU): what a process's RSS gains by running its first steps beyond its tensors (code
  paged in, thread pools, the allocator's own), measured by calibrate on a tiny model, and with
  checkpointing what the same run gains more (not tensors: the recomputation calls autograd's
  backward inside backward; about the same whatever the model's size).
"""

from __future__ import annotations

from zerobench.engine.config import ModelConfig, ParallelConfig, PrecisionConfig
from zerobench.memory import model_state_bytes
from zerobench.perfmodel.profile import HardwareProfile
from zerobench.stages import rule

FP32 = 4  # bytes of an fp32 element: a CPU host's compute dtype (config.PrecisionConfig), the loss's and Adam's
# NCCL's own device memory per communicator, outside the caching allocator: its FIFOs (NCCL_BUFFSIZE,
# 4 MiB by default, per channel and peer for each protocol; up to 32 channels on NVLink) and, on an
# NVSwitch node with NVLink SHARP, NVLS's buffers. An allowance, not a measurement: 544-688 MB per
# communicator on 4 NVLink A100s (NVIDIA/nccl#964), over 1 GB on H100/H200 nodes with NVLS
# (NVIDIA/nccl#864). scripts/gpu_node_check.sh measures it on its node (docs/gpu.md).
NCCL_COMMUNICATOR_BYTES = 2**30
# The CUDA context a process creates on its device, outside the caching allocator: about 400 MB with
# lazy module loading (CUDA >= 11.7; PyTorch's maintainers, pytorch/pytorch#109888). An assumption
# until a device measures it (torch.cuda.mem_get_info before and after the first CUDA call).
CUDA_CONTEXT_BYTES = 400e6


def outside_allocator_bytes(dp: int, mp: int) -> float:
    """What a GPU rank of a dp × mp layout holds outside the caching allocator: the CUDA context and
    NCCL's buffers per communicator (both assumptions, above)."""
    return CUDA_CONTEXT_BYTES + communicators(dp, mp) * NCCL_COMMUNICATOR_BYTES


def compute_bytes(precision: PrecisionConfig, hw: HardwareProfile) -> int:
    """Bytes per activation element: the compute dtype's. A CPU host computes in fp32 whatever the
    storage (config.PrecisionConfig); a GPU in the storage dtype. The hardware decides, not the
    precision's device field: a GPU profile modelled from a CPU command line is still a GPU."""
    return FP32 if hw.ranks_share_compute else precision.bytes_pgk[0]


def layer_saved_bytes(model: ModelConfig, micro_batch: int, mp: int, act: int = FP32) -> float:
    """Bytes one block saves for backward on one MP rank, `act` bytes per element (the module docstring)."""
    return micro_batch * model.seq * (4 * model.hidden + 13 * model.hidden / mp) * act


def engine_peak(model: ModelConfig, parallel: ParallelConfig, precision: PrecisionConfig, micro_batch: int,
                hw: HardwareProfile) -> dict[str, float]:  # fmt: skip
    """Bytes per rank by category: param, grad, optimizer; activations (kept through backward),
    loss (the logits' buffers beside them), recompute (one block rebuilt with its gradients),
    embedding_grads and buckets (end of backward), step (one piece's fp32 gradient), runtime, nccl
    (NCCL's communicators on a GPU, outside the allocator). `tensor_peak` combines the tensors."""
    mp, t, h = parallel.mp, micro_batch * model.seq, model.hidden
    act = compute_bytes(precision, hw)
    states = model_state_bytes(model.num_params, parallel.stage, parallel.dp, mp, precision.bytes_pgk)
    layer = layer_saved_bytes(model, micro_batch, mp, act)
    vocab = -(-model.vocab // mp)
    if parallel.checkpoint_activations:
        inputs = 0.0 if parallel.offload_activations else model.layers * t * h * act
        acts, recompute = inputs / (mp if parallel.partition_activations else 1), 2 * layer
    else:
        acts, recompute = model.layers * layer, 0.0
    # compute dtype not the storage's: F.linear saves each weight's cast; stage 3 saves a reference
    # instead and gathers and casts again in backward (zero/stage3.py, saved-tensor hooks)
    if precision.bytes_pgk[0] != act and parallel.stage < 3:
        acts += model.num_params / mp * act
    # Stages 2-3 reduce as backward goes: a reduce bucket in flight (C_B, or all the gradients if
    # fewer; stage 3 per module, the embedding last), and stage 3 holds the gathered embedding.
    in_flight = {2: model.num_params / mp * act, 3: vocab * h * act}.get(parallel.stage, 0.0)
    buckets = min(parallel.bucket_bytes, in_flight)
    gathered = vocab * h * precision.bytes_pgk[0] if parallel.stage == 3 else 0.0
    # From its second micro-batch on, stage 3 gathers the next buckets ahead of use along the
    # recorded order (zero/gather.py): up to `prefetch_bytes`, at most the whole model. cpu-10m's
    # RSS at stage 3 was 12 MiB lower with 1 MiB of prefetch than with the default 50 MiB.
    whole_numel = model.num_params / mp
    whole = whole_numel * precision.bytes_pgk[0]
    prefetch = min(parallel.prefetch_bytes, whole) if parallel.stage == 3 else 0.0
    # the step's one fp32 piece: at most a bucket or the largest parameter (never more than the
    # model), 1/N_d of it where sharded; fp32 gradients are read in place (zero/optimizer.py `upcast`)
    piece = min(max(parallel.bucket_bytes / precision.bytes_pgk[1], model.largest_param_numel / mp), whole_numel)
    piece /= rule(parallel.stage).divisor("optimizer_bytes", parallel.dp)  # the rank's Adam share
    piece *= precision.bytes_pgk[1] != FP32
    return {
        **states,
        "activations": acts,
        "loss": (3 if mp == 1 else 2) * t * vocab * FP32,
        "recompute": recompute,
        "embedding_grads": 3 * vocab * h * act,
        "buckets": buckets + gathered,
        "prefetch": prefetch,
        "step": FP32 * piece,
        "runtime": hw.runtime_bytes + (hw.checkpoint_runtime_bytes if parallel.checkpoint_activations else 0.0),
        "nccl": 0.0 if hw.ranks_share_compute else communicators(parallel.dp, mp) * NCCL_COMMUNICATOR_BYTES,
    }


def communicators(dp: int, mp: int) -> int:
    """The communicators a rank of a dp × mp layout makes (parallel/topology.py): WORLD, which is
    also the DP group at mp 1 and the MP group at dp 1, and where both exceed 1 its DP and MP groups;
    none alone. Each holds NCCL's buffers on a GPU (`NCCL_COMMUNICATOR_BYTES`); gloo on a CPU host."""
    if dp * mp == 1:
        return 0
    return 3 if dp > 1 and mp > 1 else 1


def tensor_peak(peak: dict[str, float]) -> float:
    """The tensors' peak: model states, plus the largest of what backward holds at its start (the
    activations and the loss's buffers), in a recomputed block, at its end (the embedding's
    gradients, buckets) and in the step (one fp32 piece). No runtime."""
    states = peak["param_bytes"] + peak["grad_bytes"] + peak["optimizer_bytes"]
    during = peak["activations"] + peak["prefetch"]  # forward's end to backward's, stage 3 gathering ahead
    end = peak["embedding_grads"] + peak["buckets"]
    return states + max(during + peak["loss"], during + peak["recompute"], end, peak["step"])
