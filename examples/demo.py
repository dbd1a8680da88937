"""symneuron in one script: define a neuron in SymPy, verify it, train an SNN with it.

1. A custom neuron: a leaky neuron driven through a saturating (tanh) input,
   with a learnable time constant and gain. Nothing but its charge equation.
2. The derivatives SymPy derived for it, and ``sn.check``'s verification of
   those derivatives and of the compiled kernels against the torch reference.
3. A two-layer spiking network trained on a synthetic rate-coded task (T = 8),
   on the CPU with ``backend="auto"`` (generated C kernels when a C compiler
   exists, else the torch reference).
4. The first lines of the CUDA kernel generated from the same equation.

Runs in well under 30 s on two CPU cores::

    python3 examples/demo.py
"""

from __future__ import annotations

import time

import sympy as sp
import torch
from torch import nn

import symneuron as sn
from symneuron.simulate import resolve_backend

# -- 1. The neuron: H[t] = V[t-1] - V[t-1]/tau + g * tanh(X[t]) -----------------------

V, X = sn.V, sn.X
tau, g = sp.symbols("tau g", positive=True)

neuron = sn.Neuron(
    V - V / tau + g * sp.tanh(X),
    params={tau: 2.0, g: 1.0},
    learnable=[tau, g],
    v_threshold=1.0,
    v_reset=0.0,
    surrogate=sn.surrogate.ATan(alpha=2.0),
    name="TanhLIF",
)


def show_neuron() -> None:
    print(neuron, "\n")
    print("Derived partials of the charge H = f(V, X; tau, g):")
    for name, expr in neuron.derivatives().items():
        print(f"  {name:8s} = {expr}")
    spec = neuron.spec()
    print(f"Backward needs V[t-1]: {spec.needs_v}, needs X[t]: {spec.needs_x}\n")


def show_check() -> None:
    report = sn.check(neuron, seed=0)
    print(report, "\n")
    assert report.passed, "the generated kernels disagree with the reference"


# -- 2. A synthetic task: which of four rate patterns produced this spike train? -------

T, INPUTS, HIDDEN, CLASSES = 8, 32, 64, 4


def make_dataset(
    n: int, prototypes: torch.Tensor, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rate-coded inputs [T, n, INPUTS] (0/1) and labels [n].

    ``prototypes`` [CLASSES, INPUTS] holds each class's firing probability per
    input channel; a sample is a Bernoulli spike train from its class's
    prototype plus noise.
    """
    labels = torch.randint(CLASSES, (n,), generator=gen)
    rates = (prototypes[labels] + 0.3 * torch.rand(n, INPUTS, generator=gen)).clamp(0, 1)
    spikes = torch.rand(T, n, INPUTS, generator=gen) < 0.6 * rates
    return spikes.float(), labels


class SNN(nn.Module):
    """Linear -> spiking layer -> Linear -> spiking layer; logits = output spike rates."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(INPUTS, HIDDEN)
        self.sn1 = sn.NeuronLayer(neuron, backend="auto")
        self.fc2 = nn.Linear(HIDDEN, CLASSES)
        self.sn2 = sn.NeuronLayer(neuron, backend="auto")

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        self.sn1.reset()  # each batch is a fresh sequence: forget the membrane state
        self.sn2.reset()
        out = self.sn2(self.fc2(self.sn1(self.fc1(x_seq))))  # [T, batch, CLASSES]
        return out.mean(0)  # firing rate per class


def accuracy(model: SNN, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def train() -> float:
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    prototypes = torch.rand(CLASSES, INPUTS, generator=gen)
    x_train, y_train = make_dataset(2048, prototypes, gen)
    x_test, y_test = make_dataset(512, prototypes, gen)
    model = SNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    backend = resolve_backend("auto", x_train.device)
    print(f"Training on {x_train.shape[1]} samples, T={T}, backend='auto' -> {backend!r}")
    print(f"  step  0  test accuracy {accuracy(model, x_test, y_test):.3f} (chance 0.25)")
    batch = 128
    for step in range(1, 61):
        idx = torch.randint(x_train.shape[1], (batch,), generator=gen)
        rates = model(x_train[:, idx])
        loss = nn.functional.mse_loss(rates, nn.functional.one_hot(y_train[idx], CLASSES).float())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            acc = accuracy(model, x_test, y_test)
            print(f"  step {step:2d}  loss {loss.item():.4f}  test accuracy {acc:.3f}")
    print(f"  learned tau per layer: {model.sn1.tau.item():.3f}, {model.sn2.tau.item():.3f}")
    print(f"  learned g   per layer: {model.sn1.g.item():.3f}, {model.sn2.g.item():.3f}\n")
    return acc


# -- 3. The CUDA source generated from the same equation -------------------------------


def show_cuda_source(lines: int = 30) -> None:
    source = neuron.source("cuda", "float32")
    start = source.index("template <int K>\n__device__ __forceinline__ void TanhLIF_forward_h")
    print(f"Generated CUDA (float32), first {lines} lines of the forward kernel:")
    print("\n".join(source[start:].splitlines()[:lines]))
    print(f"... ({len(source.splitlines())} lines in all: every forward and backward variant)")


def main() -> None:
    begin = time.perf_counter()
    show_neuron()
    show_check()
    final = train()
    show_cuda_source()
    print(f"\nfinal test accuracy {final:.3f}; {time.perf_counter() - begin:.1f} s after imports")


if __name__ == "__main__":
    main()
