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

import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import core  # noqa: E402
import sympy as sp  # noqa: E402
import torch  # noqa: E402

import symneuron as sn  # noqa: E402


def neurons(learn_sigma: bool) -> tuple[sn.Neuron, sn.Neuron]:
    lif = sn.models.LIF()
    sigma = sp.Symbol("sigma", positive=True)
    noisy = sn.Neuron(
        lif.charge + sigma * sn.noise, params={**lif.params, "sigma": 0.05},
        learnable=["sigma"] if learn_sigma else [], surrogate=lif.surrogate, name="NoisyLIF",
    )  # fmt: skip
    return lif, noisy


def time_pair(
    neurons: tuple[sn.Neuron, sn.Neuron], x: torch.Tensor, timer: core.Timer, reps: int
) -> list[float]:
    """Median milliseconds of one forward + backward of each neuron (CUDA events, or wall
    on the CPU), the two calls alternating so that both see the same clocks."""
    backend, grad = ("cuda" if timer.cuda else "cpu"), torch.ones_like(x)

    def caller(neuron: sn.Neuron) -> Callable[[int], None]:
        def call(_: int) -> None:
            xs = x.detach().requires_grad_(True)
            sn.simulate(neuron, xs, backend=backend, seed=1, store_v_seq=False)[0].backward(grad)

        return call

    calls = [caller(neuron) for neuron in neurons]
    times: list[list[float]] = [[], []]
    for call in calls:
        timer.wall(call, 3)  # warm-up: compilation, caches
    for _ in range(reps):
        for call, out in zip(calls, times, strict=True):
            out += timer.events(call, 1) if timer.cuda else timer.wall(call, 1)
    return [1e3 * statistics.median(t) for t in times]


def main() -> None:
    p = core.parser(__doc__, "--T", "--N", "--dtypes", "--dry-run")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--learn-sigma", action="store_true")
    args = p.parse_args()
    device = torch.device("cpu" if args.dry_run else "cuda")
    n, t_len, dtypes = (4096, 8, ["fp32"]) if args.dry_run else (args.N, args.T, args.dtypes)
    pair, timer = neurons(args.learn_sigma), core.Timer(device)
    print(f"T = {t_len}, N = {n}, backend {device.type}, learn sigma {args.learn_sigma}")
    for name in dtypes:
        x = torch.rand(t_len, n, device=device).to(core.torch_dtype(name))
        base, drawn = time_pair(pair, x, timer, args.reps)
        print(f"{name}: LIF {base:.3f} ms, noisy LIF {drawn:.3f} ms, ratio {drawn / base:.3f}")


if __name__ == "__main__":
    main()
