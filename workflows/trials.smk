# One trial = one record: results/runs/<source>_<trial-id>.json for a measured or traced trial,
# results/runs/<artifact>.g<index>/<source>_<trial-id>.json for a modelled group's trials. Out of
# memory, infeasible and over the time limit are records with that status (exit 0); anything else
# fails the job, log kept.


# Units of the `timed` resource a timed rule holds (here and in peers.smk): every unit the local
# profile provides (a request above the provided amount is capped to it), so that no other job,
# which holds one, runs beside it.
TIMED = 100


rule run_trial:
    """A measured trial: real steps of the engine on dp x mp ranks (gloo on CPU, NCCL on GPU)."""
    input:
        profile=trial_profile,
    output:
        "results/runs/{source}_{trial}.json",
    log:
        "results/logs/{source}_{trial}.log",
    benchmark:
        "results/benchmarks/{source}_{trial}.tsv"
    wildcard_constraints:
        source="measured",
    conda:
        "envs/zerobench.yaml"
    # One core per rank (capped at --cores): no other job, a traced trial or a modelled group,
    # shares the cores this trial times its steps on.
    threads: trial_world
    resources:
        gpu=trial_gpus,
        tasks=trial_world,
        mpi=trial_mpi,
        runtime=lambda wc, attempt: 30 * attempt,
        mem_mb=16000,
        trial_slots=1,
        timed=TIMED,
    params:
        flags=trial_flags,
        device=config["device"],
        time_limit=config["time_limit_s"],
        reference=reference_flag,
    # one intra-op thread per rank: Snakemake sets OMP_NUM_THREADS and MKL_NUM_THREADS (MKL runs the
    # GEMMs) to the job's threads, its ranks
    shell:
        "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 {resources.mpi} python -m zerobench.cli run {params.flags}"
        " --device {params.device}"
        " --time-limit {params.time_limit} {params.reference} --out {output} > {log} 2>&1"


rule run_interleaved:
    """An interleaved measured group (a sheet's `interleave: R`, zerobench/sweeps/interleave.py): its
    trials in R rounds in one job, so that the points a table compares are timed side by side.
    """
    output:
        directory("results/runs/{artifact}.i{group}"),
    log:
        "results/logs/{artifact}.i{group}.log",
    benchmark:
        "results/benchmarks/{artifact}.i{group}.tsv"
    conda:
        "envs/zerobench.yaml"
    # the largest trial's ranks, one core each, held throughout: nothing else times on them
    threads: interleaved_world
    resources:
        gpu=interleaved_gpus,
        tasks=interleaved_world,
        runtime=interleaved_runtime,
        mem_mb=16000,
        trial_slots=1,
        timed=TIMED,
    params:
        sheet=sheet_path,
        trials=interleaved_trials,
        device=config["device"],
        time_limit=config["time_limit_s"],
        launcher=config["launcher"],
    shell:
        "python -m zerobench.cli sweep {params.sheet} --group {wildcards.group} --outdir {output}"
        " --device {params.device} --time-limit {params.time_limit} --launcher '{params.launcher}' > {log} 2>&1"


rule emulate_trial:
    """An emulated trial: one rank of a dp x mp world of any size on this job's one device (real
    memory and compute; collectives priced by the model), `zerobench emulate`."""
    output:
        "results/runs/{source}_{trial}.json",
    log:
        "results/logs/{source}_{trial}.log",
    wildcard_constraints:
        source="emulated",
    conda:
        "envs/zerobench.yaml"
    # one rank whatever the world: one GPU on a GPU cluster, one core on a CPU; timed, so nothing
    # else runs beside the steps it times
    resources:
        gpu=lambda wc: 1 if config["device"] == "cuda" else 0,
        runtime=lambda wc, attempt: 30 * attempt,
        mem_mb=16000,
        trial_slots=1,
        timed=TIMED,
    params:
        flags=trial_flags,
        device=config["device"],
    # a sheet's trial may set its own device: its flag comes after the config's, and wins
    shell:
        "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python -m zerobench.cli emulate --device {params.device}"
        " {params.flags} --out {output} > {log} 2>&1"


rule trace_trial:
    """A traced trial: one step of the same engine under FakeTensorMode, at paper scale."""
    output:
        "results/runs/{source}_{trial}.json",
    log:
        "results/logs/{source}_{trial}.log",
    wildcard_constraints:
        source="traced",
    conda:
        "envs/zerobench.yaml"
    resources:
        runtime=30,
        mem_mb=8000,
    params:
        flags=trial_flags,
    shell:
        "python -m zerobench.cli trace {params.flags} --out {output} > {log} 2>&1"


rule model_group:
    """A modelled group of a sheet: every trial through the performance model in one process, one
    record per trial (a process per trial would spend its time importing)."""
    output:
        directory("results/runs/{artifact}.g{group}"),
    log:
        "results/logs/{artifact}.g{group}.log",
    conda:
        "envs/zerobench.yaml"
    params:
        sheet=sheet_path,
        smoke="--smoke" if config["smoke"] else "",
        trials=group_trials,
    shell:
        "python -m zerobench.cli sweep {params.sheet} --group {wildcards.group} {params.smoke}"
        " --outdir {output} > {log} 2>&1"


rule calibrate:
    """This machine's measured hardware profile (`zerobench calibrate`), which the model_vs_measured
    and capacity tables predict from."""
    output:
        "results/profiles/calibrated-{device}.json",
    log:
        "results/logs/calibrate_{device}.log",
    conda:
        "envs/zerobench.yaml"
    # timed microbenchmarks on two cores (two-rank collectives, two ranks' concurrency): nothing
    # runs beside them
    threads: 2
    resources:
        trial_slots=1,
        timed=TIMED,
    params:
        # a smoke run checks the plumbing: one sweep of the grids (the sheets' runs take the default)
        passes="--passes 1" if config.get("smoke") else "",
    shell:
        "python -m zerobench.cli calibrate --device {wildcards.device} {params.passes} --out {output} > {log} 2>&1"
