"""Frozen, validated configuration: the model shape, the parallel layout and the precision policy.

Every paper model of SC20 Table IV and AE Tables 1–6 is a preset (`PRESETS`), next to tiny
models that train on a 2-core CPU. Validation happens once, in ``__post_init__``, and every error
names the field and the rule it broke. An attribute a trial sets by a flag carries that flag's
help in its `metadata` (the attribute is the flag: zerobench/trial/fields.py reads it from there).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from zerobench.memory import BYTES_PER_PARAM
from zerobench.stages import STAGES

GPT2_VOCAB = 50257  # GPT-2 BPE vocabulary, used by every paper model (paper.md §1.5)


class ConfigError(ValueError):
    """A configuration value broke a rule; the message names the field."""


def _require(ok: bool, field: str, rule: str, value) -> None:
    if not ok:
        raise ConfigError(f"{field}={value!r}: {rule}")


def _finite(obj, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        real = isinstance(value, (int, float)) and not isinstance(value, bool)
        _require(real and math.isfinite(value), name, "must be a finite number", value)


def _positive_ints(obj, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        _require(
            isinstance(value, int) and not isinstance(value, bool) and value >= 1,
            name,
            "must be an integer >= 1",
            value,
        )


@dataclass(frozen=True)
class ModelConfig:
    """A GPT-2 style decoder: pre-LN blocks, learned positions, tied embeddings, 4h GELU MLP."""

    layers: int
    hidden: int
    heads: int
    seq: int = 1024
    vocab: int = GPT2_VOCAB
    name: str = "custom"
    note: str = ""  # where the paper's own arithmetic for this preset is off

    def __post_init__(self):
        _positive_ints(self, "layers", "hidden", "heads", "seq", "vocab")
        _require(
            self.hidden % self.heads == 0,
            "hidden",
            f"must be divisible by heads ({self.heads})",
            self.hidden,
        )

    @property
    def num_params(self) -> int:
        """Exact count: per layer 12h² + 13h (QKV, proj, two MLP linears, two LayerNorms),
        plus tied token embedding V·h, positions s·h and the final LayerNorm 2h."""
        h = self.hidden
        return self.layers * (12 * h * h + 13 * h) + self.vocab * h + self.seq * h + 2 * h

    @property
    def largest_param_numel(self) -> int:
        """Elements of the largest parameter, whole (before any MP split): V·h, s·h or 4h·h."""
        return self.hidden * max(self.vocab, self.seq, 4 * self.hidden)

    def with_overrides(self, **shape) -> ModelConfig:
        """A copy with the given shape fields replaced (None means keep)."""
        changes = {k: v for k, v in shape.items() if v is not None}
        if not changes:
            return self
        return dataclasses.replace(self, **changes, name=f"{self.name}*", note="")


def _paper(name: str, layers: int, hidden: int, heads: int, note: str = "") -> ModelConfig:
    return ModelConfig(layers=layers, hidden=hidden, heads=heads, name=name, note=note)


# Name -> (config, the size in billions the paper calls it). Shapes: SC20 Table IV and AE Tables
# 1–6 (paper.md §4); heads are the ZeRO runs' (baselines use more heads when MP demands it).
_PAPER_MODELS: dict[str, tuple[ModelConfig, float]] = {
    # Fig 2 family (ZeRO-100B + MP, 400 GPUs)
    "gpt-1.5b": (_paper("gpt-1.5b", 48, 1600, 16), 1.5),
    "gpt-8b": (_paper("gpt-8b", 72, 3072, 24), 8.0),
    "gpt-20b": (_paper("gpt-20b", 98, 4096, 32), 20.0),
    "gpt-40b": (_paper("gpt-40b", 88, 6144, 32), 40.0),
    "gpt-60b": (_paper("gpt-60b", 132, 6144, 32), 60.0),
    "gpt-80b": (_paper("gpt-80b", 100, 8192, 64), 80.0),
    "gpt-100b": (_paper("gpt-100b", 125, 8192, 64), 100.0),
    "gpt-120b": (_paper("gpt-120b", 150, 8192, 64), 120.0),
    "gpt-140b": (_paper("gpt-140b", 175, 8192, 64), 140.0),
    "gpt-170b": (_paper("gpt-170b", 212, 8192, 64), 170.0),
    # Fig 3: the 60B used for the scaling study is a different shape from Fig 2's 60B
    "gpt-60b-scaling": (_paper("gpt-60b-scaling", 75, 8192, 32), 60.0),
    # Fig 5 (max model size per config C1–C5); 60B (C2) and 140B (C4) are Fig 2 shapes
    "gpt-40b-c1": (_paper("gpt-40b-c1", 50, 8192, 32), 40.0),
    "gpt-50b-c3": (_paper("gpt-50b-c3", 62, 8192, 32), 50.0),
    "gpt-150b-c5": (_paper("gpt-150b-c5", 187, 8192, 64), 150.0),
    # Fig 8 family: ZeRO-DP only, 128 GPUs
    "dp-1.5b": (
        _paper("dp-1.5b", 34, 1920, 16, note="named for its 12Lh² core (1.50B); 1.60B with embeddings"),
        1.5,
    ),
    "dp-2.5b": (_paper("dp-2.5b", 54, 1920, 16), 2.5),
    "dp-4b": (_paper("dp-4b", 64, 2304, 24), 4.0),
    "dp-6b": (_paper("dp-6b", 52, 3072, 24), 6.0),
    "dp-8b": (_paper("dp-8b", 72, 3072, 24), 8.0),
    "dp-10b": (_paper("dp-10b", 50, 4096, 32), 10.0),
    "dp-11b": (_paper("dp-11b", 54, 4096, 32), 11.0),
    "dp-12b": (_paper("dp-12b", 58, 4096, 32), 12.0),
    "dp-13b": (_paper("dp-13b", 62, 4096, 32), 13.0),
    "ddp-1.16b": (_paper("ddp-1.16b", 24, 1920, 16), 1.16),
    "ddp-1.38b": (
        _paper(
            "ddp-1.38b",
            40,
            1536,
            16,
            note="paper calls it 1.38B; 40 x 1536 is 1.21B with embeddings (paper.md §10.2)",
        ),
        1.38,
    ),
    # Turing-NLG (shape from public T-NLG material, not the paper; paper.md §4.4)
    "tnlg-17b": (_paper("tnlg-17b", 78, 4256, 28), 17.0),
}

# Models small enough to train for real on a CPU.
_CPU_MODELS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(layers=2, hidden=64, heads=4, seq=32, vocab=256, name="tiny"),
    # uneven on purpose: odd hidden and prime vocab, so buckets split unevenly at dp = 2 and 4
    "awkward": ModelConfig(layers=3, hidden=201, heads=3, seq=24, vocab=997, name="awkward"),
    "cpu-10m": ModelConfig(layers=4, hidden=256, heads=8, seq=128, vocab=8192, name="cpu-10m"),
    "cpu-100m": ModelConfig(layers=10, hidden=768, heads=12, seq=256, vocab=32000, name="cpu-100m"),
}

# Table 1's 7.5B, 128B and 1T are parameter counts, not shapes: GPT shapes whose `num_params` is
# exactly 7.5·10⁹, 128·10⁹ and 10¹² (seq 1024; the vocabulary is the free knob). Table 1 depends on
# Ψ alone; few wide layers keep their traces short (a trace's cost grows with the tensor count).
_TABLE1_MODELS: dict[str, tuple[ModelConfig, float]] = {
    "table1-7.5b": (ModelConfig(layers=9, hidden=8000, heads=64, vocab=72357, name="table1-7.5b"), 7.5),
    "table1-128b": (ModelConfig(layers=16, hidden=25600, heads=200, vocab=83566, name="table1-128b"), 128.0),
    "table1-1t": (ModelConfig(layers=52, hidden=40000, heads=250, vocab=38298, name="table1-1t"), 1000.0),
}

PRESETS: dict[str, ModelConfig] = {
    **{k: cfg for k, (cfg, _) in {**_PAPER_MODELS, **_TABLE1_MODELS}.items()},
    **_CPU_MODELS,
}
NOMINAL_BILLIONS: dict[str, float] = {k: size for k, (_, size) in {**_PAPER_MODELS, **_TABLE1_MODELS}.items()}


def preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ConfigError(f"model={name!r}: unknown preset; choose one of {sorted(PRESETS)}")
    return PRESETS[name]


@dataclass(frozen=True)
class PrecisionConfig:
    """Storage dtype of weights and gradients, kept apart from the compute dtype: on CPU a 16-bit
    model stores 2 + 2 + 12 bytes per parameter but computes in fp32 (CPU kernels for 16-bit
    matmul are far slower: docs/engine-measurements.md); on GPU it computes in the storage dtype."""

    mode: str = "fp32"
    device: str = "cpu"
    initial_loss_scale: float = 2.0**16  # fp16 only: dynamic loss scaling
    loss_scale_window: int = 1000  # overflow-free steps before the scale doubles

    def __post_init__(self):
        _require(self.mode in BYTES_PER_PARAM, "precision", f"must be one of {list(BYTES_PER_PARAM)}", self.mode)
        _require(self.device in ("cpu", "cuda"), "device", "must be 'cpu' or 'cuda'", self.device)
        _finite(self, "initial_loss_scale")
        _require(self.initial_loss_scale > 0, "initial_loss_scale", "must be > 0", self.initial_loss_scale)
        _positive_ints(self, "loss_scale_window")

    @property
    def bytes_pgk(self) -> tuple[int, int, int]:
        return BYTES_PER_PARAM[self.mode]

    @property
    def storage_dtype(self):
        import torch

        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.mode]

    @property
    def compute_dtype(self):
        import torch

        return torch.float32 if self.device == "cpu" else self.storage_dtype

    @property
    def loss_scaling(self) -> bool:
        return self.mode == "fp16"


@dataclass(frozen=True)
class ParallelConfig:
    """The parallel layout (world = dp × mp), the ZeRO-DP stage and the ZeRO-R switches."""

    dp: int = 1
    mp: int = field(default=1, metadata={"help": "tensor model-parallel degree N_m"})
    # 0 = plain DP; 1 = P_os; 2 = P_os+g; 3 = P_os+g+p (paper §5)
    stage: int = field(default=0, metadata={"help": "ZeRO-DP stage 0-3 (0 = plain DP)"})
    # C_B: constant-size fused buffer for reductions (paper §6.2), bytes
    bucket_bytes: int = field(default=25 * 2**20, metadata={"help": "C_B: fused buffer size"})
    checkpoint_activations: bool = field(default=False, metadata={"help": "one checkpoint per block"})
    # P_a: checkpoints split across the MP group (§6.1); P_a+cpu: those partitions moved to host memory
    partition_activations: bool = field(default=False, metadata={"help": "P_a: split checkpoints over MP"})
    offload_activations: bool = field(default=False, metadata={"help": "P_a+cpu: checkpoints to host"})
    # M_D: checkpoints and gradients in preallocated buffers
    contiguous_buffers: bool = field(default=False, metadata={"help": "M_D: preallocated contiguous buffers"})
    # stage 3, in bytes: gathered-parameter bytes allowed in flight ahead, and alive at once (in use and prefetched)
    prefetch_bytes: int = field(default=50 * 2**20, metadata={"help": "stage 3: gathered bytes in flight"})
    max_live_bytes: int = field(default=2**33, metadata={"help": "stage 3: gathered bytes alive at once"})
    persistence_threshold: int = field(
        default=0, metadata={"help": "stage 3: keep tensors this small whole (elements)"}
    )
    # stage 3: hold a bucket whose next use is < this many gathered bytes ahead; 0 releases all (3Ψ)
    reuse_bytes: int = field(
        default=0,
        metadata={
            "help": "stage 3: keep a bucket gathered while its next use is this close, in gathered bytes "
            "ahead (0: release all, the paper's 3Ψ)"
        },
    )

    def __post_init__(self):
        _positive_ints(self, "dp", "mp", "bucket_bytes", "prefetch_bytes", "max_live_bytes")
        _require(type(self.stage) is int and self.stage in STAGES, "stage", f"must be one of {[*STAGES]}", self.stage)
        for name in ("persistence_threshold", "reuse_bytes"):
            value = getattr(self, name)
            _require(type(value) is int and value >= 0, name, "must be an integer >= 0", value)
        for name in ("checkpoint_activations", "partition_activations", "offload_activations", "contiguous_buffers"):
            _require(isinstance(getattr(self, name), bool), name, "must be true or false", getattr(self, name))
        needs = "P_a partitions activation checkpoints, so it needs checkpoint_activations"
        _require(self.checkpoint_activations or not self.partition_activations, "partition_activations", needs, True)
        if self.offload_activations:
            _require(self.partition_activations, "offload_activations", "P_a+cpu needs partition_activations", True)

    @property
    def world_size(self) -> int:
        return self.dp * self.mp

    def check_model(self, model: ModelConfig) -> None:
        """Megatron's rule (paper appendix): heads and hidden split evenly across MP. (The
        vocabulary is padded to a multiple of MP, as Megatron does; see the MP layers.)"""
        for name, value in (("heads", model.heads), ("hidden", model.hidden)):
            _require(value % self.mp == 0, name, f"must be divisible by mp ({self.mp})", value)


COMPILE = ("auto", "on", "off")  # TrainConfig.compile


@dataclass(frozen=True)
class TrainConfig:
    """One trial's optimisation settings. Adam as in the paper; no dropout, so runs are exact."""

    micro_batch: int = field(default=1, metadata={"help": "sequences per DP rank per micro-step"})
    grad_accum: int = field(default=1, metadata={"help": "micro-batches per step"})
    steps: int = field(default=5, metadata={"help": "timed steps"})
    warmup: int = field(default=1, metadata={"help": "untimed steps before timing"})
    lr: float = field(default=1e-3, metadata={"help": "Adam's learning rate"})
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW's decoupled weight decay"})
    clip_norm: float = field(default=1.0, metadata={"help": "global gradient-norm clip; 0 disables it"})
    seed: int = field(default=1234, metadata={"help": "seed of the weights and the synthetic batches"})
    compile: str = field(
        default="auto",
        metadata={
            "help": "torch.compile each block's compute (zerobench/engine/compile.py); auto: on for cuda, off for cpu"
        },
    )

    def __post_init__(self):
        _positive_ints(self, "micro_batch", "grad_accum", "steps")
        _require(isinstance(self.warmup, int) and self.warmup >= 0, "warmup", "must be an integer >= 0", self.warmup)
        _finite(self, "lr", "eps", "weight_decay", "clip_norm")
        seed_ok = type(self.seed) is int and 0 <= self.seed < 2**32  # the init's and each sequence's generators
        _require(seed_ok, "seed", "must be an integer in [0, 2**32)", self.seed)
        _require(self.lr > 0, "lr", "must be > 0", self.lr)
        pair = isinstance(self.betas, tuple) and len(self.betas) == 2
        _require(pair and all(type(b) in (int, float) for b in self.betas), "betas", "must be two numbers", self.betas)
        _require(all(0 <= b < 1 for b in self.betas), "betas", "each must be in [0, 1)", self.betas)
        _require(self.eps > 0, "eps", "must be > 0", self.eps)
        _require(self.weight_decay >= 0, "weight_decay", "must be >= 0", self.weight_decay)
        _require(self.clip_norm >= 0, "clip_norm", "must be >= 0 (0 disables clipping)", self.clip_norm)
        _require(self.compile in COMPILE, "compile", f"must be one of {COMPILE}", self.compile)

    def compiles(self, device_type: str) -> bool:
        """Whether blocks are compiled on a `device_type` device: `auto` compiles on cuda only, so
        every CPU run keeps the eager kernels it was measured with."""
        return self.compile == "on" or (self.compile == "auto" and device_type == "cuda")


# The paper's C_B (§6.2): DeepSpeed's hyperscale configs use a 5e8-element reduce and a 2e8-element
# all-gather bucket (fp16), 1.4 GB together. The engine holds two buckets of `bucket_bytes`, so each
# is their mean: 700,000,000 bytes (667.57 MiB). A sheet names it `bucket_mb: paper`.
PAPER_BUCKET = (500_000_000 + 200_000_000) * 2 // 2

# The paper's ZeRO configurations C1–C5 (SC20 Table III, paper.md §4.1): ZeRO-DP stage plus the
# ZeRO-R switches. C_B (constant buffers) is always on in this engine; M_D is `contiguous_buffers`.
ZERO_CONFIGS: dict[str, dict] = {
    "C1": dict(stage=1, contiguous_buffers=True),
    "C2": dict(stage=1, contiguous_buffers=True, partition_activations=True),
    "C3": dict(stage=2, contiguous_buffers=True),
    "C4": dict(stage=2, contiguous_buffers=True, partition_activations=True),
    "C5": dict(stage=2, contiguous_buffers=True, partition_activations=True, offload_activations=True),
}
