"""Quick kernel timing for iteration (the full comparison is bench_neurons.py).

Prints, per model/T/N/dtype/mode: GPU time (CUDA events, median), wall time per
call from an idle GPU, and the fraction of the device-to-device copy floor.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import symneuron as sn

BYTES = {"infer": 8, "train": 24}
#: constructor arguments, as in bench_neurons.py (Izhikevich with nonzero adaptation)
MODEL_KWARGS = {"Izhikevich": {"a": 0.3, "b": 0.2}}


def copy_bandwidth() -> float:
    a = torch.empty(2**28, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * a.numel() * 4 / statistics.median(times)


def step(neuron, x, mode):  # type: ignore[no-untyped-def]
    if mode == "infer":
        with torch.no_grad():
            sn.simulate(neuron, x, backend="cuda", store_v_seq=False)
    else:
        # (spikes, v) or, for a neuron with extra states, (spikes, v, states)
        s = sn.simulate(neuron, x, backend="cuda", store_v_seq=False)[0]
        s.sum().backward()


def time_config(neuron, t_len, n, dtype, mode, reps=30):  # type: ignore[no-untyped-def]
    x = torch.rand(t_len, n, device="cuda", dtype=dtype) * 1.5
    if mode == "train":
        x.requires_grad_(True)
    for _ in range(3):
        step(neuron, x, mode)
    torch.cuda.synchronize()
    gpu, wall = [], []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        s.record()
        step(neuron, x, mode)
        e.record()
        e.synchronize()
        wall.append(time.perf_counter() - t0)
        gpu.append(s.elapsed_time(e) / 1e3)
    return statistics.median(gpu), statistics.median(wall)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="LIF,PLIF,QIF,EIF,IF")
    ap.add_argument("--T", default="4,16,64,256")
    ap.add_argument("--N", default=str(2**20))
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s on {torch.cuda.get_device_name()}")
    print(
        f"{'model':10} {'T':>4} {'N':>8} {'dtype':9} {'mode':5} {'gpu_us':>9} {'wall_us':>9} "
        f"{'gpu_floor':>9} {'wall_floor':>10}"
    )
    for name in args.models.split(","):
        ctor = sn.models.ZOO.get(name) or sn.models.STATEFUL[name]
        neuron = ctor(**MODEL_KWARGS.get(name, {}))
        # each extra state adds a saved [T, N] tensor (written, then read): 8 B fp32 per state
        extra = {"infer": 0, "train": 8 * len(neuron.states)}
        for dt_name in args.dtypes.split(","):
            dtype = getattr(torch, dt_name)
            size = torch.finfo(dtype).bits // 8
            for t_len in map(int, args.T.split(",")):
                for n in map(int, args.N.split(",")):
                    for mode in ("infer", "train"):
                        gpu, wall = time_config(neuron, t_len, n, dtype, mode)
                        floor = (BYTES[mode] + extra[mode]) * size / 4 * t_len * n / bw
                        print(
                            f"{name:10} {t_len:4} {n:8} {dt_name:9} {mode:5} {gpu * 1e6:9.1f} "
                            f"{wall * 1e6:9.1f} {floor / gpu:9.2f} {floor / wall:10.2f}"
                        )


if __name__ == "__main__":
    main()
