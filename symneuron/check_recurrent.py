"""``sn.check(recurrent=True)``: a recurrent layer of the neuron on a backend against
the same layer on the torch reference, run one step at a time in float64."""

from __future__ import annotations

import torch

from .neuron import Neuron
from .recurrent import RecurrentNeuronLayer

__all__ = ["recurrent_errors"]


def recurrent_errors(
    neuron: Neuron,
    backend: str,
    x_seq: torch.Tensor,
    readout: torch.Tensor,
    gen: torch.Generator,
) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """A recurrent layer on ``backend`` (in ``x_seq``'s dtype) and the reference's loop
    over steps in float64, both seeded alike (a noisy neuron draws one path in both):
    (comparison, backend's value, reference's value) triples."""
    size = x_seq.shape[-1]
    bound = 2 / size**0.5  # twice nn.Linear's initial range: the recurrence matters
    weight = bound * (2 * torch.rand(size, size, generator=gen, dtype=torch.float64) - 1)
    bias = 0.1 * torch.rand(size, generator=gen, dtype=torch.float64)
    seed = int(torch.randint(0, 2**62, (), generator=gen))  # both layers draw one noise path
    runs = []
    for chosen, dtype in ((backend, x_seq.dtype), ("torch", torch.float64)):
        layer = RecurrentNeuronLayer(
            neuron, size, backend=chosen, bias=True, seed=seed, dtype=dtype, device=x_seq.device
        )
        with torch.no_grad():
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)  # type: ignore[union-attr]
        x = x_seq.detach().to(dtype).requires_grad_(True)
        spikes = layer(x)
        (spikes * readout.to(dtype)).sum().backward()
        learnable = [getattr(layer.cell, name).grad for name in neuron.learnable]
        grads = [x.grad, layer.weight.grad, layer.bias.grad, *learnable]  # type: ignore[union-attr]
        runs.append([spikes.detach(), *grads])
    names = ["spikes", "grad x_seq", "grad weight", "grad bias"]
    names += [f"grad {name}" for name in neuron.learnable]
    return [
        (f"recurrent {name} vs reference loop", got.double().cpu(), want.cpu())
        for name, got, want in zip(names, *runs, strict=True)
    ]
