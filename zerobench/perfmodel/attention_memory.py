"""What an attention kernel keeps for backward, per transformer layer on one MP rank, in bytes; and
what a code's kernel keeps beyond this engine's at the step's peak. One place for the s² term, so
every memory model that prices a code's attention (feasibility.py's formulas, an implementation
profile's memory, the planner's) prices the same bytes.

Per layer, b sequences of s tokens, a/N_m heads on one MP rank (Korthikanti et al. 2022, §4.1,
Megatron's attention without sequence parallelism):
- `materialized` (the paper's 2020 codes, Megatron-LM's scale-mask-softmax): the softmax output and
  the dropout's output, b·a/N_m·s² each in the activation dtype, and the dropout mask, one byte an
  element: 5·a·s²·b/N_m bytes in 16-bit;
- `fused` (flash-style, torch's scaled_dot_product_attention, which this engine calls,
  kernels.ENGINE_ATTENTION): one fp32 log-sum-exp per row, a/N_m·b·s; no s² tensor.
The q, k, v and the attention's output both kernels keep alike (engine_memory.py prices them).
"""

from __future__ import annotations

from zerobench.engine.config import ModelConfig, ParallelConfig
from zerobench.perfmodel.kernels import ENGINE_ATTENTION, check_attention

FP32 = 4  # bytes of the fused kernel's log-sum-exp
MASK = 1  # bytes of a dropout mask element (torch.bool)


def kept_bytes(model: ModelConfig, micro_batch: int, mp: int, act_bytes: int, attention: str) -> float:
    """Bytes one layer's attention keeps for backward on one MP rank, beyond q, k, v and its output
    (the module docstring); `act_bytes` per activation element."""
    rows = model.heads / mp * micro_batch * model.seq  # one per (head, sequence, query token)
    if check_attention(attention) == "materialized":
        return rows * model.seq * (2 * act_bytes + MASK)
    return rows * FP32


def surplus_bytes(
    model: ModelConfig, parallel: ParallelConfig, micro_batch: int, act_bytes: int, attention: str
) -> float:
    """What a code running `attention` holds at the step's peak beyond this engine (which runs
    ENGINE_ATTENTION): the difference per layer, for every layer without checkpointing (each keeps
    its own until its backward), for the one block rebuilt with it. Added to the peak wherever it
    lies, so an upper bound where the peak is not in a block's backward (the loss, the step)."""
    extra = kept_bytes(model, micro_batch, parallel.mp, act_bytes, attention)
    extra -= kept_bytes(model, micro_batch, parallel.mp, act_bytes, ENGINE_ATTENTION)
    return extra * (1 if parallel.checkpoint_activations else model.layers)
