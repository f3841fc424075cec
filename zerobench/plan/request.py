"""A plan request, validated once: the model, the GPUs and their hardware profile, what the layouts
may choose and what they must respect (a global batch). Every error names the field and the rule."""

from __future__ import annotations

from dataclasses import dataclass, field

from zerobench.engine.config import ModelConfig, PrecisionConfig
from zerobench.memory import BYTES_PER_PARAM
from zerobench.perfmodel.hardware import HardwareProfile, get_profile
from zerobench.perfmodel.implementation import DEFAULT_IMPLEMENTATION, PROFILES
from zerobench.perfmodel.kernels import check_attention
from zerobench.trial.errors import InputError


def _positive(name: str, value, optional: bool = False) -> None:
    if optional and value is None:
        return
    if type(value) is not int or value < 1:
        raise InputError(f"{name}={value!r}: must be an integer >= 1")


@dataclass(frozen=True)
class PlanRequest:
    """What to plan. `mp`: pin the MP degree (None: every degree that divides the heads and a node);
    `global_batch`: sequences per step, micro_batch × dp × grad_accum (None: one micro-batch per
    step, as large as fits); `top`: the layouts shown and, with a verify, checked; `headroom`: the
    per cent of the card's usable bytes a layout leaves free, at least, to be offered as a top pick."""

    model: ModelConfig
    gpus: int
    hardware: str | HardwareProfile  # a profile's name or path (hardware.get_profile), or the profile
    precision: str = "fp16"
    global_batch: int | None = None
    top: int = 5
    attention: str = "fused"
    implementation: str = DEFAULT_IMPLEMENTATION
    gpus_per_node: int | None = None
    mp: int | None = None
    headroom: float = 5.0
    profile: HardwareProfile = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        _positive("gpus", self.gpus)
        _positive("top", self.top)
        _positive("global_batch", self.global_batch, optional=True)
        _positive("mp", self.mp, optional=True)
        if self.precision not in BYTES_PER_PARAM:
            raise InputError(f"precision={self.precision!r}: must be one of {list(BYTES_PER_PARAM)}")
        if self.implementation not in PROFILES:
            raise InputError(f"implementation={self.implementation!r}: must be one of {sorted(PROFILES)}")
        check_attention(self.attention)
        if type(self.headroom) not in (int, float) or not 0 <= self.headroom < 100:
            raise InputError(f"headroom={self.headroom!r}: must be a per cent of the usable bytes in [0, 100)")
        hw = get_profile(self.hardware, self.gpus_per_node)  # an unknown profile: InputError naming `hardware`
        object.__setattr__(self, "profile", hw)
        gpn = hw.gpus_per_node
        if self.gpus > gpn and self.gpus % gpn:
            raise InputError(f"gpus={self.gpus}: not whole nodes of {gpn} GPUs ({hw.name}): {self.gpus // gpn} "
                              f"nodes and {self.gpus % gpn} left over; plan {self.gpus // gpn * gpn} or "
                              f"{-(-self.gpus // gpn) * gpn}, or give --gpus-per-node")  # fmt: skip
        if self.mp is not None:
            for name, value in (("heads", self.model.heads), ("hidden", self.model.hidden)):
                if value % self.mp:
                    raise InputError(f"{name}={value}: must be divisible by mp ({self.mp})")
            if self.gpus % self.mp:
                raise InputError(f"gpus={self.gpus}: must be a multiple of mp ({self.mp})")
            if hw.gpus_per_node % self.mp:
                raise InputError(f"mp={self.mp}: must divide a node ({hw.gpus_per_node} GPUs of {hw.name})")
        if not self.mp_degrees():
            raise InputError(f"gpus={self.gpus}: no MP degree divides both it and a node of {hw.gpus_per_node}")
        if self.global_batch is not None and self.global_batch < self.gpus // max(self.mp_degrees()):
            mp = max(self.mp_degrees())
            raise InputError(f"gpus={self.gpus}: too many for global_batch={self.global_batch}: even at MP {mp} "
                              f"the DP degree ({self.gpus // mp}) exceeds it (a DP rank takes one sequence a step "
                              f"at least): at most {self.global_batch * mp} GPUs")  # fmt: skip
        if self.global_batch is not None and not any(
            self.global_batch % (self.gpus // m) == 0 for m in self.mp_degrees()
        ):
            dps = sorted({self.gpus // m for m in self.mp_degrees()})
            raise InputError(f"global_batch={self.global_batch}: must be a multiple of a DP degree {dps}")

    def mp_degrees(self) -> list[int]:
        """The MP degrees a layout may take: dividing the heads (and so the hidden size), a node
        (a group never leaves its NVLink/NVSwitch domain, paper §10.2) and the GPUs."""
        if self.mp is not None:
            return [self.mp]
        gpn = self.profile.gpus_per_node
        return [m for m in range(1, gpn + 1) if not gpn % m and not self.model.heads % m and not self.gpus % m]

    @property
    def precision_config(self) -> PrecisionConfig:
        """The storage precision on the target's device: a GPU profile's ranks are CUDA devices, a
        calibrated CPU host's are CPU ranks (fp32 compute there)."""
        return PrecisionConfig(self.precision, "cpu" if self.profile.ranks_share_compute else "cuda")
