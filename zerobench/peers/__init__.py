"""Ours beside the systems people already use: the same GPT, initial weights, data, global batch,
precision and world size trained by our engine (stages 0–3), PyTorch DDP, ZeroRedundancyOptimizer,
FSDP2 and DeepSpeed 0–3 (a data-parallel world), or by the plain PyTorch loop, eager and compiled,
and FSDP2 (one device, docs/gpu-peers.md), one implementation per spawned world (`zerobench peers`).

workload.py: the shared model, data and step; ours.py, torch_peers.py, plain.py, deepspeed_peer.py:
one module per family; harness.py: the measurement harness, which imports each family;
runner.py: rows and ratios; summary.py: table and figure.
"""
