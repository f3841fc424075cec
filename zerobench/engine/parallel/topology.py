"""The 2-D rank layout world = dp × mp (paper §4.3 runs): MP groups of consecutive ranks, as GPUs
inside one node, and DP groups across them. Groups are values handed to whoever needs them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist


@dataclass(frozen=True)
class Group:
    """One process group and this rank's place in it. `pg` is None for a group of one."""

    name: str
    size: int
    rank: int
    pg: object = None


@dataclass(frozen=True)
class ParallelContext:
    dp: Group
    mp: Group
    world: Group

    @property
    def rank(self) -> int:
        return self.world.rank


def single_process() -> ParallelContext:
    one = {"size": 1, "rank": 0}
    return ParallelContext(dp=Group("dp", **one), mp=Group("mp", **one), world=Group("world", **one))


def build(dp: int, mp: int, timeout: timedelta | None = None) -> ParallelContext:
    """Create the groups of a dp × mp world; every rank must call this (new_group is collective).
    `timeout` bounds how long a collective on the groups made here may wait (torch's default
    otherwise); a group of the whole world is WORLD, whose timeout init_process_group set."""
    if not dist.is_initialized():
        if dp * mp != 1:
            raise RuntimeError(f"dp × mp = {dp * mp} ranks requested but torch.distributed is not initialized")
        return single_process()
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if world_size != dp * mp:
        raise ValueError(f"dp × mp = {dp} × {mp} = {dp * mp} does not match the world size {world_size}")
    mine: dict[str, Group] = {}
    # MP groups: consecutive ranks [i*mp, (i+1)*mp); DP groups: ranks with the same MP index.
    layouts = {
        "mp": [list(range(i * mp, (i + 1) * mp)) for i in range(dp)],
        "dp": [list(range(j, world_size, mp)) for j in range(mp)],
    }
    for name, rank_lists in layouts.items():
        for ranks in rank_lists:
            pg = _process_group(ranks, world_size, timeout)
            if rank in ranks:
                mine[name] = Group(name, len(ranks), ranks.index(rank), pg)
    world = Group("world", world_size, rank, dist.group.WORLD if world_size > 1 else None)
    return ParallelContext(dp=mine["dp"], mp=mine["mp"], world=world)


def _process_group(ranks: list[int], world_size: int, timeout: timedelta | None):
    """The process group of `ranks`: None for one rank; WORLD itself when they are the whole world
    (the DP group at mp 1, the MP group at dp 1), since each group is a communicator of its own
    under NCCL, with its own buffers (perfmodel/engine_memory.py, `communicators`)."""
    if len(ranks) == 1:
        return None
    if len(ranks) == world_size:
        return dist.group.WORLD
    return dist.new_group(ranks, timeout=timeout)


def leave_together() -> None:
    """Wait for every rank, then destroy all process groups. A rank that exits while a peer still
    holds their gloo pairs open can abort in gloo's threads at exit ("terminate called without an
    active exception"; seen with point-to-point traffic, 3 runs in 24), so ranks that finished
    cleanly leave at the same moment."""
    if dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()
