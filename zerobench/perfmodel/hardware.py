"""Hardware profiles as data: the paper's DGX-2 cluster, today's 8-GPU nodes, and profiles
measured by `zerobench calibrate` (loaded by path or name, perfmodel/profile_file.py).

The paper's cluster (paper.md §6): 25 DGX-2 nodes, each 16 × V100-SXM3-32GB on NVSwitch and
8 × 100 Gb/s EDR InfiniBand. Units: bytes, bytes/s, FLOP/s, seconds. In a datasheet profile every
rate is a peak and the achieved fractions live in `constants.py` (for A100, H100 and H200 the
GEMM fraction is a published matmul microbenchmark's, `constants.GEMM_EFF_MEASURED`); a measured
profile (`measured=True`) holds achieved rates, so no efficiency is applied to them.

Memory is each card's capacity as the driver reports it (NVML, `nvidia-smi`'s total), in bytes:
H200 143,771 MiB (our own card, results/gpu/h200/nvidia-smi.txt), H100-SXM5-80GB 81,559 MiB,
A100-SXM4-80GB 81,920 MiB = 80 GiB (NVML totals tabulated by Modal, "Why does an NVIDIA H100 80GB card
offer 85.52 GB?", thundergolfer.com/blog/nvidia-gpu-memory-capacity). The V100 keeps 32 GiB although
NVML reports 32,480 MiB for a V100 32GB (0.9 % less): its reserve, fitted on the paper's points with
32 GiB, was to absorb the difference, but prices only other codes' runs since the paper's artifacts
price this engine's memory, so the 32 GiB is an assumption on the ledger of choices (choices.py),
reverted to NVML's total; docs/gpu.md.
"""

from __future__ import annotations

import dataclasses

from zerobench.gpus import peak_flops
from zerobench.perfmodel import profile_file
from zerobench.perfmodel.hardware_profile import CUDA_CONTEXT_BYTES, GB, GiB, HardwareProfile
from zerobench.trial.errors import InputError

__all__ = ["GB", "GiB", "HardwareProfile", "PROFILES", "get_profile"]

MiB = 2**20
# The H200's unusable bytes, from one H200 (results/gpu/h200): what the driver keeps from CUDA, NVML's
# total (143,771 MiB) less the `total_memory` CUDA gives the program (150,109,880,320 bytes, written by
# `zerobench calibrate --device cuda` into calibrated-cuda.json), 615 MiB; plus the CUDA context, about
# 400 MB with lazy module loading (CUDA >= 11.7; PyTorch's maintainers, pytorch/pytorch#109888), not
# measured there. At dp = 1 no NCCL communicator holds buffers.
H200_RESERVE_BYTES = 143771 * MiB - 150_109_880_320 + CUDA_CONTEXT_BYTES
# The caching allocator's own: the largest peak reserved − peak allocated of the twelve H200 runs
# (records' `fragmentation_bytes`: 0.05–2.28 GB; gpt-1.5b stage 3 micro-batch 16), in place of the
# paper-fitted 10.5 % of the card, which is for 2020's allocator on a V100 without M_D.
H200_FRAGMENTATION_BYTES = 2_277_894_144


PROFILES: dict[str, HardwareProfile] = {
    # NVIDIA DGX-2 datasheet: 16 × V100-SXM3-32GB, 2 PFLOPS tensor => 125 TFLOPS per GPU; V100
    # datasheet: HBM2 900 GB/s, 32 GB (32 GiB here: the module docstring); NVSwitch: 6 NVLink2 × 25 GB/s
    # per direction = 150 GB/s (paper: "300 GB/s" bidirectional); 8 × 100 Gb/s EDR ConnectX-5
    # (paper §6: 12.5 GB/s per link); PCIe Gen3 x16 15.75 GB/s, two GPUs per PCIe switch uplink;
    # the paper's software is CUDA 10.0 (paper §6), hence the alignment rule below.
    "v100-32gb-dgx2": HardwareProfile(
        name="v100-32gb-dgx2", gpu="V100-SXM3-32GB", peak_flops=peak_flops("v100-32gb-dgx2"), memory_bytes=32 * GiB,
        hbm_bw=900e9, gpus_per_node=16, intra_bw=150e9, nic_bw=12.5e9, nics_per_node=8, host_bw=7.9e9,
        tensor_core_align=8, unaligned_flops=31.4e12,  # V100 datasheet: fp16 without tensor cores = 2 x 15.7 fp32
    ),
    # A100 datasheet (SXM4 80GB): 312 TFLOPS dense bf16, 2039 GB/s HBM2e, 80 GB; NVLink3 600 GB/s
    # bidirectional = 300 per direction; DGX A100: 8 × 200 Gb/s HDR; PCIe Gen4 x16 31.5 GB/s,
    # two GPUs per PCIe switch.
    "a100-80gb": HardwareProfile(
        name="a100-80gb", gpu="A100-SXM4-80GB", peak_flops=peak_flops("a100-80gb"), memory_bytes=80 * GiB,
        hbm_bw=2039e9, gpus_per_node=8, intra_bw=300e9, nic_bw=25e9, nics_per_node=8, host_bw=15.75e9,
    ),
    # H100 datasheet (SXM5 80GB): 989 TFLOPS dense bf16, 3.35 TB/s HBM3, 80 GB (NVML: 81,559 MiB); NVLink4
    # 900 GB/s bidirectional = 450 per direction; DGX H100: 8 × 400 Gb/s NDR; PCIe Gen5 x16 63 GB/s.
    "h100-80gb": HardwareProfile(
        name="h100-80gb", gpu="H100-SXM5-80GB", peak_flops=peak_flops("h100-80gb"), memory_bytes=81559 * MiB,
        hbm_bw=3350e9, gpus_per_node=8, intra_bw=450e9, nic_bw=50e9, nics_per_node=8, host_bw=63e9,
    ),
    # H200 datasheet (SXM 141GB): 989 TFLOPS dense bf16, 4.8 TB/s HBM3e, "141 GB" (NVML on our card:
    # 143,771 MiB = 150.75e9 bytes); NVLink 900 GB/s bidirectional; DGX H200: 8 × 400 Gb/s NDR; PCIe
    # Gen5 x16 63 GB/s. Its memory margins are measured on that card, not fitted (H200_RESERVE_BYTES,
    # H200_FRAGMENTATION_BYTES).
    "h200-141gb": HardwareProfile(
        name="h200-141gb", gpu="H200-SXM-141GB", peak_flops=peak_flops("h200-141gb"), memory_bytes=143771 * MiB,
        hbm_bw=4800e9, gpus_per_node=8, intra_bw=450e9, nic_bw=50e9, nics_per_node=8, host_bw=63e9,
        reserve_bytes=H200_RESERVE_BYTES, fragmentation_bytes=H200_FRAGMENTATION_BYTES,
    ),
}  # fmt: skip


def get_profile(name: str | HardwareProfile, gpus_per_node: int | None = None) -> HardwareProfile:
    """A profile by name (a datasheet profile, or a calibrated one: a JSON path, or a name under
    the profile directory), with its node size optionally overridden (the NICs per node stay)."""
    if isinstance(name, HardwareProfile):
        profile = name
    elif name in PROFILES:
        profile = PROFILES[name]
    elif (path := profile_file.find(name)) is not None:
        profile = profile_file.load(path)
    else:
        raise InputError(
            f"hardware={name!r}: unknown profile; choose one of {sorted(PROFILES)}, a calibrated profile's "
            f"JSON path, or a name under {' or '.join(map(str, profile_file.search_dirs()))}"
        )
    if gpus_per_node is not None:
        if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
            raise InputError(f"gpus_per_node={gpus_per_node!r}: must be an integer >= 1")
        profile = dataclasses.replace(profile, gpus_per_node=gpus_per_node)
    return profile
