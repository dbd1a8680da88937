#!/usr/bin/env python3
"""The cost of in-kernel noise: a noisy LIF's training call (forward
and backward; the backward regenerates the draws when sigma is learnable) against the
noiseless LIF's.

The noisy LIF is the zoo's LIF with ``+ sigma*sn.noise`` added to its charge (one
standard normal per neuron and step), once with sigma fixed (the backward needs no
draw) and once learnable (the backward draws again for sigma's gradient). Both run the
same shapes (T = 64, N = 2^20 by default) in fp32 and bf16; each time is the median
over ``--reps`` calls of GPU time (CUDA events, the host's launches queued ahead so
that no host gap counts) for ``simulate`` + ``backward`` (targets: noisy/noiseless
<= 1.05 in fp32, <= 1.15 in bf16 with sigma fixed; <= 1.10 and <= 1.30 learnable);
the call time between synchronisations, host included, is printed beside it.
``--dry-run`` runs tiny sizes on the CPU kernels::

    python3 benchmarks/noise_overhead.py
    python3 benchmarks/noise_overhead.py --T 64 --N 2^20 --dtypes fp32,bf16 --reps 60

It writes ``results/noise_<gpu>.json`` and a bar plot beside it (``--out`` to choose).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import core  # noqa: E402
import sympy as sp  # noqa: E402
import torch  # noqa: E402

import symneuron as sn  # noqa: E402


def neurons(learn_sigma: bool) -> tuple[sn.Neuron, sn.Neuron]:
    lif = sn.models.LIF()
    sigma = sp.Symbol("sigma", positive=True)
    noisy = sn.Neuron(
        lif.charge + sigma * sn.noise,
        params={**lif.params, "sigma": 0.05},
        learnable=["sigma"] if learn_sigma else [],
        surrogate=lif.surrogate,
        name="NoisyLIF",
    )
    return lif, noisy


def time_pair(
    neurons: tuple[sn.Neuron, sn.Neuron], x: torch.Tensor, timer: core.Timer, reps: int
) -> list[tuple[float, float]]:
    """(GPU ms, call ms) of one forward + backward of each neuron: GPU time by CUDA events
    with the host's launches queued ahead (:meth:`core.Timer.device`: the kernels' time,
    no host gaps), call time between two synchronisations (host time included). Batches
    of the two neurons alternate so that both see the same clocks; medians."""
    backend, grad = ("cuda" if timer.cuda else "cpu"), torch.ones_like(x)

    def caller(neuron: sn.Neuron) -> Callable[[int], None]:
        def call(_: int) -> None:
            xs = x.detach().requires_grad_(True)
            sn.simulate(neuron, xs, backend=backend, seed=1, store_v_seq=False)[0].backward(grad)

        return call

    calls = [caller(neuron) for neuron in neurons]
    device: list[list[float]] = [[], []]
    wall: list[list[float]] = [[], []]
    for call in calls:
        timer.wall(call, 3)  # warm-up: compilation, caches
    for _ in range(max(1, reps // 10)):
        for call, gpu, host in zip(calls, device, wall, strict=True):
            host += timer.wall(call, 2)
            gpu += timer.device(call, 10, statistics.median(host))
    return [
        (1e3 * statistics.median(g), 1e3 * statistics.median(w))
        for g, w in zip(device, wall, strict=True)
    ]


#: the issue's targets, noisy over noiseless GPU time, by (dtype, sigma)
TARGETS = {
    ("fp32", "fixed"): 1.05,
    ("bf16", "fixed"): 1.15,
    ("fp32", "learnable"): 1.10,
    ("bf16", "learnable"): 1.30,
}
SIGMAS = ("fixed", "learnable")


def plot(records: list[dict[str, Any]], path: Path, title: str) -> None:
    """Bars of noisy/noiseless GPU time per dtype, sigma fixed and learnable, with the
    targets as short lines."""
    plt = core.pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    names = list(dict.fromkeys(r["dtype"] for r in records))
    series = [
        (
            [
                next((r["ratio"] for r in records if r["dtype"] == d and r["sigma"] == sigma), None)
                for d in names
            ],
            {"label": f"sigma {sigma}"},
        )
        for sigma in SIGMAS
    ]
    core.grouped_bars(ax, len(names), series)
    width = 0.8 / len(SIGMAS)  # grouped_bars' bar width: each target over its own bar
    for i, d in enumerate(names):
        for k, sigma in enumerate(SIGMAS):
            middle = i + (k - (len(SIGMAS) - 1) / 2) * width
            target = TARGETS.get((d, sigma), 1.0)
            ax.hlines(target, middle - width / 2, middle + width / 2, colors="k", linestyles="--")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0.9, max(1.4, *(r["ratio"] + 0.05 for r in records)))
    ax.set_ylabel("noisy / noiseless GPU time")
    ax.legend(fontsize=7)
    core.save_figure(fig, path, title, dpi=110)


def main() -> None:
    p = core.parser(__doc__, "--T", "--N", "--dtypes", "--dry-run")
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--out", type=Path, default=None, help="default results/noise_<gpu>.json")
    args = p.parse_args()
    device = torch.device("cpu" if args.dry_run else "cuda")
    n, t_len, dtypes = (4096, 8, ["fp32"]) if args.dry_run else (args.N, args.T, args.dtypes)
    timer, info, records = core.Timer(device), core.device_info(device), []
    print(f"T = {t_len}, N = {n}, backend {device.type}, {info['gpu']}")
    for sigma in SIGMAS:
        pair = neurons(sigma == "learnable")
        for name in dtypes:
            x = torch.rand(t_len, n, device=device).to(core.torch_dtype(name))
            (base, base_call), (drawn, drawn_call) = time_pair(pair, x, timer, args.reps)
            records.append(
                dict(
                    dtype=name,
                    sigma=sigma,
                    T=t_len,
                    N=n,
                    lif_ms=base,
                    noisy_ms=drawn,
                    ratio=drawn / base,
                    lif_call_ms=base_call,
                    noisy_call_ms=drawn_call,
                    target=TARGETS.get((name, sigma)),
                )
            )
            print(
                f"{name} sigma {sigma}: GPU time LIF {base:.3f} ms, noisy LIF {drawn:.3f} ms, "
                f"ratio {drawn / base:.3f}; call (host included) {base_call:.3f} / "
                f"{drawn_call:.3f} ms",
                flush=True,
            )
    if args.dry_run and args.out is None:
        return
    out = args.out or core.result_path(core.HERE / "results", info["gpu"], "noise_")
    meta = dict(date=core.now_iso(), argv=sys.argv[1:], **info, versions=core.versions())
    core.write_json(out, dict(meta=meta, records=records))
    plot(records, out.with_suffix(".png"), f"In-kernel noise cost — {info['gpu']}")
    print(f"# wrote {out} and {out.with_suffix('.png')}", file=sys.stderr)


if __name__ == "__main__":
    main()
