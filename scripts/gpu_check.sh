#!/usr/bin/env bash
# Every GPU check of the project, in one run of under 8 minutes on one GPU (project issue 9):
# the GPU tests, a micro-batch sweep of two presets measured against the performance model.
# Uses the machine's own python3 with PyTorch (no set-up, no network); writes to $OUT (default
# results/gpu/<device>).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
device=$("$py" -c 'import torch; print(torch.cuda.get_device_name(0).replace(" ", "-"))') || exit 1
out="${OUT:-results/gpu}/$device"
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee "$out/versions.txt"
timeout 150 "$py" -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$out/tests.log"
timeout 330 "$py" -m zerobench.checks.gpu_check "$out" --budget-s 300 2>&1 | tee "$out/sweep.log"
