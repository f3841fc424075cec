"""Hand-made records for the tests of the tables that read them."""

from __future__ import annotations

# a measured glibc step of the tiny model on one rank: the configuration columns a table joins on
TINY_STEP = dict(
    status="ok", model="tiny", layers=2, hidden=64, heads=4, seq=32, vocab=256, dp=1, mp=1, stage=0,
    bucket_bytes=2**20, checkpoint_activations=False, partition_activations=False, offload_activations=False,
    contiguous_buffers=False, precision="fp32", device="cpu", micro_batch=4, grad_accum=1, steps=2,
    num_params=1000, allocator="system", comm={},
)  # fmt: skip
