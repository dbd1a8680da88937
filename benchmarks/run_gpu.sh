#!/usr/bin/env bash
# Run the GPU benchmark on the device machine and bring the results back in $OUT.
#
# The device call (carry the wheels, which .gitignore keeps out of the tree):
#
#   command: bash benchmarks/run_gpu.sh --quick          (or any bench_neurons.py filters)
#   carry:   [".whl"]
#   timeout_s: 600
#
# The stateful neurons (Izhikevich vs SJ's IzhikevichNode, a = 0.3, b = 0.2; ALIF has no SJ peer;
# target: training wall >= 3x SJ 0.0.0.0.14 CuPy at T in {16, 64}, N = 2^20):
#
#   command: bash benchmarks/run_gpu.sh --models Izhikevich,ALIF --T 16,64 --N 1048576 --dtypes fp32,bf16 --peers symneuron,sj014,sj200
#
# .whl/ must hold (see benchmarks/NOTES.md, "Wheels"):
#   spikingjelly-0.0.0.0.14-py3-none-any.whl, spikingjelly-2.0.0-py3-none-any.whl,
#   loguru-0.7.3-py3-none-any.whl (SpikingJelly 2.0.0 imports it; the GPU image lacks it).
#
# bench_neurons.py installs each SpikingJelly from there into a directory of its own (the two
# versions conflict) and puts it on PYTHONPATH of the worker process that runs it. A peer
# that fails is recorded in the results and never stops the run. The benchmark gets
# BENCH_TIMEOUT seconds (default 540) and stops starting new configurations after
# --time-budget-s (default 450 here); partial results are written either way.
#
# Comes back in $OUT: <gpu>-<date>.json, <gpu>-<date>.png, performance.md, bench.log,
# nvidia-smi.txt. Copy the JSON and PNG to benchmarks/results/ and performance.md to docs/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/symneuron-bench-out}"
mkdir -p "$OUT"
LOG="$OUT/bench.log"
: >"$LOG"
export PYTHONUNBUFFERED=1

say() { echo "[run_gpu] $*" | tee -a "$LOG"; }

nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
python3 - <<'EOF' 2>&1 | tee -a "$LOG"
import importlib
for name in ("torch", "cupy", "triton", "numpy", "sympy", "matplotlib", "loguru"):
    try:
        print(f"[run_gpu] {name} {importlib.import_module(name).__version__}")
    except Exception as exc:
        print(f"[run_gpu] {name} MISSING: {exc}")
import torch
print(f"[run_gpu] device {torch.cuda.get_device_name() if torch.cuda.is_available() else 'NO CUDA'}")
EOF

RESULTS="${RESULTS:-benchmarks/results}"   # overridable for local smoke tests
DOCS="${DOCS:-docs/performance.md}"
mkdir -p "$RESULTS"
before=$(ls "$RESULTS"/*.json 2>/dev/null | sort)
timeout -s TERM --kill-after=20 "${BENCH_TIMEOUT:-540}" \
    python3 benchmarks/bench_neurons.py --wheels .whl --out-dir "$RESULTS" \
    --time-budget-s "${BUDGET:-450}" "$@" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
say "bench_neurons.py exited with $rc"

latest=$(comm -13 <(echo "$before") <(ls "$RESULTS"/*.json 2>/dev/null | sort) | tail -1)
if [ -z "$latest" ]; then
    latest=$(ls -t "$RESULTS"/*.json 2>/dev/null | head -1)
fi
if [ -n "$latest" ]; then
    png="${latest%.json}.png"
    python3 benchmarks/report.py "$latest" -o "$DOCS" --plot "$png" 2>&1 | tee -a "$LOG"
    cp "$latest" "$OUT/"
    [ -f "$png" ] && cp "$png" "$OUT/"
    [ -f "$DOCS" ] && cp "$DOCS" "$OUT/"
    say "results in \$OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
else
    say "no results file was written"
fi
exit "$rc"
