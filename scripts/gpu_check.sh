#!/usr/bin/env bash
# Every GPU check of the project, in one call of at most 8 minutes on one GPU: the driver
# (zerobench/checks/gpu_driver.py) reports the device, its profile, torch, CUDA and any missing
# package first, and stops there if a gated part cannot run; then each part in a process of its
# own, budgeted from one deadline, most important first:
#   1. the micro-batch sweep (zerobench/checks/gpu_check.py): dp-6b, then gpt-1.5b, stages 0 and 3,
#      each trial traced first and run only where its trace fits this card (the others skipped,
#      and said why), measured beside the performance model; gate: each peak within its trace;
#   2. the GPU tests (tests/gpu, with the device-clock and pinned-buffer tests that run for real
#      only here);
#   3. the emulated ranks (zerobench/checks/gpu_emulated.py): dp-6b at N_d 8, stages 1-3, each
#      rank's tensor peak against the trace made on the same device (gate: equal), then the
#      paper-scale emulated Fig 3 and Fig 6 under the V100's 32 GB while time is left;
#   4. with time still left: `zerobench calibrate` of this GPU and the peers at gpt-1.5b.
# docs/gpu.md gives each part's expected time and where the figure comes from. Uses the machine's
# own python3 with PyTorch (no set-up, no network; PYTHON overrides it). Everything goes under
# $OUT/<device> (default results/gpu/<device>). Exits 1 with a one-line summary naming each failed
# gate (summary.txt; parts.json holds each part's seconds); 0 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# seconds from the start: the driver keeps the last 20 for the copy back
exec "${PYTHON:-python3}" -m zerobench.checks.gpu_driver "${OUT:-results/gpu}" --deadline-s "${GPU_CHECK_DEADLINE_S:-460}"
