"""The host allocator a measured CPU trial runs with (`--allocator system|jemalloc|auto`).

The default is the system's (glibc malloc): what a user runs, and the faster of the two on the
hosts measured. But glibc keeps freed activations in its heap while its mmap threshold moves with
the sizes freed, so a trial's peak RSS lands well above the most bytes its tensors hold at once
(docs/engine-measurements.md gives the readings), in a way that follows the order of the
allocations rather than the model. Under jemalloc (`oversize_threshold:0`: large tensors from the
ordinary arenas; `dirty_decay_ms:0,muzzy_decay_ms:0`: freed pages go back at once, so RSS holds
live allocations, the CPU's counterpart of a GPU's peak allocated bytes) RSS is the tensors plus
the runtime: with jemalloc's default 10 s decay, pages freed earlier in a step and not yet reused
would add to it. The steps run slower, as freed pages are faulted in again
(docs/perfmodel.md gives both readings). So a trial that checks memory against a
prediction asks for jemalloc (the model_vs_measured sheet's memory trials); `auto` takes it when
installed (Debian/Ubuntu: apt-get install libjemalloc2; scripts/setup.sh does as root).
`zerobench run` and `calibrate` re-execute themselves with it preloaded (the process's own command
line, whichever entry point started it), and every record says which allocator ran.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from zerobench.engine.config import ConfigError

CHOICES = ("auto", "jemalloc", "system")
# Unless set already. Not PyTorch's CPU launcher's "oversize_threshold:1,background_thread:true"
# (torch/backends/xeon/run_cpu.py): its background purge thread takes a core from the ranks when
# they fill the host (docs/engine-measurements.md)
MALLOC_CONF = "oversize_threshold:0,dirty_decay_ms:0,muzzy_decay_ms:0"
_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
)


def jemalloc_path() -> str | None:
    return next((p for p in _PATHS if Path(p).is_file()), None)


def in_use() -> str:
    """The allocator this process runs with: jemalloc when it is mapped, else the system's."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "system"
    return "jemalloc" if "libjemalloc" in maps else "system"


def use(choice: str) -> None:
    """Return if this process already runs `choice` (or `auto` finds no jemalloc); otherwise
    re-execute this process's own command line (`sys.orig_argv`: the entry point that started it,
    `zerobench` or `python -m zerobench.cli`, with its arguments) with jemalloc preloaded, in its
    place. `system` under a preloaded jemalloc is refused: a preload cannot be undone from inside."""
    if choice not in CHOICES:
        raise ConfigError(f"allocator={choice!r}: must be one of {CHOICES}")
    current = in_use()
    if choice == "system" and current == "jemalloc":
        raise ConfigError("allocator='system': jemalloc is preloaded (LD_PRELOAD); unset it to run the system's")
    if choice == "system" or current == "jemalloc":
        return
    lib = jemalloc_path()
    if lib is None:
        if choice == "jemalloc":
            raise ConfigError("allocator='jemalloc': libjemalloc.so.2 not found (apt-get install libjemalloc2)")
        return
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], preload_env(lib))


def preload_env(lib: str) -> dict[str, str]:
    """This process's environment with jemalloc (`lib`) preloaded, configured by MALLOC_CONF unless
    the environment sets one."""
    preload = " ".join(filter(None, (lib, os.environ.get("LD_PRELOAD"))))
    return {"MALLOC_CONF": MALLOC_CONF, **os.environ, "LD_PRELOAD": preload}
