"""The one-device peers on a GPU at a tiny size (scripts/gpu_check.sh runs them at gpt-1.5b and
dp-6b after this): the plain loop under bf16 autocast, FSDP2 with its bf16 mixed-precision policy
over an NCCL group of one rank, and ours in bf16, each in its own process. Skipped without CUDA."""

import json

import pytest
import torch

from tests.engine_cases import spec_for
from zerobench.gpus import peak_flops, profile_of
from zerobench.peers import runner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_plain_loop_fsdp2_and_ours_on_one_gpu():
    """Every row measured on the GPU: peak allocated memory from its own process, TFLOPS and MFU
    over the device's datasheet peak, and a first loss close to ours' (bf16: the plain loop's
    autocast and FSDP2's cast round the same fp32 weights that ours stores in bf16)."""
    spec = spec_for("tiny", "bf16", device="cuda", steps=3, checkpoint_activations=True)
    rows = runner.run_peers(spec, ["ours-0", "plain", "fsdp2-reshard"], log=print)
    assert [r["impl"] for r in rows] == ["ours-0", "plain", "fsdp2-reshard"]
    assert [r["status"] for r in rows] == ["ok"] * 3, [r["error"] for r in rows]
    profile = profile_of(torch.cuda.get_device_name(0))
    for r in rows:
        assert r["device"] == "cuda" and r["hardware"] == profile and r["peak_allocated_bytes"] > 0, r["impl"]
        if profile is not None:
            assert r["mfu"] == pytest.approx(r["tflops_per_gpu"] * 1e12 / peak_flops(profile)), r["impl"]
    first = [json.loads(r["losses"])[0] for r in rows]
    assert first[1] == pytest.approx(first[0], rel=2e-2) and first[2] == pytest.approx(first[0], rel=2e-2)
    assert "autocast bf16" in rows[1]["note"] and "param_dtype=bf16" in rows[2]["note"]
