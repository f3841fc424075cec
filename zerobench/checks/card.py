"""The card a GPU check runs on, and which trials fit it by their trace.

The card decides what is checked: a trial is planned only where its trace (runtime/trace.py,
made with the trial's own device, so on a GPU with 16-bit compute) plus the caching allocator's
slack fits what the card leaves the allocator: its memory less the CUDA context and NCCL's
communicators (perfmodel/engine_memory.py). A trial that does not fit is skipped, and the check
says which and why; it is never reported as passed.

On a CPU the card stands in (`Card.parse`, "NAME=BYTES"), so the check's plan is rehearsed for an
80 GB card, a 141 GB card and a card without a profile (tests/unit/test_gpu_check_rehearsal.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from zerobench.gpus import profile_of
from zerobench.perfmodel.engine_memory import outside_allocator_bytes

# The caching allocator's own beyond the traced tensors: cuBLAS and cuBLASLt workspaces (32 MiB per
# handle and stream on Hopper), and its rounding of each block (512 B) and of large ones (2 MiB)
PEAK_SLACK_BYTES, PEAK_RTOL = 128 * 2**20, 0.02
CARD_ENV = "GPU_CHECK_CARD"  # "NAME=BYTES": the card a rehearsal stands in for the device


@dataclass(frozen=True)
class Card:
    name: str  # torch.cuda.get_device_name
    total_bytes: int  # what CUDA gives the program: torch.cuda.get_device_properties(...).total_memory

    @property
    def profile(self) -> str | None:
        return profile_of(self.name)

    def usable_bytes(self, dp: int = 1, mp: int = 1) -> float:
        """What a rank of a dp × mp layout leaves the caching allocator on this card, in bytes."""
        return self.total_bytes - outside_allocator_bytes(dp, mp)

    def __str__(self) -> str:
        return f"{self.name} ({self.total_bytes / 1e9:.1f} GB, profile {self.profile or 'none'})"

    @classmethod
    def parse(cls, text: str) -> Card:
        """A stand-in card from "NAME=BYTES" (BYTES may be written 85.5e9)."""
        name, sep, size = text.rpartition("=")
        try:
            total = int(float(size))
        except ValueError:
            total = 0
        if not sep or not name or total <= 0:
            raise ValueError(f"{CARD_ENV}={text!r}: expected NAME=BYTES, e.g. 'NVIDIA H100 80GB HBM3=85.5e9'")
        return cls(name, total)

    @classmethod
    def of_device(cls, index: int = 0) -> Card:
        import torch  # the device's own answer; a stand-in card needs no torch

        props = torch.cuda.get_device_properties(index)
        return cls(props.name, props.total_memory)


def bound_bytes(traced_peak: float) -> float:
    """The most a run's peak allocated may reach given its trace's peak: the trace plus the slack."""
    return traced_peak * (1 + PEAK_RTOL) + PEAK_SLACK_BYTES


def misfit(traced: dict, card: Card, dp: int = 1, mp: int = 1) -> str | None:
    """Why a trial whose trace is `traced` (a record) does not fit `card`, or None where it fits.
    A trace that did not succeed says nothing of fit: the caller fails on it."""
    peak = traced.get("peak_allocated_bytes")
    if traced.get("status") != "ok" or peak is None:
        return None
    have = card.usable_bytes(dp, mp)
    if bound_bytes(peak) <= have:
        return None
    return (
        f"traced {peak / 1e9:.1f} GB + the allocator's slack exceeds the {have / 1e9:.1f} GB "
        f"{card.name} leaves the allocator"
    )


def cuda_only_bytes(layers: int, tokens: int) -> int:
    """The most a CUDA rank's counted tensors may hold beyond the trace of the same trial, which
    runs the host's kernels on fake tensors: each layer norm's saved mean and rstd in fp32 where the
    host keeps them in the 16-bit compute dtype (2 bytes more an element, one element a token; two
    norms a block and the final one), and flash attention's two philox tensors a block (16 bytes
    each at most). An upper bound, as if every one were alive at the peak; `tokens`: micro-batch ×
    sequence."""
    return (2 * layers + 1) * 2 * 2 * tokens + layers * 2 * 16
