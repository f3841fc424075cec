"""Each ZeRO-DP stage's rule, in one table (paper §5 and §7): which model states it partitions
over the N_d data-parallel ranks, and what its data-parallel collectives move per step. Torch-free;
the engine's checks, the memory formulas (memory.py), the network model (perfmodel/) and the tables
(artifacts/) read it, so a stage's rule is written once.

Volumes are in units of Ψ(N_d − 1)/N_d elements sent per rank per step (the paper's "2Ψ" and
"3Ψ" of §7): a ring all-reduce moves 2 of them, a reduce-scatter or an all-gather 1.
"""

from __future__ import annotations

from dataclasses import dataclass

STATES = ("param_bytes", "grad_bytes", "optimizer_bytes")  # the model states, as records name them
RING_UNITS = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0}  # Ψ(N_d-1)/N_d per call over Ψ


def ring_volume(op: str, n: int) -> float:
    """Elements one rank sends per element of an `op` over `n` ranks on a ring (NCCL's, §7): its
    units (RING_UNITS) times (n − 1)/n. The one home of the ring factor: the engine's ledger, the
    node check and the network model (perfmodel/network.py) read it here."""
    return RING_UNITS[op] * (n - 1) / n


@dataclass(frozen=True)
class StageRule:
    """One stage. `partitions`: the model states split over N_d (the rest are replicated);
    `collectives`: the data-parallel collectives of one step, each over all Ψ/N_m elements, in the
    order the engine issues them (stage 3: the forward gather, the backward gather, the gradient
    reduce-scatter, per micro-batch)."""

    stage: int
    label: str  # the paper's name (§5)
    partitions: tuple[str, ...]
    collectives: tuple[str, ...]

    @property
    def volume(self) -> float:
        """Elements sent per rank per step over Ψ(N_d − 1)/N_d: 2 for stages 0-2, 3 for stage 3 (§7)."""
        return sum(RING_UNITS[c] for c in self.collectives)

    def divisor(self, state: str, dp: int) -> int:
        """What a model state's full size is divided by on one rank: N_d if partitioned, else 1."""
        if state not in STATES:
            raise ValueError(f"state={state!r}: must be one of {STATES}")
        return dp if state in self.partitions else 1


STAGES: dict[int, StageRule] = {
    0: StageRule(0, "baseline", (), ("all_reduce",)),
    1: StageRule(1, "P_os", ("optimizer_bytes",), ("reduce_scatter", "all_gather")),
    2: StageRule(2, "P_os+g", ("optimizer_bytes", "grad_bytes"), ("reduce_scatter", "all_gather")),
    3: StageRule(3, "P_os+g+p", STATES[::-1], ("all_gather", "all_gather", "reduce_scatter")),
}
STAGE_LABELS = {s: rule.label for s, rule in STAGES.items()}


def rule(stage: int) -> StageRule:
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r}: must be one of {sorted(STAGES)}")
    return STAGES[stage]
