"""The ZeRO engine, the paper's mechanism alone (paper §5-§7), readable in one sitting: validated
configs (`config`), the plain GPT (`model`), per-block compilation (`compile`), parallelism below
ZeRO (`parallel`), and ZeRO-DP and ZeRO-R (`zero`). It imports nothing but itself and the ground
floor (zerobench/memory.py, flops.py, results.py, clock.py, gpus.py, stages.py): a trial's vocabulary
lives in zerobench/trial/, the harness that runs the engine in zerobench/runtime/."""
