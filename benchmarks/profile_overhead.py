"""Host overhead of one training call on the cuda backend: timing and a cProfile."""

from __future__ import annotations

import cProfile
import pstats
import time

import torch

import symneuron as sn


def main() -> None:
    neuron = sn.models.LIF()
    x = torch.rand(4, 2**14, device="cuda").requires_grad_()

    def train() -> None:
        s, _ = sn.simulate(neuron, x, backend="cuda", store_v_seq=False)
        s.sum().backward()

    def infer() -> None:
        with torch.no_grad():
            sn.simulate(neuron, x, backend="cuda", store_v_seq=False)

    for fn in (train, infer):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(300):
            fn()
        torch.cuda.synchronize()
        print(f"{fn.__name__}: {(time.perf_counter() - t0) / 300 * 1e6:.1f} us/call (pipelined)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        train()
    torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()


def kernel_only(
    name: str = "LIF", t_len: int = 64, n: int = 2**20, dtype: torch.dtype = torch.float32
) -> None:
    """GPU throughput of the forward and backward ops alone, K lanes vs one neuron/thread."""
    from symneuron import function as F

    neuron = sn.models.ZOO[name]()
    key = F.register(neuron)
    x = torch.rand(t_len, n, device="cuda", dtype=dtype) * 1.5
    v0 = torch.zeros(n, device="cuda", dtype=dtype)
    params = [
        torch.full((), neuron.params[p], device="cuda", dtype=F.compute_dtype(dtype)).expand(n)
        for p in neuron.params
    ]
    size = x.element_size()
    for min_threads in (F.MIN_VECTOR_THREADS, 2**40):
        F.MIN_VECTOR_THREADS = min_threads
        lanes = "K" if min_threads < 2**40 else "1"
        _, _, h = F.forward_op(key, "cuda", x, v0, params, True, "last")
        g = torch.ones((), device="cuda", dtype=dtype).expand(t_len, n)
        runs = {
            "fwd_train": lambda: F.forward_op(key, "cuda", x, v0, params, True, "last"),
            "fwd_infer": lambda: F.forward_op(key, "cuda", x, v0, params, False, "last"),
            "bwd": lambda: F.backward_op(key, "cuda", g, None, "none", h, x, v0, params),
        }
        traffic = {"fwd_train": 3 * size, "fwd_infer": 2 * size, "bwd": 2 * size}
        for label, fn in runs.items():
            for _ in range(3):
                fn()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(20):
                fn()
            e.record()
            e.synchronize()
            sec = s.elapsed_time(e) / 20 / 1e3
            gbs = traffic[label] * t_len * n / sec / 1e9
            print(
                f"{name} T={t_len} N={n} {str(dtype):15} lanes={lanes} {label:9} "
                f"{sec * 1e6:8.1f} us  {gbs:7.0f} GB/s"
            )
    F.MIN_VECTOR_THREADS = 64 * 1024


if __name__ == "__main__" and torch.cuda.is_available():
    for dt in (torch.float32, torch.bfloat16):
        for model in ("LIF", "QIF"):
            kernel_only(model, 64, 2**20, dt)
        kernel_only("LIF", 256, 2**20, dt)
    kernel_only("LIF", 64, 2**14, torch.float32)
