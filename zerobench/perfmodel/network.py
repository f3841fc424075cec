"""α–β collective times over the links each process group actually uses.

Ranks are laid out MP-innermost (Megatron's layout): an MP group is `mp` consecutive ranks, a DP
group takes one rank from each replica (stride `mp`). A group whose members share one node rings
over NVSwitch/NVLink; a group that spans nodes is bounded by InfiniBand. Every group of a kind
runs its collective at the same time (all DP groups reduce together), so the node's NICs are shared:
each GPU gets `ib_share_per_gpu` (DGX-2: 8 × 12.5 GB/s / 16 = 6.25 GB/s). A communicator with
k members per node runs hierarchically (`Ring`): reduce inside the node over NVSwitch, then k
rings across nodes, each on 1/k of the data at one GPU's share; one with a single member per node
(ZeRO's DP groups at MP 16) is a plain ring at the per-GPU share. Ring volumes (NCCL): all-reduce
2(n−1)/n·S, reduce-scatter and all-gather (n−1)/n·S, one α per ring step.

Volumes (paper §5, §7, paper.md §1.4): DP 2Ψ for stages 0–2 (all-reduce, or reduce-scatter +
all-gather), 3Ψ for stage 3; Megatron MP 6 all-reduces of b·s·h per layer with checkpointing
(2 forward, 2 recompute, 2 backward; 4 without), 2 more per micro-batch at the embedding and the
logits, and the vocab-parallel loss's 3 small ones; P_a one all-gather of b·s·h per layer; P_a+cpu
the partitioned checkpoint to host and back.

Overlap rule (stated once): with `Calibration.overlap_grad_reduce` off (the default: Megatron-LM
2019 all-reduces after backward, DeepSpeed 0.2 reduces its buckets in the same stream) nothing
overlaps: every collective and host copy adds to the step. With it on, the gradient reduction
hides behind the last micro-batch's backward and only what outlasts it is exposed. P_os
reduce-scatters (2Ψ) as DeepSpeed's stage 1 of May 2020 did; ZeRO-OS of Feb 2020 all-reduced,
1.5x that volume (paper.md §5.8; `Calibration.zero_os_stage1`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from zerobench.perfmodel import nccl_table
from zerobench.perfmodel.constants import Calibration
from zerobench.perfmodel.hardware import HardwareProfile
from zerobench.perfmodel.schedule import dp_schedule
from zerobench.stages import RING_UNITS, ring_volume


@dataclass(frozen=True)
class Ring:
    """One communicator as the network sees it: `per_node` members in each of `nodes` nodes.

    Bytes: inside a node the members ring over NVLink/NVSwitch (`intra_bw`); across nodes each member
    drives its own share of the node's InfiniBand (`inter_bw`), so a collective runs as intra-node
    reduce-scatter → inter-node ring on 1/per_node of the data → intra-node all-gather (NCCL's
    hierarchical schedule). With one member per node it is a plain ring over InfiniBand.
    Latency: with `nccl` (a datasheet GPU profile), each call pays what NCCL's tuning model gives for
    its size, ranks and nodes, on the algorithm and protocol NCCL would pick (nccl_table.py); else
    (a measured host) α per ring step, `intra_latency` inside the node, `inter_latency` across.
    """

    per_node: int
    nodes: int
    intra_bw: float  # bytes/s per GPU inside the node
    inter_bw: float  # bytes/s per GPU across nodes (its share of the node's NICs)
    intra_latency: float  # s per intra-node ring step (measured hosts)
    inter_latency: float  # s per inter-node ring step (measured hosts)
    nccl: bool = False  # price latency by NCCL's tuning model (nccl_table.py)

    @property
    def size(self) -> int:
        return self.per_node * self.nodes

    def bytes_s(self, nbytes: float) -> float:
        """Seconds a reduce-scatter (or all-gather) of `nbytes` spends moving bytes, latency aside."""
        k, m = self.per_node, self.nodes
        inter = ring_volume("reduce_scatter", m) * nbytes / k / self.inter_bw if m > 1 else 0.0
        return ring_volume("reduce_scatter", k) * nbytes / self.intra_bw + inter

    def choice(self, op: str, nbytes: float) -> nccl_table.Choice:
        """How NCCL runs one call of `op` on `nbytes` over this group (nccl_table.choose)."""
        return nccl_table.choose(op, self.per_node, self.nodes, RING_UNITS[op] * self.bytes_s(nbytes))

    def _time(self, op: str, nbytes: float, calls: int) -> float:
        if self.size == 1:
            return 0.0
        if self.nccl:
            return calls * self.choice(op, nbytes / calls).seconds
        k, m = self.per_node, self.nodes
        alpha = (k - 1) * self.intra_latency + ((m - 1) * self.inter_latency if m > 1 else 0.0)
        return RING_UNITS[op] * (self.bytes_s(nbytes) + calls * alpha)

    def reduce_scatter(self, nbytes: float, calls: int = 1) -> float:
        """Each member ends with 1/size of the reduced `nbytes`, sent as `calls` equal collectives."""
        return self._time("reduce_scatter", nbytes, calls)

    def all_gather(self, nbytes: float, calls: int = 1) -> float:
        return self._time("all_gather", nbytes, calls)

    def all_reduce(self, nbytes: float, calls: int = 1) -> float:
        return self._time("all_reduce", nbytes, calls)


@dataclass(frozen=True)
class Measured:
    """A group on a measured profile (`zerobench calibrate`, at this group size or the nearest
    measured): each call takes what the measured curve gives at its per-rank ring volume,
    interpolated log-log between the measured messages, the smallest one's time below them and
    the fitted bandwidth beyond them (a straight α–β line through the same points overstates
    mid-size messages; docs/perfmodel.md gives the measured gap)."""

    size: int
    bandwidth: dict  # op -> fitted bytes/s of per-rank ring volume
    curves: dict  # op -> ((per-rank ring volume bytes, seconds), ...) ascending

    def _time(self, op: str, factor: float, nbytes: float, calls: int) -> float:
        if self.size == 1:
            return 0.0
        return calls * _along(self.curves[op], factor * nbytes / calls, self.bandwidth[op])

    def reduce_scatter(self, nbytes: float, calls: int = 1) -> float:
        return self._time("reduce_scatter", ring_volume("reduce_scatter", self.size), nbytes, calls)

    def all_gather(self, nbytes: float, calls: int = 1) -> float:
        return self._time("all_gather", ring_volume("all_gather", self.size), nbytes, calls)

    def all_reduce(self, nbytes: float, calls: int = 1) -> float:
        return self._time("all_reduce", ring_volume("all_reduce", self.size), nbytes, calls)


def _along(points: tuple, volume: float, bw: float) -> float:
    """Seconds of one call of `volume` bytes on a measured curve (see Measured)."""
    if volume <= points[0][0]:
        return points[0][1]
    for (v0, t0), (v1, t1) in zip(points, points[1:], strict=False):
        if volume <= v1:
            return t0 * (t1 / t0) ** (math.log(volume / v0) / math.log(v1 / v0))
    return points[-1][1] + (volume - points[-1][0]) / bw


def placement(size: int, stride: int, gpus_per_node: int) -> tuple[int, int]:
    """(members per node, nodes spanned) of a group of `size` ranks `stride` apart."""
    if size == 1:
        return 1, 1
    per_node = 1 if stride >= gpus_per_node else min(size, max(1, gpus_per_node // stride))
    return per_node, math.ceil(size / per_node)


def ring(size: int, stride: int, hw: HardwareProfile, cal: Calibration) -> Ring | Measured:
    if hw.collectives:
        sizes = {row[1] for row in hw.collectives}
        nearest = min(sizes, key=lambda n: (abs(n - size), n))
        curves = {op: tuple(sorted((v, t) for o, n, v, t in hw.collective_table if (o, n) == (op, nearest)))
                  for op, *_ in hw.collectives}  # fmt: skip
        return Measured(size, {op: bw for op, n, _, bw in hw.collectives if n == nearest}, curves)
    per_node, nodes = placement(size, stride, hw.gpus_per_node)
    return Ring(per_node, nodes, hw.intra_bw * cal.nvlink_efficiency, hw.ib_share_per_gpu * cal.ib_efficiency,
                hw.intra_latency, hw.inter_latency, nccl=not hw.measured)  # fmt: skip


# Once a step each MP rank all-reduces its slice's sum of squares for the gradient norm
# (zero/optimizer.py's global_grad_norm): one float64
NORM_BYTES = 8


def mp_calls_per_step(layers: int, recompute: bool, micro_batches: int) -> int:
    """MP all-reduces a step runs: each micro-batch's (`mp_all_reduces`) and the gradient norm's."""
    return micro_batches * sum(mp_all_reduces(layers, recompute)) + 1


def mp_norm_time(mp: int, hw: HardwareProfile, cal: Calibration) -> float:
    """Seconds of the gradient norm's MP all-reduce, once a step (0 without MP)."""
    return ring(mp, 1, hw, cal).all_reduce(NORM_BYTES)


def mp_all_reduces(layers: int, recompute: bool) -> tuple[int, int]:
    """Megatron's MP all-reduces per micro-batch: (of a b·s·h activation, of b·s fp32 values).
    Per layer 4 (2 forward, 2 backward; 2 more to recompute), the vocab-parallel embedding's
    forward and the logits' input gradient; the vocab-parallel loss's 3 (max, target logit, sum of
    exponentials: Megatron's and parallel/tensor_parallel.py's)."""
    return layers * (6 if recompute else 4) + 2, 3


def mp_comm_time(
    micro_batch: int,
    seq: int,
    hidden: int,
    layers: int,
    mp: int,
    act_bytes: int,
    recompute: bool,
    partition: bool,
    offload: bool,
    hw: HardwareProfile,
    cal: Calibration,
) -> tuple[float, float]:
    """(MP collective seconds, host-copy seconds) for one micro-batch on one GPU."""
    msg = micro_batch * seq * hidden * act_bytes  # one b·s·h activation
    group = ring(mp, 1, hw, cal)
    activations, loss = mp_all_reduces(layers, recompute)
    t = activations * group.all_reduce(msg) + loss * group.all_reduce(micro_batch * seq * 4)
    if partition and mp > 1:
        t += layers * group.all_gather(msg)  # P_a: gather the checkpoint before recompute
    host = 2 * layers * (msg / mp) / hw.host_bw if offload else 0.0  # P_a+cpu: out and back
    return t, host  # fmt: skip


def sync_wait(rows: tuple, size: int, compute_s: float) -> float:
    """Seconds a rank waits at a synchronising collective that follows `compute_s` of compute, on a
    measured host (`rows`: (group size, compute s, wait s), nearest group size; none: 0): ranks
    given equal work finish it at different times. Linear in the compute between the measured
    points and from (0, 0); proportional beyond the largest."""
    if size == 1 or not rows or compute_s <= 0:
        return 0.0
    nearest = min({n for n, _, _ in rows}, key=lambda n: (abs(n - size), n))
    points = [(0.0, 0.0), *sorted((c, w) for n, c, w in rows if n == nearest)]
    for (c0, w0), (c1, w1) in zip(points, points[1:], strict=False):
        if compute_s <= c1:
            return w0 + (w1 - w0) * (compute_s - c0) / (c1 - c0)
    return points[-1][1] * compute_s / points[-1][0]


def sync_waits(hw: HardwareProfile, dp: int, mp: int, stage: int, mp_calls: int, compute_s: float,
               micro_batches: int) -> tuple[float, float]:  # fmt: skip
    """(MP, DP) seconds per step that ranks wait for each other at their collectives (`sync_wait`).
    An MP rank blocks at each of its `mp_calls` all-reduces per step (the step's compute split
    evenly between them), and waits what the engine's own MP steps were measured to wait
    (`mp_sync_table`; the matmul benchmark's `sync_table` where none was). A DP rank at stages 0-2
    meets the others once per step, at the gradient reduction; stage 3's gathers run ahead of use
    (zero/gather.py), so its ranks slip apart within a micro-batch and meet when its reductions
    drain, once per micro-batch."""
    mp_rows = hw.mp_sync_table or hw.sync_table
    mp_s = mp_calls * sync_wait(mp_rows, mp, compute_s / mp_calls) if mp > 1 else 0.0
    if stage < 3:
        return mp_s, sync_wait(hw.sync_table, dp, compute_s)
    return mp_s, micro_batches * sync_wait(hw.sync_table, dp, compute_s / micro_batches)


def dp_comm_times(
    params_per_rank: float, stage: int, dp: int, mp: int, grad_bytes: int, hw: HardwareProfile, cal: Calibration,
    micro_batches: int = 1, modules: tuple[float, ...] = (), persistent: float = 0.0, reduce_bucket_elems: int = 0,
) -> tuple[float, float]:  # fmt: skip
    """(overlappable gradient-reduction seconds, exposed seconds) of one step's DP traffic: each call of
    `dp_schedule` priced on the DP group (`ring`). Stage 3 gathers parameters and reduces gradients in
    every micro-batch (3mΨ, zero/stage3.py), one collective per unit each time (`modules`: elements
    per unit, from `stage3_units`)."""
    group = ring(dp, mp, hw, cal)
    schedule = dp_schedule(params_per_rank, stage, grad_bytes, cal, micro_batches, modules, persistent,
                           reduce_bucket_elems)  # fmt: skip
    # a datasheet group is hashable: a layout priced again (a search, a plan) is looked up, not summed
    return _priced(group, schedule) if isinstance(group, Ring) else _price(group, schedule)


def _price(group: Ring | Measured, schedule: tuple) -> tuple[float, float]:
    """(overlappable, exposed) seconds of `schedule`'s calls on `group`."""
    price = {"all_reduce": group.all_reduce, "reduce_scatter": group.reduce_scatter, "all_gather": group.all_gather}
    reduce_s = sum(price[c.op](c.nbytes * c.calls, c.calls) for c in schedule if not c.exposed)
    exposed_s = sum(price[c.op](c.nbytes * c.calls, c.calls) for c in schedule if c.exposed)
    return reduce_s, exposed_s


_priced = functools.lru_cache(maxsize=1 << 12)(_price)
