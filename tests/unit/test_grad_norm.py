"""The global gradient norm the engine clips by: exact to fp64 on gradients of the size a 100M
model has, where torch's fp32 CPU norm kernel is not (pytorch/pytorch#169237) — the reason the
peers comparison runs without clipping (workflows/common.smk, PEERS)."""

import torch

from zerobench.engine.parallel.comms import Comms
from zerobench.engine.zero.optimizer import clip_, global_grad_norm


def _gradients() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    # one embedding-sized piece (32000 × 512), one odd-length piece, one tiny one
    return [torch.randn(16_384_000, generator=g) * 1e-3, torch.randn(4097, generator=g), torch.randn(3, generator=g)]


def test_norm_is_exact_to_fp64_on_large_pieces():
    grads = _gradients()
    exact = torch.sqrt(sum((x.double() ** 2).sum() for x in grads)).item()
    ours = global_grad_norm(grads, Comms(), []).item()
    assert abs(ours - exact) / exact < 3e-7  # returned in fp32: its own rounding is up to 6e-8


def test_clip_scales_as_torch_does():
    grads = [torch.full((10,), 3.0), torch.full((6,), -4.0)]
    ref = [g.clone().requires_grad_() for g in grads]
    for r, g in zip(ref, grads):
        r.grad = g.clone()
    total = torch.nn.utils.clip_grad_norm_(ref, max_norm=1.0)
    norm = global_grad_norm(grads, Comms(), [])
    assert torch.allclose(norm, total)
    clip_(grads, norm, 1.0)
    for r, g in zip(ref, grads):
        assert torch.allclose(r.grad, g)
    before = [g.clone() for g in grads]
    clip_(grads, norm, 0.0)  # 0 disables clipping
    assert all(torch.equal(a, b) for a, b in zip(before, grads))
