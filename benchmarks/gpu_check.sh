#!/usr/bin/env bash
# One device call that verifies the CUDA paths and measures the kernels alone:
#
#   1. the GPU tests: tests/test_cuda.py (every zoo model, stateful ones included, in fp64,
#      fp32, fp16 and bf16 against the float64 reference) and tests/test_regressions.py;
#   2. kernel-only sweeps (bench_neurons.py --sweep: block size, surrogate form; SWEEPS=none
#      skips them, SWEEPS=block,lanes,surrogate runs all three);
#   3. host overhead parts (bench_neurons.py --overhead);
#   4. optionally the benchmark, with the arguments given after "--bench"
#      (through run_gpu.sh; carry [".whl"] for the SpikingJelly peers).
#
# device call:  command: bash benchmarks/gpu_check.sh [--bench <bench_neurons.py args>]
#               carry: [".whl"]   timeout_s: 600
# Logs come back in $OUT: cuda_tests.log, tune.log (+ run_gpu.sh's files with --bench).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/symneuron-gpu-out}"
mkdir -p "$OUT"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }

if [ "${1:-}" = "--overhead-only" ]; then  # host-overhead diagnostics alone
    timeout -s TERM 90 python3 benchmarks/bench_neurons.py --overhead 2>&1 | tee "$OUT/overhead.log"
    exit 0
fi

timeout -s TERM "${TEST_TIMEOUT:-280}" python3 -m pytest -q -rs tests/test_cuda.py \
    tests/test_regressions.py 2>&1 | tee "$OUT/cuda_tests.log" | tail -15
echo "[gpu_check] tests done at $(elapsed) s"

if [ "${SWEEPS:-}" != "none" ]; then
    {
        timeout -s TERM "${TUNE_TIMEOUT:-100}" python3 benchmarks/bench_neurons.py \
            --sweep "${SWEEPS:-block,surrogate}" --models "${TUNE_MODELS:-LIF,QIF,PLIF,EIF}"
        timeout -s TERM 60 python3 benchmarks/bench_neurons.py --overhead
    } >"$OUT/tune.log" 2>&1
    cat "$OUT/tune.log"
fi
echo "[gpu_check] tune done at $(elapsed) s"

if [ "${1:-}" = "--bench" ]; then
    shift
    left=$(( ${CALL_BUDGET:-570} - $(elapsed) ))
    echo "[gpu_check] benchmark with ${left} s left"
    BENCH_TIMEOUT=$(( left - 15 )) BUDGET=$(( left - 90 )) bash benchmarks/run_gpu.sh "$@" \
        | tail -40
fi
echo "[gpu_check] all done at $(elapsed) s"
