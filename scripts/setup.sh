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
echo "setup: $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)') in $venv"
