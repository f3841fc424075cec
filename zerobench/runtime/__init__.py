"""The harness that runs the engine (zerobench/engine/) for one trial: how a measured trial builds
the trained thing and times its steps (`train`), where its ranks come from (`launch`, `slurm_env`,
`procs`), the token batches (`batches`), the same engine traced under FakeTensorMode at any scale
(`trace`, with its storage counter `counter`), one rank of any world emulated on one device
(`emulate`, its collectives `emulated_comms`), sharded training-state snapshots (`snapshot`,
`snapshot_files`), faults on purpose and the watchdog (`faults`), and what differs per device and
host (`devices`, `probe`, `allocator`)."""
