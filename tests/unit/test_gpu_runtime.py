"""The GPU runtime's own rules, held on this CPU: a card's profile by its exact name, an attempt's
memory given back after it runs out (the caching allocator's blocks and cuBLAS's workspaces), and
an emulated rank eager unless compiling is asked for."""

import pytest
import torch

from tests.engine_cases import spec_for
from zerobench.engine.runtime import launch
from zerobench.engine.runtime.emulate import eager_unless_asked
from zerobench.gpus import profile_of


@pytest.mark.parametrize(
    "name, profile",
    [("NVIDIA H100 80GB HBM3", "h100-80gb"), ("NVIDIA H200", "h200-141gb"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
     ("Tesla V100-SXM3-32GB", "v100-32gb-dgx2"), ("NVIDIA H100 PCIe", None), ("NVIDIA H100 NVL", None),
     ("NVIDIA GH200 480GB", None), ("NVIDIA H200 NVL", None), ("NVIDIA A100 80GB PCIe", None),
     ("Tesla V100-PCIE-32GB", None)],
)  # fmt: skip
def test_a_card_is_priced_as_its_own_profile_or_none(name, profile):
    assert profile_of(name) == profile


def test_release_gives_cuda_blocks_and_cublas_workspaces_back(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: calls.append("cublas"), raising=False)
    launch.release(torch.device("cpu"))
    assert calls == []
    launch.release(torch.device("cuda", 0))
    assert calls == ["empty_cache", "cublas"]


def test_an_out_of_memory_attempt_gives_its_memory_back_before_the_record(monkeypatch, tmp_path):
    events = []

    def measure(spec, ctx, device):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")

    monkeypatch.setattr(launch, "measure", measure)
    monkeypatch.setattr(launch, "release", lambda device: events.append(("release", device.type)))
    spec = spec_for("tiny", steps=1)
    spec = type(spec)(**{**spec.__dict__, "out": str(tmp_path / "r.json")})
    assert launch.worker(spec.to_dict()) == "oom"
    assert events == [("release", "cpu")]


def test_an_emulated_rank_is_eager_unless_compiling_is_asked_for():
    assert eager_unless_asked(spec_for(device="cuda", compile="auto")).train.compiles("cuda") is False
    assert eager_unless_asked(spec_for(device="cuda", compile="on")).train.compiles("cuda") is True
