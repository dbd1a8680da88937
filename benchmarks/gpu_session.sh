#!/usr/bin/env bash
# One device call for a session's GPU verification. Logs land in $OUT.
#
#   bash benchmarks/gpu_session.sh        the CUDA tests of the zoo's paper models
#       (tests/test_cuda_ode.py: float64 GPU vs CPU for every Brian2 case, sn.check in
#       fp64/fp32/fp16/bf16), the CUDA regression tests, and the kernel benchmark rows of
#       the paper models (symneuron only; each against its own floor)
#   bash benchmarks/gpu_session.sh zoo    every zoo model's training kernels against its
#       own floor (fp32 and bf16, T = 16 and 64, N = 2^20; the issue's target is >= 0.85),
#       then the CUDA tests
#
# The measured bound of each kernel (Nsight Compute, about 3 minutes for the zoo):
#   python3 benchmarks/profile_ncu.py --models zoo --dtypes bf16,fp32 --out-dir $OUT/ncu
# and the page that joins both: benchmarks/report.py --zoo (docs/performance_zoo.md).
#
# device call:  command: bash benchmarks/gpu_session.sh [zoo]   timeout_s: 600
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/symneuron-gpu-out}"
mkdir -p "$OUT"
export PYTHONPATH=".:tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export SYMNEURON_CACHE="${SYMNEURON_CACHE:-/tmp/sncache}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__)" \
    | tee -a "$OUT/gpu.txt"
if [ "${1:-}" = zoo ]; then
    timeout -s TERM "${BENCH_TIMEOUT:-330}" python3 benchmarks/bench_neurons.py \
        --models zoo --peers symneuron --modes training --T 16,64 --N 2^20 \
        --dtypes fp32,bf16 --out-dir "$OUT" --tag zoo \
        --time-budget-s 300 2>"$OUT/zoo-floor.err" | tee "$OUT/zoo-floor.log" | tail -90
    timeout -s TERM "${TEST_TIMEOUT:-240}" python3 -m pytest -q -rfE -m cuda \
        -p no:cacheprovider tests/test_cuda.py tests/test_cuda_ode.py 2>&1 \
        | tee "$OUT/cuda_tests.log" | tail -15
    exit 0
fi
timeout -s TERM "${TEST_TIMEOUT:-250}" python3 -m pytest -q -rfE -m cuda -p no:cacheprovider \
    tests/test_cuda_ode.py tests/test_reliability.py 2>&1 \
    | tee "$OUT/cuda_tests.log" | tail -25
timeout -s TERM "${BENCH_TIMEOUT:-120}" python3 benchmarks/bench_neurons.py \
    --models Izhikevich2003,HodgkinHuxley --peers symneuron --T 16,64 --N 2^20 \
    --dtypes fp32,bf16 --out-dir "$OUT" \
    --time-budget-s 90 2>"$OUT/bench.err" | tee "$OUT/bench.log" | tail -20
