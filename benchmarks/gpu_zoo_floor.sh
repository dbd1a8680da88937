#!/usr/bin/env bash
# One device call: every zoo model's training kernels against its own floor (issue
# "Speed where users feel it": fp32 and 16-bit, T >= 16, GPU time >= 0.85 of the floor),
# then the CUDA tests. Symneuron alone (the peer comparison is bench_neurons' default
# mode); each model's floor counts its own extra states (floor.py). Results in $OUT.
#
# device call:  command: bash benchmarks/gpu_zoo_floor.sh   timeout_s: 600
# Afterwards, here: python3 benchmarks/roofline.py (the static estimate of each model's
# bound) next to the measured fractions in $OUT/zoo-floor.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/symneuron-gpu-out}"
mkdir -p "$OUT"
export PYTHONPATH=".:tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export SYMNEURON_CACHE="${SYMNEURON_CACHE:-/tmp/sncache}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout -s TERM "${BENCH_TIMEOUT:-330}" python3 benchmarks/bench_neurons.py \
    --models zoo --peers symneuron --modes training --T 16,64 --N 2^20 \
    --dtypes fp32,bf16 --skip-first-call --skip-derivation --out-dir "$OUT" --tag zoo \
    --time-budget-s 300 2>"$OUT/zoo-floor.err" | tee "$OUT/zoo-floor.log" | tail -90
timeout -s TERM "${TEST_TIMEOUT:-240}" python3 -m pytest -q -rfE -m cuda -p no:cacheprovider \
    tests/test_cuda.py tests/test_cuda_ode.py 2>&1 | tee "$OUT/cuda_tests.log" | tail -15
