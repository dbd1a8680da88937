#!/usr/bin/env python3
"""The cost of in-kernel noise (issue 24, item 5): a noisy LIF's training call (forward
and backward, the backward regenerating the draws) against the noiseless LIF's.

The noisy LIF is the zoo's LIF with ``+ sigma*sn.noise`` added to its charge (one
standard normal per neuron and step, learnable sigma off, so the backward needs no
draw; ``--learn-sigma`` makes it read them). Both run the same shapes (T = 64,
N = 2^20 by default) in fp32 and bf16; each time is the median over ``--reps`` calls of
CUDA-event time for ``simulate`` + ``backward`` (targets: noisy/noiseless <= 1.05 in
fp32, <= 1.15 in bf16). ``--dry-run`` runs tiny sizes on the CPU kernels::

    python3 benchmarks/noise_overhead.py
    python3 benchmarks/noise_overhead.py --T 64 --N 2^20 --dtypes fp32,bf16 --reps 50
"""

from __future__ import annotations

import argparse
import statistics
import time

import sympy as sp
import torch

import symneuron as sn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def neurons(learn_sigma: bool) -> tuple[sn.Neuron, sn.Neuron]:
    lif = sn.models.LIF()
    sigma = sp.Symbol("sigma", positive=True)
    noisy = sn.Neuron(
        lif.charge + sigma * sn.noise, params={**lif.params, "sigma": 0.05},
        learnable=["sigma"] if learn_sigma else [], surrogate=lif.surrogate, name="NoisyLIF",
    )  # fmt: skip
    return lif, noisy


def time_call(neuron: sn.Neuron, x: torch.Tensor, backend: str, reps: int) -> float:
    """Median milliseconds of one forward + backward (CUDA events, or wall on the CPU)."""
    grad = torch.ones_like(x)
    times = []
    for i in range(reps + 3):
        xs = x.detach().requires_grad_(True)
        if backend == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        spikes, _ = sn.simulate(neuron, xs, backend=backend, seed=1, store_v_seq=False)
        spikes.backward(grad)
        if backend == "cuda":
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end)
        else:
            elapsed = 1e3 * (time.perf_counter() - t0)
        if i >= 3:  # warm-up: compilation, caches
            times.append(elapsed)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=64)
    parser.add_argument("--N", default="2^20")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--learn-sigma", action="store_true")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    n = int(eval(args.N.replace("^", "**"), {}))  # noqa: S307 (a size like 2^20)
    backend, device = ("cuda", "cuda") if not args.dry_run else ("cpu", "cpu")
    t_len = args.T
    dtypes = args.dtypes.split(",")
    if args.dry_run:
        n, t_len, dtypes = 4096, 8, ["fp32"]
    lif, noisy = neurons(args.learn_sigma)
    print(f"T = {t_len}, N = {n}, backend {backend}, learn sigma {args.learn_sigma}")
    for name in dtypes:
        x = torch.rand(t_len, n, device=device, generator=None).to(DTYPES[name])
        base = time_call(lif, x, backend, args.reps)
        drawn = time_call(noisy, x, backend, args.reps)
        print(f"{name}: LIF {base:.3f} ms, noisy LIF {drawn:.3f} ms, ratio {drawn / base:.3f}")


if __name__ == "__main__":
    main()
