"""The hardware profile as a type: what the performance model knows of one GPU (or CPU host) and
its links. Its own module so that the datasheet profiles (hardware.py) and the profile files that
`zerobench calibrate` writes (profile_file.py) both build on it without importing each other.
Units: bytes, bytes/s, FLOP/s, seconds."""

from __future__ import annotations

from dataclasses import dataclass

GiB = 2**30
GB = 10**9
# The CUDA context a process creates on its device, outside the caching allocator: about 400 MB with
# lazy module loading (CUDA >= 11.7; PyTorch's maintainers, pytorch/pytorch#109888), over 1000 MB
# before it, when every kernel was loaded at start (pytorch/pytorch#107667), as on the paper's CUDA 10.
# An assumption until a device measures it (torch.cuda.mem_get_info before and after the first CUDA
# call): on the ledger of choices (choices.py), reverted to 1000 MB.
CUDA_CONTEXT_BYTES = 400e6


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    gpu: str
    peak_flops: float  # dense fp16/bf16 tensor-core FLOP/s per GPU
    memory_bytes: float  # device memory per GPU, bytes
    hbm_bw: float  # device memory bandwidth, bytes/s
    gpus_per_node: int
    intra_bw: float  # NVLink/NVSwitch bandwidth per GPU per direction, bytes/s
    nic_bw: float  # one InfiniBand NIC, per direction, bytes/s
    nics_per_node: int
    host_bw: float  # GPU <-> host (PCIe) bandwidth per GPU per direction, bytes/s
    intra_latency: float = 5e-6  # α per ring step on NVLink/NVSwitch, s (NCCL typical)
    inter_latency: float = 10e-6  # α per ring step across InfiniBand, s (NCCL typical)
    # cuBLAS of CUDA 10 uses tensor cores only when every GEMM dimension is a multiple of 8 (fp16);
    # other GEMMs run on the CUDA cores at `unaligned_flops`. CUDA 11+ pads instead (align 1).
    tensor_core_align: int = 1
    unaligned_flops: float | None = None
    # --- measured by `zerobench calibrate` (zerobench/microbench/machine.py); empty in datasheet profiles ---
    measured: bool = False  # rates are achieved rates: the model applies no efficiency to them
    # ((tokens m, fan-out n, fan-in k, forward FLOP/s, backward FLOP/s), ...): F.linear per shape
    gemm_table: tuple = ()
    # ((kernel, size, forward s, backward s), ...): the named kernels (microbench/kernel_bench.py) by size,
    # the optimizer's `adam` and `clip` among them (size: parameters updated; forward: the step)
    kernel_table: tuple = ()
    op_overhead_s: float = 0.0  # seconds an op costs beside its arithmetic (forward or backward)
    ops_per_layer: int = 0  # ops one layer's forward + backward dispatches (counted on the model)
    ops_fixed: int = 0  # ops of the embedding, final norm and loss, forward + backward
    runtime_bytes: float = 0.0  # RSS a process gains by running its first steps, beyond its tensors (CPU)
    checkpoint_runtime_bytes: float = 0.0  # and more with activation checkpointing (reentrant backward; CPU)
    concurrency_slowdown: float = 1.0  # a CPU core's kernels, slower x while the other ranks' run too
    collectives: tuple = ()  # ((op, group size, α s, bytes/s of per-rank ring volume), ...)
    # ((op, group size, per-rank ring volume bytes, seconds), ...): each collective's measured curve
    collective_table: tuple = ()
    # ((group size, seconds of compute between two syncs, seconds a rank waits at the sync), ...)
    sync_table: tuple = ()
    # ((MP group size, seconds of compute between two MP all-reduces, seconds each takes in a
    # training step beyond its measured curve), ...): the engine's own MP steps (microbench/engine_runs.py).
    # Fitted, not measured: the model's own error on those steps, so a prediction it changes is not
    # judged (artifacts/tables/vs_measured.py shows each row without it; docs/perfmodel.md, "Calibration")
    mp_sync_table: tuple = ()
    ranks_share_compute: bool = False  # a CPU host: rates per core; ranks past its cores share them; fp32 compute
    # Bytes never usable per device; None: the CUDA context and allocator reserve of constants.py.
    # 0 on CPU (no CUDA context; a budget there is counted as the process's RSS growth).
    reserve_bytes: float | None = None
    # Bytes the caching allocator holds beyond the tensors at the training peak (its peak reserved
    # minus peak allocated, measured on the device); None: the fitted share of constants.py, lost
    # to fragmentation without contiguous buffers (paper §3.2, §6.1 M_D).
    fragmentation_bytes: float | None = None
    # NCCL's own device bytes per communicator, outside the allocator; None: engine_memory.py's
    # allowance for the GPU (`nccl_allowance`: with or without NVLS)
    nccl_communicator_bytes: float | None = None
    cuda_context_bytes: float = CUDA_CONTEXT_BYTES  # the CUDA context, outside the allocator (a GPU's)
    # ((GEMM n, copy bytes, GEMM FLOP/s, bytes copied per s), ...): the host speed probe read at the
    # calibration's start and end (runtime/probe.py). The model never reads it: a measured trial's
    # probe over it says how fast the host ran beside that trial (docs/perfmodel.md)
    host_probe: tuple = ()

    @property
    def node_ib_bw(self) -> float:
        """InfiniBand bandwidth of one node, per direction (bytes/s)."""
        return self.nic_bw * self.nics_per_node

    @property
    def ib_share_per_gpu(self) -> float:
        """The per-GPU share of the node's InfiniBand when every GPU sends at once (bytes/s)."""
        return self.node_ib_bw / self.gpus_per_node
