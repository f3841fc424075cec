"""The host's share of stage 3's step on a GPU: what gathering module by module costs beside the
collectives (paper §5.3: parameters gathered before each use, in forward and again in backward).

Stage 3 gathers one bucket per module (schedule.stage3_modules: 6 per layer plus the root's) in
forward, again in the recomputed forward, and in backward, and reduces each module's gradient
(zero/stage3.py, zero/gather.py). Each gather is host work (Python bookkeeping, parameter views,
hooks, the launch of the copy or collective) that the GPU waits for once the host falls behind.
The host runs ahead of the device by queueing kernels, so it costs nothing while the device is
busier than the host, and its excess when the host is the slower of the two: a step costs
max(device, host) (`host_excess`; kernels.py prices a measured GPU's ops so too). The stage's
extra is the step's host-bound excess with the gathers less that without them. At N_d = 1 no
collective is issued (network.py prices none), but each gather is still a device copy of the
module's parameters into its bucket: 2 bytes moved per byte gathered.

Units: seconds, bytes. The constants, measured or fitted on one H200 (results/gpu/h200):
- HOST_OP_S, OPS_PER_LAYER, OPS_FIXED: the host cost of one op and the ops of a layer's forward +
  backward and of the embedding and loss, as `zerobench calibrate --device cuda` measured and
  counted them (calibrated-cuda.json: op_overhead_s, ops_per_layer, ops_fixed); a measured GPU
  profile's own values are read instead;
- GATHER_HOST_S: host seconds per module gathered, fitted on one record, gpt-1.5b stage 3
  micro-batch 1 (its step minus stage 0's, less the copy, over its gathers; docs/gpu.md has the
  numbers); of the other five stage 3 records it moves two, which carry it and are fitted too
  (perfmodel/choices.py), and leaves three unchanged.
"""

from __future__ import annotations

from zerobench.engine.config import ModelConfig, ParallelConfig
from zerobench.perfmodel.constants import Calibration
from zerobench.perfmodel.hardware_profile import HardwareProfile
from zerobench.perfmodel.schedule import stage3_modules

HOST_OP_S = 12.67e-6  # s per op dispatched, measured on the H200 (calibrated-cuda.json op_overhead_s)
OPS_PER_LAYER = 100  # ops of one layer's forward + backward (calibrate's count on the engine's block)
OPS_FIXED = 36  # ops of the embedding, final layernorm and loss, forward + backward (same count)
GATHER_HOST_S = 70.2e-6  # s of host work per module gathered (fitted: gpt-1.5b s3 mb1 on the H200)
FITTED_ON = ("gpt-1.5b", 3, 1)  # GATHER_HOST_S's one point: (preset, stage, micro-batch), results/gpu/h200


def host_excess(host_s: float, device_s: float) -> float:
    """Seconds a step waits for its host beyond its device's `device_s`: the host queues ahead, so
    only what it takes beyond the device's time shows (a step costs max(device, host))."""
    return max(0.0, host_s - device_s)


def gathers_per_step(model: ModelConfig, parallel: ParallelConfig, micro_batches: int) -> int:
    """Module gathers in one step: forward, the recomputed forward (with checkpointing) and backward."""
    passes = 3 if parallel.checkpoint_activations else 2
    return len(stage3_modules(model, parallel.mp)) * passes * micro_batches


def host_ops_s(model: ModelConfig, recompute: bool, micro_batches: int, hw: HardwareProfile) -> float:
    """Host seconds of the step's own ops (forward, [recomputed forward,] backward), stage aside."""
    op_s = hw.op_overhead_s if hw.measured else HOST_OP_S
    per_layer, fixed = (hw.ops_per_layer, hw.ops_fixed) if hw.measured else (OPS_PER_LAYER, OPS_FIXED)
    return op_s * (per_layer * model.layers * (4 / 3 if recompute else 1) + fixed) * micro_batches


def stage3_host_s(
    model: ModelConfig,
    parallel: ParallelConfig,
    micro_batches: int,
    compute_s: float,
    storage_bytes: int,
    hw: HardwareProfile,
    cal: Calibration,
) -> float:
    """Seconds stage 3's module-by-module gathering adds to a step on a GPU, beyond its collectives:
    the host-bound excess it causes, plus at N_d = 1 the gathers' device copies. `compute_s`: the
    step's compute as the model prices it, max(device, host ops) on a measured profile (kernels.py),
    the device's alone on a datasheet one; either way the excess below is the same. Zero below
    stage 3 and on a CPU host (ranks_share_compute: host and device are one there, every op's cost
    is in compute already)."""
    if parallel.stage != 3 or hw.ranks_share_compute:
        return 0.0
    recompute = parallel.checkpoint_activations
    ops = host_ops_s(model, recompute, micro_batches, hw)
    gathers = gathers_per_step(model, parallel, micro_batches) * GATHER_HOST_S
    excess = host_excess(ops + gathers, compute_s) - host_excess(ops, compute_s)
    if parallel.dp > 1:
        return excess
    passes = 3 if recompute else 2
    copied = passes * micro_batches * model.num_params / parallel.mp * storage_bytes  # bytes gathered
    return excess + 2 * copied / (hw.hbm_bw * (1.0 if hw.measured else cal.hbm_efficiency))
