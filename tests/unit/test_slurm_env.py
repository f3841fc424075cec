"""zerobench.runtime.slurm_env: SLURM's task variables -> torch's env:// rendezvous (no processes, no torch)."""

from __future__ import annotations

import pytest

from zerobench.runtime.slurm_env import PORT_BASE, PORT_SPAN, torch_env

STEP = {
    "SLURM_JOB_ID": "41234",
    "SLURM_STEP_ID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_JOB_NODELIST": "gpu[07-08],cpu1",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
}


def hosts(seen):
    def first(nodelist):
        seen.append(nodelist)
        return nodelist.split("[")[0] + "07"

    return first


def test_a_task_of_a_four_task_step_gets_its_rank_and_the_jobs_rendezvous():
    seen = []
    assert torch_env(STEP, 4, hosts(seen)) == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "gpu07",
        "MASTER_PORT": str(PORT_BASE + 41234 % PORT_SPAN),
    }
    assert seen == ["gpu[07-08]"]  # the step's nodes, not the whole job's


def test_the_job_nodelist_serves_when_the_step_has_none_and_a_set_master_wins():
    seen = []
    env = {k: v for k, v in STEP.items() if k != "SLURM_STEP_NODELIST"}
    assert torch_env(env, 4, hosts(seen))["MASTER_ADDR"] == "gpu07" and seen == ["gpu[07-08],cpu1"]
    mine = torch_env({**STEP, "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29400"}, 4, hosts([]))
    assert (mine["MASTER_ADDR"], mine["MASTER_PORT"]) == ("10.0.0.5", "29400")


def test_ports_of_two_jobs_differ_and_stay_in_the_band():
    ports = {int(torch_env({**STEP, "SLURM_JOB_ID": job}, 4, hosts([]))["MASTER_PORT"]) for job in ("9", "10", "20009")}
    assert len(ports) == 2 and all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)  # 9 and 20009 wrap


@pytest.mark.parametrize(
    "env",
    [
        {},  # not under SLURM
        {k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"},  # the batch script: one process
        {**STEP, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"},  # srun -n 1: zerobench launches the ranks
        {**STEP, "RANK": "0", "WORLD_SIZE": "4"},  # torchrun inside the step already set them
    ],
)
def test_nothing_to_join_outside_a_multi_task_step(env):
    assert torch_env(env, 4, hosts([])) == {}


def test_a_step_of_another_size_than_the_trial_is_refused():
    with pytest.raises(ValueError, match="4 tasks but the trial's world size .* is 2: start it with srun -n 2"):
        torch_env(STEP, 2, hosts([]))
