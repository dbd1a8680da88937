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
