"""The GPUs the engine and the performance model both name: which hardware profile a CUDA device
is, and its dense 16-bit datasheet peak (FLOP/s), the denominator of MFU. Torch-free, so the
engine's records and the model's profiles read one table."""

from __future__ import annotations

# profile name -> (a fragment of torch.cuda.get_device_name, dense bf16/fp16 peak FLOP/s per GPU)
# from each datasheet: DGX-2 2 PFLOPS / 16 V100; A100 SXM4 312 TFLOPS; H100 and H200 SXM 989 TFLOPS.
DATASHEET = {
    "v100-32gb-dgx2": ("V100", 125e12),
    "a100-80gb": ("A100", 312e12),
    "h100-80gb": ("H100", 989e12),
    "h200-141gb": ("H200", 989e12),
}


def profile_of(device_name: str) -> str | None:
    """The profile of a CUDA device by its name, or None (a GPU without a profile)."""
    return next((profile for profile, (key, _) in DATASHEET.items() if key in device_name), None)


def peak_flops(profile: str) -> float:
    return DATASHEET[profile][1]


def mfu(tflops_per_gpu: float, profile: str | None) -> float | None:
    """Achieved over the profile's dense 16-bit datasheet peak; None without a profile."""
    return None if profile is None else tflops_per_gpu * 1e12 / peak_flops(profile)
