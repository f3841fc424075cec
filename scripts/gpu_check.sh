#!/usr/bin/env bash
# Every GPU check of the project, in one run planned for under 8 minutes on one GPU (each step has
# its own time limit; the peers take what the steps before them left of 460 s, each model's none
# if under 90-100 s): the GPU tests (with the device-clock and pinned-buffer tests, which run for
# real only here), `zerobench calibrate` of this GPU, then a micro-batch sweep of two presets
# measured beside the performance model on the datasheet profile and on the calibrated one
# (zerobench/checks/gpu_check.py), then ours beside PyTorch on this GPU (`zerobench peers --device
# cuda`, docs/gpu-peers.md). Uses the machine's own python3 with PyTorch (no set-up, no network);
# everything goes under $OUT/<device> (default results/gpu/<device>): versions, nvidia-smi, each
# step's log, the profile, runs/ and compare.csv, peers/ (one CSV and figure per model, peers.log).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
deadline=460  # seconds from the start: the peers take what the steps before them left of it
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
# The peers, each in its own process, as the sweep's trials run: the plain PyTorch loop eager and
# under torch.compile (compiled in its warm-up step), FSDP2 and ours at stages 0-3, at gpt-1.5b;
# then, in the time left, ours-0 beside the plain loop, eager and compiled, at dp-6b (the sweep has
# its stage 3). Micro-batch 16: the size the first H200 run compared compiled (docs/gpu-peers.md).
peers=(--device cuda --precision bf16 --checkpoint-activations --micro-batch 16 --warmup 1 --steps 3)
mkdir -p "$out/peers"
skip() { echo "gpu_check: ${left} s left before the ${deadline} s deadline: no $1 peers"; }
left=$((deadline - SECONDS))
if [ "$left" -ge 100 ]; then
    timeout $((left < 220 ? left : 220)) "$py" -m zerobench.cli peers --model gpt-1.5b "${peers[@]}" \
        --out "$out/peers/gpt-1.5b.csv" --figure "$out/peers/gpt-1.5b.png" 2>&1
else
    skip gpt-1.5b
fi | tee "$out/peers/peers.log"
left=$((deadline - SECONDS))
if [ "$left" -ge 90 ]; then
    timeout "$left" "$py" -m zerobench.cli peers --model dp-6b "${peers[@]}" --impls ours-0,plain,plain-compile \
        --out "$out/peers/dp-6b.csv" --figure "$out/peers/dp-6b.png" 2>&1
else
    skip dp-6b
fi | tee -a "$out/peers/peers.log"
echo "gpu_check: ${SECONDS} s in all" | tee -a "$out/peers/peers.log"
