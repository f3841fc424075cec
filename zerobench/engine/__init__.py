"""The ZeRO engine, readable alone (paper §5-§7): validated configs and a trial defined once
(`config`, `fields`, `trial`), the plain GPT (`model`), parallelism below ZeRO (`parallel`), ZeRO-DP
and ZeRO-R (`zero`), and one trial's runtime, measured or traced (`runtime`). It imports nothing
of the reproduction tooling, only itself and the ground floor (zerobench/memory.py, flops.py,
results.py, clock.py, gpus.py)."""
