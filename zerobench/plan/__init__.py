"""`zerobench plan`: every layout the engine can express for a model on N GPUs, ranked by the
performance model (`request.py`: the validated request; `rank.py`: enumeration, memory, speed and
rank; `answer.py`: the table and the CSV), its top picks checked by the engine itself
(`verify.py`: traced, or one rank emulated on a local GPU). docs/plan.md."""
