"""Kernel-only tuning sweeps on one GPU (no host overhead, no peers).

Each row times one generated kernel back to back between CUDA events (20 launches,
after 3 warm-up launches) at T = 64, N = 2^20 and prints its time and its rate in
minimal bytes per second (forward: read X, write S and H; backward: read H, write
dL/dX; dL/dS is a stride-0 broadcast and is not read).

Sweeps (``--sweep``):

- ``block``: threads per block (the launcher's ``BLOCK``) for fp32 and bf16;
- ``lanes``: neurons per thread for 16-bit types (the dialect's ``lanes``);
- ``surrogate``: the backward's cost per surrogate form, at equal traffic: the Sigmoid
  surrogate as written in the zoo (tanh form), the same function in a piecewise exp form,
  and ATan (rational) -- how much of a 16-bit backward is arithmetic.

Usage (on the device machine): ``python3 benchmarks/tune_kernels.py --sweep block,surrogate``
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

import sympy as sp
import torch

import symneuron as sn
from symneuron import function as F
from symneuron.codegen import cuda as cuda_dialect
from symneuron.runtime import cuda as cuda_runtime

T_LEN, N = 64, 2**20


def _time(fn: Callable[[], object], reps: int = 20) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps / 1e3


def kernel_times(neuron: sn.Neuron, dtype: torch.dtype) -> str:
    """Forward (training variant) and backward kernel times for ``neuron``."""
    key = F.register(neuron)
    x = torch.rand(T_LEN, N, device="cuda", dtype=dtype) * 1.5
    params = [
        torch.full((), float(neuron.params[p]), device="cuda", dtype=F.compute_dtype(dtype)).expand(
            N
        )
        for p in neuron.params
    ]
    w_init = None

    def forward() -> tuple[torch.Tensor, ...]:
        return F.forward_impl(key, "cuda", x, None, w_init, params, True, "last")

    _, _, h, _, wt = forward()
    grad = torch.ones((), device="cuda", dtype=dtype).expand(T_LEN, N)
    x_saved = x if neuron.spec().needs_x else None

    def backward() -> tuple[torch.Tensor, ...]:
        return F.backward_impl(
            key, "cuda", grad, None, None, "none", h, wt, x_saved, None, None, params
        )

    out = []
    element = x.element_size() * T_LEN * N
    for label, fn, nbytes in (("fwd", forward, 3 * element), ("bwd", backward, 2 * element)):
        sec = _time(fn)
        out.append(f"{label} {sec * 1e6:7.1f}us {nbytes / sec / 1e9:6.0f}GB/s")
    return "  ".join(out)


def sweep_block(models: list[str]) -> None:
    for block in (128, 256, 512, 1024):
        cuda_runtime.BLOCK = block
        for dtype in (torch.float32, torch.bfloat16):
            for model in models:
                try:
                    res = kernel_times(sn.models.ZOO[model](), dtype)
                except Exception as exc:  # noqa: BLE001 - e.g. too many registers for the block
                    res = f"launch failed: {exc}"
                print(f"block={block:4} {str(dtype)[6:]:8} {model:5} {res}", flush=True)
    cuda_runtime.BLOCK = 256


def sweep_lanes(models: list[str]) -> None:
    base = dict(cuda_dialect.CUDA_DTYPES)
    for lanes in (8, 4, 2):
        cuda_dialect.CUDA_DTYPES["bfloat16"] = dataclasses.replace(base["bfloat16"], lanes=lanes)
        F._MODULES.clear()
        for model in models:
            res = kernel_times(sn.models.ZOO[model](), torch.bfloat16)
            print(f"lanes={lanes} bfloat16 {model:5} {res}", flush=True)
    cuda_dialect.CUDA_DTYPES.update(base)
    F._MODULES.clear()


def sigmoid_exp(alpha: float = 4.0) -> sn.surrogate.Surrogate:
    """The Sigmoid surrogate's function written piecewise with exp (never overflowing)."""
    u = sn.surrogate.u
    a = sp.Float(alpha)
    primitive = sp.Piecewise(
        (1 / (1 + sp.exp(-a * u)), u >= 0), (sp.exp(a * u) / (1 + sp.exp(a * u)), True)
    )
    return sn.surrogate.Surrogate(primitive, u, name=f"SigmoidExp(alpha={alpha})")


def sweep_surrogate(models: list[str]) -> None:
    forms = {
        "Sigmoid(tanh)": sn.surrogate.Sigmoid(),
        "Sigmoid(exp)": sigmoid_exp(),
        "ATan": sn.surrogate.ATan(),
    }
    for dtype in (torch.float32, torch.bfloat16):
        for model in models:
            for label, surrogate in forms.items():
                neuron = sn.models.ZOO[model](surrogate=surrogate)
                res = kernel_times(neuron, dtype)
                print(f"{label:14} {str(dtype)[6:]:8} {model:5} {res}", flush=True)


SWEEPS = {"block": sweep_block, "lanes": sweep_lanes, "surrogate": sweep_surrogate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", default="block,surrogate", help=f"any of {list(SWEEPS)}")
    parser.add_argument("--models", default="LIF,QIF,PLIF,EIF")
    args = parser.parse_args()
    models = args.models.split(",")
    print(f"# {torch.cuda.get_device_name()}  T={T_LEN} N={N}", flush=True)
    for name in args.sweep.split(","):
        SWEEPS[name](models)


if __name__ == "__main__":
    main()
