#!/usr/bin/env bash
# Every GPU check of the project, in one run of under 9 minutes on one GPU: the GPU tests (with
# the device-clock and pinned-buffer tests, which run for real only here), `zerobench calibrate`
# of this GPU, then a micro-batch sweep of two presets measured beside the performance model on the
# datasheet profile and on the calibrated one (zerobench/checks/gpu_check.py). Uses the machine's
# own python3 with PyTorch (no set-up, no network); everything goes under $OUT/<device> (default
# results/gpu/<device>): versions, nvidia-smi, each step's log, the profile, runs/ and compare.csv.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
device=$("$py" -c 'import torch; print(torch.cuda.get_device_name(0).replace(" ", "-"))') || exit 1
out="${OUT:-results/gpu}/$device"
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee "$out/versions.txt"
timeout 120 "$py" -m pytest -q -p no:cacheprovider tests/gpu tests/unit/test_devices.py 2>&1 | tee "$out/tests.log"
# calibrate's default passes (the median of 5 sweeps of each grid, docs/gpu.md; about a minute on an
# H200); a single GPU has no group to time collectives in
timeout 150 "$py" -m zerobench.cli calibrate --device cuda --out "$out/calibrated-cuda.json" 2>&1 \
    | tee "$out/calibrate.log"
timeout 270 "$py" -m zerobench.checks.gpu_check "$out" --budget-s 240 --profile "$out/calibrated-cuda.json" 2>&1 \
    | tee "$out/sweep.log"
