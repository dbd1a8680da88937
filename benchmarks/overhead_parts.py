"""Where a small training call's host time goes: forward, backward, and torch's own floor."""

from __future__ import annotations

import time

import torch

import symneuron as sn


def per_call(fn, reps: int = 300) -> float:  # type: ignore[no-untyped-def]
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def main() -> None:
    neuron = sn.models.LIF()
    x = torch.rand(4, 2**14, device="cuda").requires_grad_()
    x0 = x.detach()

    def sym_train() -> None:
        s, _ = sn.simulate(neuron, x, backend="cuda", store_v_seq=False)
        s.sum().backward()

    def sym_forward_grad() -> None:
        sn.simulate(neuron, x, backend="cuda", store_v_seq=False)

    def sym_infer() -> None:
        sn.simulate(neuron, x0, backend="cuda", store_v_seq=False)

    def torch_mul_train() -> None:
        (x * 2.0).sum().backward()

    def torch_mul_forward() -> None:
        x * 2.0

    def torch_empty() -> None:
        torch.empty(4, 2**14, device="cuda")

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):  # type: ignore[no-untyped-def]
            return a * 2.0

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            return g * 2.0

    def python_fn_train() -> None:
        Double.apply(x).sum().backward()

    from symneuron import function as F

    key = F.register(neuron)
    params = [torch.full((), 2.0, device="cuda").expand(2**14)]
    _, _, h, _, wt = F.forward_impl(key, "cuda", x0, None, None, params, True, "last")
    g = torch.ones((), device="cuda").expand(4, 2**14)

    def backward_impl_direct() -> None:
        F.backward_impl(key, "cuda", g, None, None, "none", h, wt, None, None, None, params)

    def forward_impl_direct() -> None:
        F.forward_impl(key, "cuda", x0, None, None, params, True, "last")

    class Launches(torch.autograd.Function):
        """symneuron's two launches in the barest autograd.Function (no simulate, no
        _gradients): what the binding's own Python costs on top."""

        @staticmethod
        def forward(ctx, a):  # type: ignore[no-untyped-def]
            spike, v_out, h_seq, _, _ = F._forward_launch(
                key, "cuda", a, None, None, params, True, "last"
            )
            ctx.save_for_backward(h_seq)
            return spike, v_out

        @staticmethod
        def backward(ctx, g, _gv):  # type: ignore[no-untyped-def]
            (h_seq,) = ctx.saved_tensors
            out = F._backward_launch(
                key, "cuda", g, None, None, "none", h_seq, None, None, None, None, params
            )
            return out[0]

    def launches_train() -> None:
        Launches.apply(x)[0].sum().backward()

    inner: list[float] = []
    original = F._EagerBinding.backward

    def timed_backward(ctx, *grads):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = original(ctx, *grads)
        inner.append(time.perf_counter() - t0)
        return out

    def sym_train_inner() -> None:
        sym_train()

    fns = [sym_train, sym_forward_grad, sym_infer, torch_mul_train, torch_mul_forward]
    fns += [torch_empty, python_fn_train, backward_impl_direct, forward_impl_direct]
    fns += [launches_train]
    for fn in fns:
        print(f"{fn.__name__:22} {per_call(fn):8.1f} us/call", flush=True)
    F._EagerBinding.backward = staticmethod(timed_backward)  # type: ignore[method-assign]
    total = per_call(sym_train_inner)
    F._EagerBinding.backward = staticmethod(original)  # type: ignore[method-assign]
    inner_us = sorted(inner)[len(inner) // 2] * 1e6
    print(f"sym_train (timed)      {total:8.1f} us/call, inside the Python backward {inner_us:.1f}")
    torch.cuda.synchronize()
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        for _ in range(20):
            sym_train()
        torch.cuda.synchronize()
    print(
        prof.key_averages().table(sort_by="cpu_time_total", row_limit=30, max_name_column_width=60)
    )


if __name__ == "__main__":
    main()
