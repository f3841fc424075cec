"""Parallelism below ZeRO: the dp × mp process groups passed explicitly (`topology`), Megatron
tensor parallelism (`tensor_parallel`, applied by `megatron`), spawning gloo worlds for tests and
benchmarks (`spawn`), and `comms`, the only place collectives are issued, with the ledger that
counts their calls, bytes and seconds."""
