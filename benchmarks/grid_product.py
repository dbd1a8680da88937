#!/usr/bin/env python3
"""The recurrent layer's step products on tensor cores (``mma``: the grid kernels' forward
and backward) against the multiply-adds (``fma``: one block per row's gather forward and
the grid backward by multiply-adds), side by side in one run: the layer alone
(``RecurrentNeuronLayer(LIF(tau=10), H)``), its forward and backward, its forward alone
and its backward alone, ms per call (CUDA events, median after warm-up), and how far
the two products' weight gradients are apart; docs/performance_recurrent.md.

    python3 benchmarks/grid_product.py --out results.json
    python3 benchmarks/grid_product.py --configs "256,1024;128,2048" --dtypes bf16
    python3 benchmarks/grid_product.py --configs "64,512" --mma-forward-from 512
    python3 benchmarks/grid_product.py --configs "256,512" --mma-backward-from 512
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import core  # noqa: E402
import torch  # noqa: E402

import symneuron as sn  # noqa: E402
from symneuron.runtime import rows  # noqa: E402

CONFIGS = [(256, 1024), (128, 2048), (64, 4096)]  # (B, H)
#: dtype labels: the layer's dtype, and whether TF32 is allowed
DTYPES = {"bf16": (torch.bfloat16, False), "fp16": (torch.float16, False)}
DTYPES |= {"tf32": (torch.float32, True), "fp32": (torch.float32, False)}
LENGTH, RATE = 100, 0.05


def _input(layer: Any, shape: tuple[int, int, int], dtype: torch.dtype) -> torch.Tensor:
    """A seeded input current at the gain whose firing rate is nearest :data:`RATE`."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    base = torch.rand(shape, generator=gen, device="cuda")
    rates = {}
    for gain in (0.8, 1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0):
        layer.reset()
        with torch.no_grad():
            rates[gain] = float(layer((gain * base).to(dtype)).float().mean())
    gain = min(rates, key=lambda g: abs(rates[g] - RATE))
    core.log(f"gain {gain}: firing rate {rates[gain]:.3f}")
    return (gain * base).to(dtype)


def _measure(layer: Any, x: torch.Tensor, timer: core.Timer, reps: int) -> dict[str, Any]:
    """The layer's forward + backward, its forward alone and its backward alone (ms,
    medians), its weight gradient."""
    grad = torch.linspace(-1, 1, x.shape[-1], device="cuda", dtype=x.dtype).expand_as(x)

    def both(_: int) -> None:
        layer.reset()
        layer.weight.grad = None
        layer(x).backward(grad)

    for _ in range(3):
        both(0)
    whole = timer.events(both, reps)

    def forward(_: int) -> None:
        layer.reset()
        layer(x)

    ahead = timer.events(forward, reps)
    outs = []
    for _ in range(reps + 3):
        layer.reset()
        outs.append(layer(x))
    for out in outs[:3]:
        out.backward(grad)
    back = timer.events(lambda i: outs[3 + i].backward(grad), reps)
    both(0)
    return {
        "layer_ms": 1e3 * statistics.median(whole),
        "forward_ms": 1e3 * statistics.median(ahead),
        "backward_ms": 1e3 * statistics.median(back),
        "weight_grad": layer.weight.grad.detach().double().clone(),
    }


def main() -> None:
    ap = core.parser(__doc__)
    ap.add_argument("--out", default="", help="the JSON file to write")
    ap.add_argument("--configs", default=";".join(f"{b},{h}" for b, h in CONFIGS))
    ap.add_argument("--dtypes", type=core.csv_list(str, DTYPES), default=list(DTYPES))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument(
        "--mma-forward-from",
        type=int,
        default=rows.MMA_FORWARD_FROM,
        help="the layer size from which the forward runs on tensor cores (the grid)",
    )
    ap.add_argument(
        "--mma-backward-from",
        type=int,
        default=rows.MMA_BACKWARD_FROM,
        help="the layer size from which the backward runs on tensor cores (the grid)",
    )
    args = ap.parse_args()
    rows.MMA_FORWARD_FROM = args.mma_forward_from
    rows.MMA_BACKWARD_FROM = args.mma_backward_from
    if not torch.cuda.is_available():
        sys.exit("grid_product.py times the CUDA grid kernels: it needs a GPU")
    timer, rows_out = core.Timer(torch.device("cuda")), []
    for config in args.configs.split(";"):
        batch, size = (int(v) for v in config.split(","))
        for label in args.dtypes:
            dtype, tf32 = DTYPES[label]
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.manual_seed(0)
            layer = sn.RecurrentNeuronLayer(sn.models.LIF(tau=10.0), size, backend="cuda")
            layer = layer.to(device="cuda", dtype=dtype)
            x = _input(layer, (LENGTH, batch, size), dtype)
            found = {}
            for product in ("fma", "mma"):
                rows.TENSOR_CORES = product == "mma"
                found[product] = _measure(layer, x, timer, args.reps)
            fma, mma = found["fma"].pop("weight_grad"), found["mma"].pop("weight_grad")
            apart = float((fma - mma).abs().max() / fma.abs().max())
            row = {"batch": batch, "size": size, "dtype": label, "grad_apart": apart}
            row |= {f"{p}_{k}": v for p, m in found.items() for k, v in m.items()}
            rows_out.append(row)
            core.log(
                f"{batch} x {size} {label}: layer fma {row['fma_layer_ms']:.2f} mma "
                f"{row['mma_layer_ms']:.2f} ms; forward fma {row['fma_forward_ms']:.2f} "
                f"mma {row['mma_forward_ms']:.2f} ms; backward fma {row['fma_backward_ms']:.2f} "
                f"mma {row['mma_backward_ms']:.2f} ms; weight gradients apart {apart:.1e}"
            )
    torch.backends.cuda.matmul.allow_tf32 = False
    rows.TENSOR_CORES = True
    meta = {"device": core.device_info(torch.device("cuda")), "versions": core.versions()}
    if args.out:
        core.write_json(Path(args.out), {"meta": meta, "rows": rows_out})


if __name__ == "__main__":
    main()
