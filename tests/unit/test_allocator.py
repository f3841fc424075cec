"""The host allocator choice (zerobench/runtime/allocator.py): bad choices refused by name, and jemalloc as
the memory trials run it, returning freed pages at once so that RSS holds live allocations."""

import os
import subprocess
import sys

import pytest

from zerobench.engine.config import ConfigError
from zerobench.runtime import allocator

# Touch 64 tensors of 4 MiB, as a step's activations, free them, and print RSS (MiB) before, at
# the peak and after, from /proc. jemalloc's default decay (10 s) kept 26 MiB of them here.
_PROBE = """
import torch
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
before = rss()
xs = [torch.ones(2**20) for _ in range(64)]
peak = rss()
del xs
print(before, peak, rss())
"""


def test_bad_choice_is_refused_naming_it():
    with pytest.raises(ConfigError, match="allocator='tcmalloc'"):
        allocator.use("tcmalloc")


# In a fresh interpreter: which allocator it reports, then whether `use(CHOICE)` returned ("stayed")
# or re-executed the process's own command line (this script again, reporting again).
_USE = """
import sys
from zerobench.runtime import allocator
print(allocator.in_use(), flush=True)
allocator.use(sys.argv[1])
print("stayed")
"""


def _child(choice: str, preload: bool) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    if preload:
        env = {**env, **allocator.preload_env(allocator.jemalloc_path())}
    out = subprocess.run([sys.executable, "-c", _USE, choice], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_system_stays_in_this_process_and_reports_the_system_allocator():
    # the oracle is the environment the child was started with: nothing preloaded
    lines = _child("system", preload=False)
    assert lines[0] == "system" and lines[1] == "stayed"


@pytest.mark.skipif(allocator.jemalloc_path() is None, reason="libjemalloc2 not installed")
def test_jemalloc_is_reported_where_preloaded_and_taken_by_reexecuting():
    lines = _child("jemalloc", preload=True)  # already running it: no re-execution
    assert lines[:2] == ["jemalloc", "stayed"]
    lines = _child("auto", preload=False)  # not running it: the process runs again, on jemalloc
    assert lines == ["system", "jemalloc", "stayed"]


@pytest.mark.skipif(allocator.jemalloc_path() is None, reason="libjemalloc2 not installed")
def test_jemalloc_returns_freed_pages_at_once():
    # the project's setting, whatever this environment sets
    env = {**allocator.preload_env(allocator.jemalloc_path()), "MALLOC_CONF": allocator.MALLOC_CONF}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    before, peak, after = map(float, out.stdout.split())
    assert peak - before > 250  # the tensors were resident
    assert after - before < 8  # and went back when freed


@pytest.mark.skipif(allocator.jemalloc_path() is None, reason="libjemalloc2 not installed")
def test_system_under_a_preloaded_jemalloc_is_refused():
    env = allocator.preload_env(allocator.jemalloc_path())
    code = "from zerobench.runtime import allocator; allocator.use('system')"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "jemalloc is preloaded" in out.stderr
