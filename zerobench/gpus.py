"""The GPUs the engine and the performance model both name: which hardware profile a CUDA device
is, and its dense 16-bit datasheet peak (FLOP/s), the denominator of MFU. Torch-free, so the
engine's records and the model's profiles read one table."""

from __future__ import annotations

# profile name -> (the names torch.cuda.get_device_name gives its card, dense bf16/fp16 peak FLOP/s
# per GPU) from each datasheet: DGX-2 2 PFLOPS / 16 V100 SXM3; A100 SXM4 312 TFLOPS; H100 and H200 SXM
# 989 TFLOPS. Only the SXM cards of each profile's node: a PCIe or NVL card has other clocks and links,
# and a GH200 another memory, so none of them is priced as these.
DATASHEET = {
    "v100-32gb-dgx2": (("Tesla V100-SXM3-32GB",), 125e12),
    "a100-80gb": (("NVIDIA A100-SXM4-80GB",), 312e12),
    "h100-80gb": (("NVIDIA H100 80GB HBM3",), 989e12),
    "h200-141gb": (("NVIDIA H200",), 989e12),
}


def profile_of(device_name: str) -> str | None:
    """The profile of a CUDA device by its exact name, or None (a GPU without a profile)."""
    return next((profile for profile, (names, _) in DATASHEET.items() if device_name.strip() in names), None)


def peak_flops(profile: str) -> float:
    return DATASHEET[profile][1]


def mfu(tflops_per_gpu: float, profile: str | None) -> float | None:
    """Achieved over the profile's dense 16-bit datasheet peak; None without a profile."""
    return None if profile is None else tflops_per_gpu * 1e12 / peak_flops(profile)
