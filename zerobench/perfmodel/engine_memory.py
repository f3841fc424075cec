"""Peak memory of this engine on a CPU host (a measured, `ranks_share_compute` profile), in the
bytes a rank's RSS grows by: what zerobench/engine/model.py and zero/ keep at their peak, plus the
runtime's own that `zerobench calibrate` measures. The paper's codes on GPUs are feasibility.py's.

Read from the code (and checked against `zerobench trace`, which counts every tensor the engine
allocates, in tests/unit/test_engine_memory.py); all activations fp32, the CPU compute dtype:
- model states: the paper's formula per stage (zerobench/memory.py, §5);
- saved for backward, per token of one layer on one MP rank (model.py's Block): the block input
  and the residual sum (layernorm inputs), both layernorm outputs (linear inputs): 4h replicated
  over MP; q, k, v (3h/mp), the attention output and its re-laid copy for the projection
  (2h/mp), the MLP's fc output and GeLU output (8h/mp): 4h + 13h/mp elements; with 16-bit
  storage, each weight's fp32 cast (model.py's `_Cast`), which F.linear saves: 4 bytes per Ψ/mp
  (not at stage 3, which casts again in backward);
- with checkpointing, each block's input instead (b·s·h, /mp with P_a; about none on the host
  with P_a+cpu), and later one block recomputed with its gradients (2 × a layer's saved bytes);
- the loss (model.py's TiedVocab): the fp32 log-softmax over b·s × V/mp logits is saved, and its
  backward holds two more such buffers (the NLL gradient and the log-softmax gradient): 3 × at
  the start of backward, beside the activations; Megatron's vocab-parallel loss (mp > 1,
  parallel/tensor_parallel.py) holds the logits and one buffer it works in place: 2 ×;
- the tied embedding at the end of backward, when the activations are freed: its gradient from
  the lookup, from the output layer, and their sum (3 × V/mp × h), beside stage 2's or 3's
  reduce bucket and stage 3's gathered embedding; the peak is the largest of the three moments;
- stage 3's buckets gathered ahead of use through forward and backward (its prefetch, bounded by
  `prefetch_bytes` and by the whole model), beside the activations; `zerobench trace` runs one
  step, whose first micro-batch records the order to prefetch along, so it sees none;
- the runtime: what a process's RSS gains by running its first steps beyond its tensors (code
  paged in, thread pools, the allocator's own), measured by calibrate on a tiny model, and with
  checkpointing what the same run gains more (not tensors: the recomputation calls autograd's
  backward inside backward; about the same whatever the model's size).
"""

from __future__ import annotations

from zerobench.engine.config import ModelConfig, ParallelConfig, PrecisionConfig
from zerobench.memory import model_state_bytes
from zerobench.perfmodel.profile import HardwareProfile

FP32 = 4  # bytes per activation element: a CPU host computes in fp32 (config.PrecisionConfig)


def layer_saved_bytes(model: ModelConfig, micro_batch: int, mp: int) -> float:
    """Bytes one block saves for backward on one MP rank (see the module docstring)."""
    return micro_batch * model.seq * (4 * model.hidden + 13 * model.hidden / mp) * FP32


def engine_peak(model: ModelConfig, parallel: ParallelConfig, precision: PrecisionConfig, micro_batch: int,
                hw: HardwareProfile) -> dict[str, float]:  # fmt: skip
    """Bytes per rank by category: param, grad, optimizer; activations (kept through backward),
    loss (the logits' buffers beside them), recompute (one block rebuilt with its gradients),
    embedding_grads and buckets (end of backward), runtime. `tensor_peak` combines them."""
    mp, t, h = parallel.mp, micro_batch * model.seq, model.hidden
    states = model_state_bytes(model.num_params, parallel.stage, parallel.dp, mp, precision.bytes_pgk)
    layer = layer_saved_bytes(model, micro_batch, mp)
    vocab = -(-model.vocab // mp)
    if parallel.checkpoint_activations:
        inputs = 0.0 if parallel.offload_activations else model.layers * t * h * FP32
        acts, recompute = inputs / (mp if parallel.partition_activations else 1), 2 * layer
    else:
        acts, recompute = model.layers * layer, 0.0
    # 16-bit storage: F.linear saves each weight's fp32 cast; stage 3 saves a reference instead and
    # gathers and casts again in backward (zero/stage3.py, saved-tensor hooks)
    if precision.bytes_pgk[0] != FP32 and parallel.stage < 3:
        acts += model.num_params / mp * FP32
    # Stages 2-3 reduce as backward goes: a reduce bucket in flight (C_B, or all the gradients if
    # fewer; stage 3 per module, the embedding last), and stage 3 holds the gathered embedding.
    in_flight = {2: model.num_params / mp * FP32, 3: vocab * h * FP32}.get(parallel.stage, 0.0)
    buckets = min(parallel.bucket_bytes, in_flight)
    gathered = vocab * h * precision.bytes_pgk[0] if parallel.stage == 3 else 0.0
    # From its second micro-batch on, stage 3 gathers the next buckets ahead of use along the
    # recorded order (zero/gather.py): up to `prefetch_bytes`, at most the whole model. cpu-10m's
    # RSS at stage 3 was 12 MiB lower with 1 MiB of prefetch than with the default 50 MiB.
    whole = model.num_params / mp * precision.bytes_pgk[0]
    prefetch = min(parallel.prefetch_bytes, whole) if parallel.stage == 3 else 0.0
    return {
        **states,
        "activations": acts,
        "loss": (3 if mp == 1 else 2) * t * vocab * FP32,
        "recompute": recompute,
        "embedding_grads": 3 * vocab * h * FP32,
        "buckets": buckets + gathered,
        "prefetch": prefetch,
        "runtime": hw.runtime_bytes + (hw.checkpoint_runtime_bytes if parallel.checkpoint_activations else 0.0),
    }


def tensor_peak(peak: dict[str, float]) -> float:
    """The tensors' peak: model states, plus the largest of what backward holds at its start (the
    activations and the loss's buffers), in a recomputed block, and at its end (the embedding's
    gradients, buckets). No runtime."""
    states = peak["param_bytes"] + peak["grad_bytes"] + peak["optimizer_bytes"]
    during = peak["activations"] + peak["prefetch"]  # forward's end to backward's, stage 3 gathering ahead
    return states + max(during + peak["loss"], during + peak["recompute"], peak["embedding_grads"] + peak["buckets"])
