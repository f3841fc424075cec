#!/usr/bin/env bash
# Every GPU check of the project, in one call of at most 8 minutes on one GPU (an H200 here). Each
# part's budget is what the deadline leaves when it starts; the parts run most important first:
#   1. the micro-batch sweep (zerobench/checks/gpu_check.py): dp-6b first, then gpt-1.5b, stages 0
#      and 3, measured beside the performance model, eager (no compile); gate: dp-6b's
#      micro-batch-1 peak allocated under 100 GB;
#   2. the GPU tests (tests/gpu, with the device-clock and pinned-buffer tests that run for real only
#      here; one of them compiles, the others run eager);
#   3. the emulated ranks (zerobench/checks/gpu_emulated.py): dp-6b at N_d 8, stages 1-3, each
#      rank's tensor peak against the trace (gate: equal), then the paper-scale emulated Fig 3 and
#      Fig 6 under the V100's 32 GB, trial by trial while time is left;
#   4. with time still left: `zerobench calibrate` of this GPU and the peers at gpt-1.5b.
# Uses the machine's own python3 with PyTorch (no set-up, no network). Everything goes under
# $OUT/<device> (default results/gpu/<device>). Exits 1 with a one-line summary when a test fails,
# a trial errors or a gate fails; 0 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
deadline="${GPU_CHECK_DEADLINE_S:-460}"  # seconds from the start: 20 s of the 8 minutes kept for the copy back
device=$("$py" -c 'import torch; print(torch.cuda.get_device_name(0).replace(" ", "-"))') || exit 1
out="${OUT:-results/gpu}/$device"
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee "$out/versions.txt"
failed=()
left() { echo $((deadline - SECONDS)); }
# share PCT of what is left, at most CAP seconds
budget() { local l; l=$(left); l=$((l * $1 / 100)); echo $((l < $2 ? l : $2)); }

# 1. the sweep: a quarter of the time
sweep=$(budget 25 120)
timeout $((sweep + 30)) "$py" -m zerobench.checks.gpu_check "$out" --budget-s "$sweep" 2>&1 | tee "$out/sweep.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || failed+=("sweep: $(grep -h '^gpu_check: .* trials' "$out/sweep.log" | tail -1)")

# 2. the GPU tests
tests=$(budget 30 90)
timeout "$tests" "$py" -m pytest -q -p no:cacheprovider tests/gpu tests/unit/test_devices.py 2>&1 | tee "$out/tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || failed+=("tests: $(tail -1 "$out/tests.log")")

# 3. the emulated ranks: what is left but the last 30 s
emulated=$(($(left) - 30))
if [ "$emulated" -ge 60 ]; then
    "$py" -m zerobench.checks.gpu_emulated "$out/emulated" --deadline-s "$emulated" 2>&1 | tee "$out/emulated.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed+=("emulated: $(tail -1 "$out/emulated.log")")
else
    failed+=("emulated: not run, ${emulated} s left")
fi

# 4. only with time to spare (about a minute and a half each on an H200)
if [ "$(left)" -ge 120 ]; then
    timeout $(($(left) - 20)) "$py" -m zerobench.cli calibrate --device cuda --out "$out/calibrated-cuda.json" 2>&1 \
        | tee "$out/calibrate.log"
fi
if [ "$(left)" -ge 120 ]; then
    mkdir -p "$out/peers"
    timeout $(($(left) - 20)) "$py" -m zerobench.cli peers --model gpt-1.5b --device cuda --precision bf16 \
        --checkpoint-activations --micro-batch 16 --warmup 1 --steps 3 \
        --out "$out/peers/gpt-1.5b.csv" --figure "$out/peers/gpt-1.5b.png" 2>&1 | tee "$out/peers/peers.log"
fi

# a node of several GPUs: the node check is its own call (scripts/gpu_node_check.sh, docs/gpu.md)
gpus=$("$py" -c 'import torch; print(torch.cuda.device_count())')
[ "$gpus" -lt 2 ] || echo "gpu_check: $gpus GPUs here: run scripts/gpu_node_check.sh $gpus next (its own call)"

if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu_check: FAILED after ${SECONDS} s — $(IFS='|'; echo "${failed[*]}")" | tee "$out/summary.txt"
    exit 1
fi
echo "gpu_check: passed in ${SECONDS} s (sweep, tests, emulated; see $out)" | tee "$out/summary.txt"
