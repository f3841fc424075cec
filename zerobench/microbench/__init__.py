"""`zerobench calibrate`: microbenchmarks of this machine written as a hardware profile file that
the performance model reads (perfmodel/profile_file.py). `machine` runs the whole calibration and
the collective benchmarks; `kernels` times each kernel a step runs; `concurrency` measures how much
ranks sharing a host slow each other; `engine_runs` runs the engine itself for what only a real
step shows (the runtime's memory, the MP all-reduce inside a step). Its product is a measured
hardware profile (a "calibrated profile"); the performance model's fitted constants are another
thing, perfmodel/constants.py's `Calibration`, fitted by zerobench/fitting/."""
