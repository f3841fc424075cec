"""The GPU runtime's own rules, held on this CPU: a card's profile by its exact name, an attempt's
memory given back after it runs out (the caching allocator's blocks and cuBLAS's workspaces), an
emulated rank eager unless compiling is asked for, and its allocator capped below its budget by what
its card holds outside it."""

import pytest
import torch

from tests.engine_cases import spec_for
from zerobench.engine.config import ConfigError
from zerobench.gpus import profile_of
from zerobench.perfmodel.engine_memory import outside_allocator_bytes
from zerobench.runtime import launch
from zerobench.runtime.emulate import _cap, eager_unless_asked


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


def test_an_emulated_gpu_rank_loses_what_its_card_holds_outside_the_allocator(monkeypatch):
    """A V100 rank's 32 GiB budget: its allocator gets 32 GiB less the CUDA context and NCCL's
    communicators (perfmodel/engine_memory.py, passed in by sources/emulated.py), not all of it."""
    fractions = []
    props = type("Props", (), {"total_memory": 80 * 2**30, "name": "NVIDIA H100 80GB HBM3"})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, device: fractions.append(f))
    spec = type(spec_for())(**{**spec_for().__dict__, "mem_cap_bytes": 32 * 2**30})
    reserved = outside_allocator_bytes(16, 16)
    said = _cap(spec, torch.device("cuda", 0), reserved)
    assert fractions == [(32 * 2**30 - reserved) / (80 * 2**30)]
    assert "less" in said and f"{reserved / 2**30:.2f} GiB outside" in said
    with pytest.raises(ConfigError, match="mem_cap_mb"):
        _cap(spec, torch.device("cuda", 0), 33 * 2**30)
