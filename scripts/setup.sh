#!/usr/bin/env bash
# Make the virtual environment `${1:-.venv}` and install zerobench with its dev tools.
# Without CUDA, torch is pinned to the CPU build first: a bare `torch` requirement would pull a
# multi-GB CUDA build from PyPI.
set -euo pipefail
venv="${1:-.venv}"
python="${PYTHON:-python3}"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip="$venv/bin/python -m pip"
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "setup: no CUDA device found; installing the CPU build torch==${TORCH_CPU_VERSION:-2.13.0}"
  $pip install -q "torch==${TORCH_CPU_VERSION:-2.13.0}"
fi
$pip install -q -e ".[dev]"
# jemalloc for measured CPU trials (zerobench/runtime/allocator.py): installed when apt-get runs as root,
# otherwise the trials run on the system allocator and their records say so.
if ! ls /usr/lib/*/libjemalloc.so.2 /usr/lib*/libjemalloc.so.2 >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing libjemalloc2 (apt-get)"
    (apt-get install -y -qq libjemalloc2 >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq libjemalloc2; } >/dev/null 2>&1) \
      || echo "setup: libjemalloc2 not installed; measured CPU trials use the system allocator"
  else
    echo "setup: libjemalloc2 not found (apt-get install libjemalloc2); measured CPU trials use the system allocator"
  fi
fi
echo "setup: $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)') in $venv"
