"""The host allocator choice (zerobench/runtime/allocator.py): bad choices refused by name, and jemalloc as
the memory trials run it, returning freed pages at once so that RSS holds live allocations."""

import subprocess
import sys

import pytest

from zerobench.config import ConfigError
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
        allocator.use("tcmalloc", [])


def test_this_process_runs_the_system_allocator():
    assert allocator.in_use() == "system"
    allocator.use("system", [])  # returns: nothing to re-execute


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
    code = "from zerobench.runtime import allocator; allocator.use('system', [])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "jemalloc is preloaded" in out.stderr
