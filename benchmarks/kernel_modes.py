"""``bench_neurons.py --sweep`` and ``--overhead``: the kernels alone, and the host time of
a small training call taken apart. Both run in this process and print text.

* ``--sweep block,lanes,surrogate``: each row times the generated forward (training
  variant) and backward kernels back to back between CUDA events (no autograd, no host
  overhead; T = 64, N = 2^20), in floor bytes per second, with
  ``symneuron.runtime.settings`` (``cuda_block``, ``max_lanes``) set for the row, or one
  surrogate form per row.
* ``--overhead``: symneuron's calls, torch's own floor, the kernel launches alone and in a
  bare ``autograd.Function`` (300 pipelined calls each), then a torch profile (the
  autograd nodes) and a cProfile (the calling thread's Python) of the training call.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import bench_neurons as bn
import floor
from core import Timer, torch_dtype

Row = tuple[str, dict[str, Any], dict[str, Any]]


class Local:
    """The device, backend and timer of an in-process mode."""

    def __init__(self, dry_run: bool) -> None:
        import torch

        self.torch = torch
        self.device = torch.device("cpu" if dry_run else "cuda")
        self.backend = "cpu" if dry_run else "cuda"
        self.timer = Timer(self.device)
        print(f"# {'CPU dry run' if dry_run else torch.cuda.get_device_name()}", flush=True)

    def program(self, neuron: Any) -> Any:
        """The compiled kernels of ``neuron`` (``symneuron.runtime.kernels.program``)."""
        from symneuron.runtime import kernels

        return kernels.program(neuron, self.backend)

    def params(self, neuron: Any, n: int, dtype: Any) -> list[Any]:
        """One [N] tensor per param, in the compute dtype (float32 for 16-bit storage)."""
        torch = self.torch
        compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        values = [float(v) for v in neuron.params.values()]
        return [torch.full((), v, dtype=compute, device=self.device).expand(n) for v in values]

    def launches(self, neuron: Any, x: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
        """The training forward and the backward of ``neuron`` on ``x``, as direct kernel
        launches (dL/dS a stride-0 broadcast, as after ``spikes.sum()``)."""
        program = self.program(neuron)
        params = self.params(neuron, x.shape[1], x.dtype)
        grad = self.torch.ones((), device=self.device, dtype=x.dtype).expand(*x.shape)
        x_saved = x if program.needs_x else None
        first = program.forward(x, None, None, params, True, "last")
        h, wt = first.h_seq, first.wt_seq

        def forward() -> Any:
            return program.forward(x, None, None, params, True, "last")

        def backward() -> Any:
            return program.backward(grad, None, None, h, wt, x_saved, None, None, params, "none")

        return forward, backward


def kernel_times(local: Local, neuron: Any, dtype: Any, t_len: int, n: int) -> str:
    """The forward (training variant) and backward kernels' times and rates, in floor
    bytes per second (dL/dS is a stride-0 broadcast the backward does not read)."""
    from symneuron import derivation

    x = local.torch.rand(t_len, n, device=local.device, dtype=dtype) * 1.5
    forward, backward = local.launches(neuron, x)
    k = derivation.derive(neuron).saved_states  # as floor.extra_states
    size = x.element_size() * t_len * n
    passes = [("fwd", forward, floor.tensors("forward", k))]
    passes += [("bwd", backward, floor.tensors("backward", k, grad_spike_read=False))]
    out = []
    for label, call, tensors in passes:
        sec = local.timer.back_to_back(call, 20)
        out.append(f"{label} {sec * 1e6:7.1f}us {tensors * size / sec / 1e9:6.0f}GB/s")
    return "  ".join(out)


@contextlib.contextmanager
def runtime_settings(**values: Any) -> Iterator[None]:
    """Set attributes of ``symneuron.runtime.settings`` for a block, restored afterwards."""
    from symneuron.runtime import settings

    old = {name: getattr(settings, name) for name in values}
    try:
        for name, value in values.items():
            setattr(settings, name, value)
        yield
    finally:
        for name, value in old.items():
            setattr(settings, name, value)


def sigmoid_exp(alpha: float = bn.SURROGATE_ALPHA) -> Any:
    """The Sigmoid surrogate's function written piecewise with exp (never overflowing)."""
    import sympy as sp

    import symneuron as sn

    u, a = sn.surrogate.u, sp.Float(alpha)
    primitive = sp.Piecewise(
        (1 / (1 + sp.exp(-a * u)), u >= 0), (sp.exp(a * u) / (1 + sp.exp(a * u)), True)
    )
    return sn.surrogate.Surrogate(primitive, u, name=f"SigmoidExp(alpha={alpha})")


def sweep_rows(name: str) -> list[Row]:
    """(label, ``symneuron.runtime.settings`` values, neuron constructor args) per row."""
    import symneuron as sn

    if name == "block":
        return [(f"block={b}", {"cuda_block": b}, {}) for b in (128, 256, 512, 1024)]
    if name == "lanes":
        return [(f"max_lanes={k}", {"max_lanes": k}, {}) for k in (None, 4, 2, 1)]
    forms = [("Sigmoid(tanh)", sn.surrogate.Sigmoid()), ("Sigmoid(exp)", sigmoid_exp())]
    return [(label, {}, {"surrogate": s}) for label, s in [*forms, ("ATan", sn.surrogate.ATan())]]


def sweep_main(args: argparse.Namespace) -> int:
    """Kernel-only sweeps: each row times one kernel back to back between CUDA events."""
    local = Local(args.dry_run)
    t_len = (args.T or [8 if args.dry_run else 64])[0]
    n = (args.N or [2**10 if args.dry_run else 2**20])[0]
    models = args.models or ["LIF", "QIF", "PLIF", "EIF"]
    dtypes = args.dtypes or (["fp32"] if args.dry_run else ["fp32", "bf16"])
    print(f"# kernel-only, T={t_len} N={n}; GB/s = floor bytes / time", flush=True)
    for name in args.sweep:
        for label, settings, ctor_kw in sweep_rows(name):
            for dtype in dtypes:
                for model in models:
                    try:
                        with runtime_settings(**settings):
                            neuron = bn.make_neuron(model, **ctor_kw)
                            res = kernel_times(local, neuron, torch_dtype(dtype), t_len, n)
                    except Exception as exc:  # noqa: BLE001  e.g. too many registers per block
                        res = f"failed: {type(exc).__name__}: {exc}"[:200]
                    print(f"{label:14} {dtype:5} {model:10} {res}", flush=True)
    return 0


def overhead_parts(local: Local, neuron: Any, x: Any) -> dict[str, Callable[[], Any]]:
    """The calls whose host time ``--overhead`` prints, by name."""
    import symneuron as sn

    torch, x0 = local.torch, x.detach()

    def simulate(inp: Any) -> Any:
        return sn.simulate(neuron, inp, backend=local.backend, store_v_seq=False)[0]

    def train(out: Any) -> None:
        x.grad = None
        out.sum().backward()

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, a: Any) -> Any:
            return a * 2.0

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return g * 2.0

    forward, backward = local.launches(neuron, x0)
    program, params = local.program(neuron), local.params(neuron, x.shape[1], x.dtype)

    class Launches(torch.autograd.Function):
        """The two kernel launches in the barest autograd.Function (no argument checks)."""

        @staticmethod
        def forward(ctx: Any, a: Any) -> Any:
            out = program.forward(a, None, None, params, True, "last")
            spike, v_out, h_seq, ctx.wt = out.spike_seq, out.v_seq, out.h_seq, out.wt_seq
            ctx.save_for_backward(h_seq, a)
            return spike, v_out

        @staticmethod
        def backward(ctx: Any, g: Any, _gv: Any) -> Any:
            h_seq, a = ctx.saved_tensors
            a = a if program.needs_x else None
            return program.backward(
                g, None, None, h_seq, ctx.wt, a, None, None, params, "none"
            ).grad_x_seq

    return {
        "symneuron training": lambda: train(simulate(x)),
        "symneuron forward, grad": lambda: simulate(x),
        "symneuron inference": torch.no_grad()(lambda: simulate(x0)),
        "torch (x*2).sum().backward()": lambda: train(x * 2.0),
        "torch x*2": lambda: x * 2.0,
        "torch.empty": lambda: torch.empty(*x.shape, device=local.device),
        "trivial autograd.Function": lambda: train(Double.apply(x)),
        "kernels: forward launch": forward,
        "kernels: backward launch": backward,
        "kernels in a bare autograd.Function": lambda: train(Launches.apply(x)[0]),
    }


def overhead_main(args: argparse.Namespace) -> int:
    """Where a small training call's host time goes (see the module docstring)."""
    import cProfile
    import pstats

    local = Local(args.dry_run)
    torch = local.torch
    neuron = bn.make_neuron((args.models or ["LIF"])[0])
    t_len, n = (args.T or [4])[0], (args.N or [2**14])[0]
    x = torch.rand(t_len, n, device=local.device).requires_grad_()
    parts = overhead_parts(local, neuron, x)
    for name, call in parts.items():
        try:
            us = local.timer.back_to_back(call, 300, host=True) * 1e6
            print(f"{name:36} {us:8.1f} us/call", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"{name:36} failed: {type(exc).__name__}: {exc}"[:200], flush=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    activities += [torch.profiler.ProfilerActivity.CUDA] if local.timer.cuda else []
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(20):
            parts["symneuron training"]()
        local.timer.sync()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25), flush=True)
    profile = cProfile.Profile()
    profile.runcall(
        lambda: ([parts["symneuron training"]() for _ in range(200)], local.timer.sync())
    )
    pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(20)
    return 0


def main(args: argparse.Namespace) -> int:
    return sweep_main(args) if args.sweep else overhead_main(args)
