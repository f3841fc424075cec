"""parallel/comms.py on real gloo: reduce-scatter and all-gather issued as a pairwise exchange give what
torch.distributed's own collectives give, in and out of place, on the world and on a subgroup
whose group ranks differ from the global ones, with the ledger's ring volume unchanged; and the
spawned gloo world itself (parallel/spawn.py)."""

import atexit
import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.worlds import spawned
from zerobench.engine.parallel import comms as comms_module
from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms


def _compare(rank: int) -> dict:
    ctx = topology.build(dp=2, mp=2)  # dp groups {0, 2} and {1, 3}: group rank != global rank
    out = {}
    for group in (ctx.world, ctx.dp):
        comms = Comms()
        n, c = group.size, 5
        # integers: any summation order gives the same floats, so equality is exact
        inp = torch.arange(n * c, dtype=torch.float32) * (rank + 1) + rank
        mine, ref = torch.empty(c), torch.empty(c)
        comms.reduce_scatter(mine, inp.clone(), group, async_op=True).wait()
        comms_module._REDUCE_SCATTER(ref, inp.clone(), group=group.pg)
        out[f"{group.name} reduce_scatter"] = torch.equal(mine, ref)

        piece = torch.full((c,), float(rank)) + torch.arange(c)
        whole, ref = torch.empty(n * c), torch.empty(n * c)
        comms.all_gather(whole, piece, group)  # out of place, synchronous
        comms_module._ALL_GATHER(ref, piece, group=group.pg)
        out[f"{group.name} all_gather"] = torch.equal(whole, ref)

        inplace = torch.zeros(n * c)
        inplace[group.rank * c : (group.rank + 1) * c] = piece
        comms.all_gather(inplace, inplace[group.rank * c : (group.rank + 1) * c], group, async_op=True).wait()
        out[f"{group.name} all_gather in place"] = torch.equal(inplace, ref)

        ledger = comms.ledger.entries
        out[f"{group.name} volume"] = (
            ledger[("reduce_scatter", group.name)].volume_elements == n * c * (n - 1) / n
            and ledger[("all_gather", group.name)].volume_elements == 2 * n * c * (n - 1) / n
        )
    return out


@pytest.mark.ci
def test_pairwise_exchange_equals_gloo_collectives():
    """Four spawned gloo ranks (about 13 s): the engine's parity tests run the same collectives on the
    threaded process group, so this runs in CI only."""
    for rank, checks in enumerate(spawned(4, _compare)):
        assert all(checks.values()), (rank, checks)


def _abort_at_exit(rank: int, when: str) -> int:
    if rank == 1 and when == "at exit":
        atexit.register(os.abort)  # after the result is written and the ranks have left together
    if rank == 1 and when == "before returning":
        os.abort()
    return rank * 10


@pytest.mark.ci
def test_spawned_keeps_results_written_before_a_rank_died_at_exit(capfd):
    """gloo's teardown can abort a rank after its result is on disk: the run counts, the exit is
    reported. A rank that dies before returning fails the run.

    Spawns and kills ranks (about 11 s), so it runs in CI only."""
    assert spawned(2, _abort_at_exit, "at exit") == [0, 10]
    assert "every rank returned its result" in capfd.readouterr().err
    with pytest.raises(mp.ProcessExitedException, match="SIGABRT"):
        spawned(2, _abort_at_exit, "before returning", timeout_s=20)
