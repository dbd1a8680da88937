"""A new neuron in ten lines, verified automatically.

The "SiLU-leak" neuron leaks only above rest: its leak current is the SiLU
V·sigmoid(βV), close to 0 for V < 0 and close to V for V > 0, so inhibition
is remembered while excitation decays. β (the knee's sharpness) and τ are
learnable, and the spike's surrogate gradient is a custom fast sigmoid.

This script

1. defines the neuron (the ten lines below: no CUDA, no derivative, no autograd),
2. verifies it with ``sn.check`` in float64 and float32,
3. puts it in a ``NeuronLayer`` with per-channel learnable τ and β on a
   [T, batch, C, H, W] input, and compares the compiled layer with the torch
   reference layer, outputs and gradients.

Run::

    python3 examples/custom_neuron.py
"""

from __future__ import annotations

import sympy as sp
import torch

import symneuron as sn

# -- the neuron -----------------------------------------------------------------------
V, X = sn.V, sn.X
beta, tau = sp.symbols("beta tau", positive=True)
x = sp.Symbol("x", real=True)  # not positive=True: SymPy would simplify Abs(x) to x
fast_sigmoid = sn.surrogate.Surrogate(x / (1 + 2 * sp.Abs(x)) / 2 + 0.5, x, name="FastSigmoid")
silu_leak = sn.Neuron(
    V + (X - V / (1 + sp.exp(-beta * V))) / tau,  # H[t] = f(V[t-1], X[t]; beta, tau)
    params={beta: 4.0, tau: 2.0},
    learnable=[beta, tau],
    v_reset=None,  # soft reset: V = H - v_threshold * S
    surrogate=fast_sigmoid,
    name="SiLULeak",
)
# -------------------------------------------------------------------------------------


def show_and_check() -> None:
    print(silu_leak, "\n")
    for name, expr in silu_leak.derivatives().items():
        print(f"  {name:9s} = {expr}")
    print(f"  surrogate' = {silu_leak.surrogate.derivative()}\n")
    for dtype in (torch.float64, torch.float32):
        report = sn.check(silu_leak, dtype=dtype, seed=1)
        print(report, "\n")
        assert report.passed


def run_layer(backend: str, x_seq: torch.Tensor, channels: int) -> dict[str, torch.Tensor]:
    """Spikes and gradients of one NeuronLayer with per-channel tau and beta."""
    layer = sn.NeuronLayer(
        silu_leak,
        backend=backend,
        params={
            "tau": torch.linspace(1.5, 3.0, channels).view(channels, 1, 1),
            "beta": torch.full((channels, 1, 1), 4.0),
        },
    )
    x = x_seq.clone().requires_grad_(True)
    spikes = layer(x)
    (spikes.mean() + layer.v.square().mean()).backward()
    grads = {"x.grad": x.grad, "tau.grad": layer.tau.grad, "beta.grad": layer.beta.grad}
    return {"spikes": spikes.detach(), **grads}


def per_channel_layer() -> None:
    T, B, C, H, W = 8, 4, 3, 5, 5
    x_seq = 0.8 + torch.randn(T, B, C, H, W, generator=torch.Generator().manual_seed(0))
    got = run_layer("auto", x_seq, C)
    ref = run_layer("torch", x_seq, C)
    print(f"NeuronLayer on x_seq {list(x_seq.shape)}, spike rate {got['spikes'].mean():.3f}")
    for name, value in got.items():
        err = float((value - ref[name]).abs().max() / ref[name].abs().max())
        print(f"  {name:9s} shape {list(value.shape)!s:17s} max rel. diff vs torch {err:.1e}")
    assert torch.equal(got["spikes"], ref["spikes"])
    print(f"  per-channel tau.grad: {got['tau.grad'].flatten().tolist()}")


if __name__ == "__main__":
    show_and_check()
    per_channel_layer()
