"""NCCL's cost structure for one collective call: a base latency per algorithm and protocol, a
hardware latency per ring (or tree) step that differs inside a node (NVLink) and across it (the
network), a bandwidth share per protocol, and the algorithm/protocol pair NCCL would pick: the one
with the least predicted time for the call's size.

Source (version 1 of this table): NVIDIA NCCL `src/graph/tuning.cc`, v2.7-v2.9 (2020-2021, the
releases the paper's and Megatron-LM 2021's runs used; https://github.com/NVIDIA/nccl/blob/v2.8.4-1/
src/graph/tuning.cc): `baseLat`, `hwLat`, the step counts of `ncclTopoTuneModel` (ring: nRanks−1
steps for all-gather / reduce-scatter and 2(nRanks−1) for all-reduce, nNodes−1 resp. 2(nNodes−1)
of them across the network; tree: 2·((ppn−1)·intra + log2(nNodes)·inter)) and its protocol
refinements (`bandwidth_share`: LL at 1/4 of the bus bandwidth across nodes and for all-reduce, 1/3
otherwise; LL128 at 0.92 with several ranks per node, 0.7 with one; the tree at 0.92). NCCL of those
versions has no tree all-gather or reduce-scatter (ring only). Not taken: the per-channel bandwidth caps (`llMaxBw`,
`ll128MaxBwPerCh`) and the tree's medium-size correction factors; the bus bandwidth itself is the
caller's (network.Ring: NVLink inside the node, the GPU's share of the node's NICs across it).
Latencies are microseconds in the source and seconds here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

VERSION = 1  # bump when a constant or rule below changes
SOURCE = "NVIDIA NCCL src/graph/tuning.cc v2.7-v2.9 (baseLat, hwLat, ncclTopoTuneModel)"
PROTOCOLS = ("LL", "LL128", "Simple")
ALGORITHMS = ("tree", "ring")
US = 1e-6
# s per call, by algorithm then protocol (tuning.cc `baseLat`, Tree {LL, LL128, Simple}, Ring {...})
BASE_LAT = {"tree": (4.4 * US, 4.4 * US, 0.0), "ring": (3.6 * US, 10.0 * US, 8.4 * US)}
# s per step, by link, algorithm, protocol (tuning.cc `hwLat`; NVLink, PCI, network)
HW_LAT = {
    "nvlink": {"tree": (0.52 * US, 1.25 * US, 28 * US), "ring": (0.47 * US, 1.9 * US, 3.4 * US)},
    "pci": {"tree": (1.0 * US, 1.9 * US, 28 * US), "ring": (1.0 * US, 2.5 * US, 5.7 * US)},
    "net": {"tree": (5.0 * US, 8.5 * US, 28 * US), "ring": (2.7 * US, 4.0 * US, 14.0 * US)},
}
OPS = ("all_reduce", "reduce_scatter", "all_gather")


@dataclass(frozen=True)
class Choice:
    """One call as NCCL would run it: algorithm, protocol, latency and bandwidth seconds."""

    algorithm: str
    protocol: str
    latency_s: float
    bandwidth_s: float

    @property
    def seconds(self) -> float:
        return self.latency_s + self.bandwidth_s


def latency(op: str, algorithm: str, protocol: str, per_node: int, nodes: int, intra: str = "nvlink") -> float:
    """Seconds of latency of one call of `op` over `per_node` × `nodes` ranks (tuning.cc's model)."""
    p = PROTOCOLS.index(protocol)
    intra_lat, inter_lat = HW_LAT[intra][algorithm][p], HW_LAT["net"][algorithm][p]
    base = BASE_LAT[algorithm][p]
    if algorithm == "tree":  # up and down the tree: the node's chain, then log2(nodes) network hops
        return base + 2 * ((per_node - 1) * intra_lat + math.log2(nodes) * inter_lat)
    ranks = per_node * nodes
    steps, inter = (2 * (ranks - 1), 2 * (nodes - 1)) if op == "all_reduce" else (ranks - 1, nodes - 1)
    return base + (steps - inter) * intra_lat + inter * inter_lat


def bandwidth_share(op: str, algorithm: str, protocol: str, per_node: int, nodes: int) -> float:
    """Fraction of the ring's Simple bus bandwidth an algorithm and protocol reach (tuning.cc's
    refinements: ring LL 1/4 across nodes or for all-reduce, else 1/3; ring LL128 0.92, 0.7 with one
    rank per node; tree 0.92 of the bus, LL at 1/3.8 of that, LL128 at 7/9 in one node, 120/128 across)."""
    if algorithm == "tree":
        return 0.92 * {"LL": 1 / 3.8, "LL128": 7 / 9 if nodes == 1 else 120 / 128, "Simple": 1.0}[protocol]
    if protocol == "LL":
        return 1 / 4 if nodes > 1 or op == "all_reduce" else 1 / 3
    if protocol == "LL128":
        return 0.92 if per_node > 1 else 0.7
    return 1.0


def algorithms(op: str) -> tuple[str, ...]:
    """What NCCL of these versions offers for `op`: tree and ring for all-reduce, ring otherwise."""
    if op not in OPS:
        raise ValueError(f"op={op!r}: must be one of {OPS}")
    return ALGORITHMS if op == "all_reduce" else ("ring",)


@lru_cache(maxsize=1 << 16)  # stage 3 prices one call per unit, most of them of a few sizes
def choose(op: str, per_node: int, nodes: int, simple_s: float, intra: str = "nvlink") -> Choice:
    """The algorithm/protocol NCCL picks for one call whose bytes take `simple_s` at full bus bandwidth
    (the caller's ring time of the bytes alone): the least latency + bandwidth time."""
    if per_node * nodes == 1:
        return Choice("none", "none", 0.0, 0.0)
    options = (
        Choice(a, p, latency(op, a, p, per_node, nodes, intra), simple_s / bandwidth_share(op, a, p, per_node, nodes))
        for a in algorithms(op)
        for p in PROTOCOLS
    )
    return min(options, key=lambda c: c.seconds)


def table() -> list[dict]:
    """The constants as rows (for docs and the worked example): link, algorithm, protocol, µs."""
    rows = [
        dict(kind="base", link="", algorithm=a, protocol=p, us=BASE_LAT[a][i] / US)
        for a in ALGORITHMS
        for i, p in enumerate(PROTOCOLS)
    ]
    rows += [
        dict(kind="per step", link=link, algorithm=a, protocol=p, us=HW_LAT[link][a][i] / US)
        for link in HW_LAT
        for a in ALGORITHMS
        for i, p in enumerate(PROTOCOLS)
    ]
    return rows
