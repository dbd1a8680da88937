"""Tuning sweep: lanes per thread and t-unroll for 16-bit kernels (GPU throughput only)."""

from __future__ import annotations

import dataclasses

import torch

import symneuron as sn
from symneuron import function as F
from symneuron.codegen import cuda as cuda_dialect
from symneuron.codegen import kernels


def run(name: str, dtype: torch.dtype, t_len: int = 64, n: int = 2**20) -> str:
    neuron = sn.models.ZOO[name]()
    key = F.register(neuron)
    x = torch.rand(t_len, n, device="cuda", dtype=dtype) * 1.5
    params = [
        torch.full((), neuron.params[p], device="cuda", dtype=F.compute_dtype(dtype)).expand(n)
        for p in neuron.params
    ]
    _, _, h = F.forward_impl(key, "cuda", x, None, params, True, "last")
    g = torch.ones((), device="cuda", dtype=dtype).expand(t_len, n)
    out = []
    for label, fn in {
        "fwd": lambda: F.forward_impl(key, "cuda", x, None, params, True, "last"),
        "bwd": lambda: F.backward_impl(key, "cuda", g, None, "none", h, x, None, params),
    }.items():
        for _ in range(3):
            fn()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(20):
            fn()
        e.record()
        e.synchronize()
        sec = s.elapsed_time(e) / 20 / 1e3
        nbytes = (3 if label == "fwd" else 2) * x.element_size() * t_len * n
        out.append(f"{label} {sec * 1e6:7.1f}us {nbytes / sec / 1e9:6.0f}GB/s")
    return "  ".join(out)


def main() -> None:
    base = dict(cuda_dialect.CUDA_DTYPES)
    for unroll in ("(K == 1 ? 8 : 4)", "2"):
        kernels.T_UNROLL = unroll
        for lanes in (8, 4, 2):
            for dt_name in ("bfloat16", "float32"):
                if dt_name == "float32" and lanes == 8:
                    continue
                cuda_dialect.CUDA_DTYPES[dt_name] = dataclasses.replace(base[dt_name], lanes=lanes)
                F._MODULES.clear()
                for model in ("LIF", "QIF", "PLIF", "EIF"):
                    res = run(model, getattr(torch, dt_name))
                    tag = f"unroll={unroll:16} lanes={lanes} {dt_name:8} {model:4}"
                    print(tag, res, flush=True)
        cuda_dialect.CUDA_DTYPES.update(base)


if __name__ == "__main__":
    main()
