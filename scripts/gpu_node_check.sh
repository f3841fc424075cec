#!/usr/bin/env bash
# The node check (zerobench/checks/node_check.py, docs/gpu.md "A node of N GPUs"): ZeRO stages 0-3
# over NCCL on the N GPUs of this node against the single-process reference, the ledger against the
# paper's 2Ψ / 3Ψ, each rank's peak against the trace of the same trial and NCCL's allowance, and
# step time and TFLOPS of gpt-1.5b and dp-6b beside the model. Exits non-zero on any failed gate.
#
#   scripts/gpu_node_check.sh [N]        # N GPUs (default: every GPU of the node)
#   NODE_CHECK_DEVICE=cpu scripts/gpu_node_check.sh 2   # gloo ranks: the parity and ledger gates
#
# Uses the machine's own python3 with PyTorch (no set-up, no network; PYTHON overrides it). Writes
# everything under $OUT/<device>-x<N> (default results/gpu/<device>-x<N>): versions, nvidia-smi,
# traced/ (one trace per speed trial), node_check.json (the gates, parity, speed, NCCL's bytes),
# speed.csv and node_check.log. NODE_CHECK_GATES picks gates (default parity,ledger,memory on a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
kind="${NODE_CHECK_DEVICE:-cuda}"
if [ "$kind" = cuda ]; then
    n="${1:-$("$py" -c 'import torch; print(torch.cuda.device_count())')}" || exit 1
    device=$("$py" -c 'import torch; print(torch.cuda.get_device_name(0).replace(" ", "-"))') || exit 1
    gates="${NODE_CHECK_GATES:-parity,ledger,memory}"
else
    n="${1:-2}" device=cpu gates="${NODE_CHECK_GATES:-parity,ledger}"
    export OMP_NUM_THREADS=1  # one core per rank, as a GPU rank owns its GPU
fi
if [ "$n" -lt 2 ]; then
    echo "gpu_node_check: $n device(s); the node check needs 2 or more" >&2
    exit 2
fi
out="${OUT:-results/gpu}/$device-x$n"
mkdir -p "$out"
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee "$out/versions.txt"
if [ "$kind" = cuda ]; then
    nvidia-smi > "$out/nvidia-smi.txt" 2>&1
    nvidia-smi topo -m > "$out/topology.txt" 2>&1  # NVLink / NVSwitch between the GPUs
    # the traces first: FakeTensorMode in one process of its own, before any process group exists
    timeout 900 "$py" -m zerobench.checks.node_check trace "$out" --gpus "$n" 2>&1 | tee "$out/trace.log"
fi
timeout 1800 "$py" -m torch.distributed.run --standalone --nproc-per-node "$n" \
    -m zerobench.checks.node_check run "$out" --device "$kind" --gates "$gates" 2>&1 | tee "$out/node_check.log"
rc=${PIPESTATUS[0]}
echo "gpu_node_check: exit $rc" | tee -a "$out/node_check.log"
exit "$rc"
