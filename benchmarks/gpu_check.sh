#!/usr/bin/env bash
# One device call that verifies the CUDA paths and, optionally, runs the benchmark:
#
#   1. the GPU tests: tests/test_cuda.py (every zoo model, stateful ones included, in fp64,
#      fp32, fp16 and bf16 against the float64 reference) and tests/test_regressions.py;
#   2. optionally the benchmark, with the arguments given after "--bench"
#      (through run_gpu.sh; carry [".whl"] for the SpikingJelly peers).
#
# device call:  command: bash benchmarks/gpu_check.sh [--bench <bench_neurons.py args>]
#               carry: [".whl"]   timeout_s: 600
# Logs come back in $OUT: cuda_tests.log (+ run_gpu.sh's files with --bench). The kernels
# alone per runtime setting (block size, lanes): profile_ncu.py --settings (NOTES.md).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/symneuron-gpu-out}"
mkdir -p "$OUT"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }

timeout -s TERM "${TEST_TIMEOUT:-280}" python3 -m pytest -q -rs tests/test_cuda.py \
    tests/test_regressions.py 2>&1 | tee "$OUT/cuda_tests.log" | tail -15
echo "[gpu_check] tests done at $(elapsed) s"

if [ "${1:-}" = "--bench" ]; then
    shift
    left=$(( ${CALL_BUDGET:-570} - $(elapsed) ))
    echo "[gpu_check] benchmark with ${left} s left"
    BENCH_TIMEOUT=$(( left - 15 )) BUDGET=$(( left - 90 )) bash benchmarks/run_gpu.sh "$@" \
        | tail -40
fi
echo "[gpu_check] all done at $(elapsed) s"
