"""Join a torch.distributed world from SLURM's environment, as torchrun's variables would.

`srun -n W zerobench run ...` starts W tasks, one per rank, on one node or many (the multi-node
launch of the paper's runs, §10: 400 GPUs over 25 DGX-2 nodes). Each task finds its place in
SLURM's variables; `torch_env` turns them into the env:// rendezvous torch reads. Only a job step
counts (SLURM_STEP_ID set): a batch script also sees SLURM_NTASKS, but it is one process, not W.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping

# Rendezvous ports: one per job, in a band above the well-known and below the ephemeral ports, so
# that trials of different jobs sharing a node never meet on the same port.
PORT_BASE = 15000
PORT_SPAN = 20000


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list ("gpu[03-05],cpu1" -> "gpu03"), as SLURM expands it."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def torch_env(env: Mapping[str, str], world_size: int, hostnames: Callable[[str], str] = first_host) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for this task of a multi-task SLURM
    step, or {} where SLURM did not start the ranks (no step, one task, or a launcher's variables
    already set). `world_size` is the trial's dp x mp: a step of another size is an error, since
    its tasks could never form the trial's world."""
    if "RANK" in env or "SLURM_STEP_ID" not in env or int(env.get("SLURM_NTASKS", "1")) <= 1:
        return {}
    tasks = int(env["SLURM_NTASKS"])
    if tasks != world_size:
        raise ValueError(
            f"SLURM step has {tasks} tasks but the trial's world size (dp x mp) is {world_size}: "
            f"start it with srun -n {world_size}"
        )
    nodelist = env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"]
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": str(tasks),
        "LOCAL_RANK": env["SLURM_LOCALID"],
        # Rank 0 is the first task of the step's first node (SLURM's default block distribution).
        "MASTER_ADDR": env.get("MASTER_ADDR") or hostnames(nodelist),
        "MASTER_PORT": env.get("MASTER_PORT") or str(PORT_BASE + int(env["SLURM_JOB_ID"]) % PORT_SPAN),
    }


def join(world_size: int) -> None:
    """Under `srun -n W`, set this process's torch variables from SLURM's and say so on stderr (one
    line per rank in the job's log: the evidence that the ranks joined one world)."""
    found = torch_env(os.environ, world_size)
    if found:
        os.environ.update(found)
        print(
            f"zerobench: rank {found['RANK']} of {found['WORLD_SIZE']} from SLURM "
            f"(job {os.environ['SLURM_JOB_ID']}, rendezvous {found['MASTER_ADDR']}:{found['MASTER_PORT']})",
            file=sys.stderr,
            flush=True,
        )
