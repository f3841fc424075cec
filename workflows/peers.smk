# Ours beside the systems people already use (DDP, ZeroRedundancyOptimizer, FSDP2, DeepSpeed 0-3):
# the same model, weights, data, batch, precision and world size, one implementation at a time.
# Included by the Snakefile; `snakemake peers` builds it (README gives its time).
# The default target reads the committed results/peers.csv when `peers: {in_report: true}`;
# it reruns the comparison only when that file is missing. Settings: PEERS in common.smk.


rule peers:
    """Measured side by side: median step time, spread, peak RSS per rank, collective bytes and
    per-step losses of every implementation, with the ratios ours / peer."""
    output:
        table="results/peers.csv",
        figure="figures/peers.png",
    log:
        "results/logs/peers.log",
    conda:
        "envs/zerobench.yaml"
    resources:
        trial_slots=1,  # timed: never beside a measured trial
        timed=TIMED,  # nor beside any other job
    params:
        model=PEERS["model"],
        dp=PEERS["dp"],
        micro_batch=PEERS["micro_batch"],
        warmup=PEERS["warmup"],
        steps=PEERS["steps"],
        clip_norm=PEERS["clip_norm"],
        reuse_mb=PEERS["reuse_mb"],
        rounds=PEERS["rounds"],
    shell:
        "python -m zerobench.cli peers --model {params.model} --dp {params.dp} "
        "--micro-batch {params.micro_batch} --warmup {params.warmup} --steps {params.steps} "
        "--clip-norm {params.clip_norm} --reuse-mb {params.reuse_mb} --rounds {params.rounds} --out {output.table} --figure {output.figure} > {log} 2>&1"
