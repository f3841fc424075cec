"""The host allocator a measured CPU trial runs with (`--allocator`).

glibc's malloc keeps freed activations in its heap while its mmap threshold moves with the sizes
freed, so a trial's peak RSS lands 40-110 % above the most bytes its tensors hold at once
(cpu-10m and cpu-100m trials against `zerobench trace`'s count: 57-318 MiB more), in a way
that depends on the order of allocations rather than on the model. jemalloc, which PyTorch's own
CPU launcher preloads (`python -m torch.backends.xeon.run_cpu --enable-jemalloc`), keeps it
within about 30 MiB of the tensors (cpu-10m, micro-batch 1-8); its steps ran 7-15 % slower there
(cpu-10m, one rank: it returns freed pages, which are faulted in again). So `auto`
(the default) re-executes `zerobench run` and `zerobench calibrate` with jemalloc preloaded when
the library is installed (Debian/Ubuntu: apt-get install libjemalloc2), and every record says
which allocator ran (`allocator`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from zerobench.config import ConfigError

CHOICES = ("auto", "jemalloc", "system")
# What PyTorch's CPU launcher sets with jemalloc (torch/backends/xeon/run_cpu.py), unless set already
MALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto"
_PATHS = ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
          "/usr/lib64/libjemalloc.so.2", "/usr/local/lib/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2")  # fmt: skip


def jemalloc_path() -> str | None:
    return next((p for p in _PATHS if Path(p).is_file()), None)


def in_use() -> str:
    """The allocator this process runs with: jemalloc when it is mapped, else the system's."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "system"
    return "jemalloc" if "libjemalloc" in maps else "system"


def use(choice: str, argv: list[str]) -> None:
    """Return if this process already runs `choice` (or `auto` finds no jemalloc); otherwise
    re-execute `python -m zerobench.cli ARGV` with jemalloc preloaded, in this process's place.
    `system` under a preloaded jemalloc is refused: a preload cannot be undone from inside."""
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
    preload = " ".join(filter(None, (lib, os.environ.get("LD_PRELOAD"))))
    env = {"MALLOC_CONF": MALLOC_CONF, **os.environ, "LD_PRELOAD": preload}
    os.execve(sys.executable, [sys.executable, "-m", "zerobench.cli", *argv], env)
