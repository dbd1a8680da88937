"""The torch modules a NIR graph loads into, and the two symneuron lacks elsewhere.

:class:`PerStep` runs stateless layers on every time step at once, :class:`Scale`
is NIR's elementwise scaling, :class:`Readout` is a non-spiking neuron layer that
returns V, and :class:`Graph` runs a graph of these (branches and residual adds
included) over a sequence.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..layer import NeuronLayer
from ..neuron import Neuron
from ..recurrent import RecurrentNeuronLayer

__all__ = ["PerStep", "Scale", "Readout", "Graph", "NEVER", "SUPPORTED_CYCLE"]

#: The one form of cycle :func:`symneuron.nir.load` takes, for its error messages.
SUPPORTED_CYCLE = (
    "symneuron.nir loads one form of cycle: a spiking neuron node (LIF, IF, CubaLIF, "
    "Threshold) of n neurons and an Affine or Linear node of weight [n, n] that feed each "
    "other (neuron -> w -> neuron, w with no other edges), as snnTorch's RLeaky and "
    "RSynaptic export; it loads as a symneuron.RecurrentNeuronLayer"
)

#: The threshold of a :class:`Readout`: no finite H reaches the largest float64.
NEVER = sys.float_info.max


class PerStep(nn.Module):
    """Stateless layers applied to every step: ``[T, B, ...]`` is folded to ``[T*B, ...]``.

    Examples
    --------
    >>> import torch
    >>> conv = PerStep(torch.nn.Conv2d(2, 4, 3, padding=1))
    >>> conv(torch.rand(5, 3, 2, 8, 8)).shape
    torch.Size([5, 3, 4, 8, 8])
    """

    def __init__(self, *modules: nn.Module) -> None:
        super().__init__()
        self.module = modules[0] if len(modules) == 1 else nn.Sequential(*modules)

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        steps, batch = x_seq.shape[:2]
        return self.module(x_seq.flatten(0, 1)).unflatten(0, (steps, batch))


class Scale(nn.Module):
    """y = x ⊙ scale (NIR's ``Scale``), ``scale`` broadcast over the trailing dims.

    >>> import torch
    >>> Scale(torch.tensor([1.0, 2.0]))(torch.ones(3, 2))
    tensor([[1., 2.],
            [1., 2.],
            [1., 2.]])
    """

    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scale", torch.as_tensor(scale).detach().clone())

    scale: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class Readout(nn.Module):
    """A non-spiking layer of ``neuron``: V[t] of every step, [T, *shape], is its output.

    The neuron's threshold is replaced by :data:`NEVER` (the largest float64), which no
    finite H reaches, so it never spikes or resets; it runs through the same generated
    kernels as any :class:`~symneuron.NeuronLayer` (the wrapped ``self.layer``).
    Exported to NIR as ``LI``, ``I`` or ``CubaLI``.

    Examples
    --------
    >>> import torch, symneuron as sn
    >>> readout = Readout(sn.models.LIF(tau=2.0))
    >>> readout(torch.ones(3, 1, 1)).flatten().tolist()
    [0.5, 0.75, 0.875]
    """

    def __init__(
        self,
        neuron: Neuron,
        *,
        backend: str = "auto",
        params: Mapping[Any, float | torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(neuron, Neuron):
            raise TypeError(f"neuron must be a symneuron.Neuron, got {type(neuron).__name__}")
        silent = neuron.replace(v_threshold=NEVER)
        assert isinstance(silent, Neuron)
        self.layer = NeuronLayer(silent, backend=backend, store_v_seq=True, params=params)

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        self.layer(x_seq)
        assert self.layer.v_seq is not None
        return self.layer.v_seq

    def reset(self) -> None:
        """Forget V and the extra states (call between sequences)."""
        self.layer.reset()


def _topological(names: Sequence[str], edges: Sequence[tuple[str, str]]) -> list[str]:
    """``names`` ordered so that every edge points forward; ValueError on a cycle."""
    incoming = {n: 0 for n in names}
    for _, dst in edges:
        incoming[dst] += 1
    ready = [n for n in names if incoming[n] == 0]
    order: list[str] = []
    while ready:
        node = ready.pop(0)
        order.append(node)
        for src, dst in edges:
            if src == node:
                incoming[dst] -= 1
                if incoming[dst] == 0:
                    ready.append(dst)
    if len(order) != len(names):
        cyclic = sorted(n for n in names if n not in order)
        raise ValueError(
            f"The NIR graph has a cycle through {cyclic} that is not of the recurrent form "
            f"symneuron runs. {SUPPORTED_CYCLE}. Other cycles (longer loops, a "
            "convolution or a non-spiking node in the loop) are not loaded."
        )
    return order


class Graph(nn.Module):
    """A NIR graph as a module: each node runs on the whole sequence ``[T, B, *shape]``.

    A node's input is the sum of its predecessors' outputs (NIR's edges are identity
    maps and several edges into one node add up: a residual add). ``forward`` takes
    one tensor per input node (in :attr:`inputs` order) and returns the output node's
    tensor, or a tuple when there are several.

    Parameters
    ----------
    nodes : mapping
        NIR node name -> module (``None`` for the graph's ``Input`` and ``Output`` nodes).
    edges : sequence of (source, target)
    """

    def __init__(
        self, nodes: Mapping[str, nn.Module | None], edges: Sequence[tuple[str, str]]
    ) -> None:
        super().__init__()
        unknown = sorted({n for edge in edges for n in edge} - set(nodes))
        if unknown:
            raise ValueError(f"Edges name nodes {unknown} that the graph does not have.")
        self.order = _topological(list(nodes), edges)
        self.edges = [tuple(e) for e in edges]
        self.keys = {
            name: f"n{i}_" + "".join(c if c.isalnum() else "_" for c in name)
            for i, name in enumerate(nodes)
        }
        self.nodes = nn.ModuleDict({self.keys[n]: m for n, m in nodes.items() if m is not None})
        fed = {dst for _, dst in edges}
        feeding = {src for src, _ in edges}
        self.inputs = [n for n in self.order if n not in fed]
        self.outputs = [n for n in self.order if n not in feeding]

    def node(self, name: str) -> nn.Module | None:
        """The module of NIR node ``name`` (``None`` for an Input or Output node)."""
        key = self.keys[name]
        return self.nodes[key] if key in self.nodes else None

    def forward(self, *x_seqs: torch.Tensor) -> Any:
        if len(x_seqs) != len(self.inputs):
            raise ValueError(
                f"The graph has {len(self.inputs)} inputs {self.inputs}, got {len(x_seqs)} tensors."
            )
        values: dict[str, torch.Tensor] = dict(zip(self.inputs, x_seqs, strict=True))
        for name in self.order:
            if name not in values:
                preds = [values[src] for src, dst in self.edges if dst == name]
                total = preds[0]
                for more in preds[1:]:
                    total = total + more
                module = self.node(name)
                values[name] = total if module is None else module(total)
            elif self.node(name) is not None:
                values[name] = self.node(name)(values[name])  # type: ignore[misc]
        outs = tuple(values[name] for name in self.outputs)
        return outs[0] if len(outs) == 1 else outs

    def reset(self) -> None:
        """Forget the state of every neuron layer (call between sequences)."""
        for module in self.modules():
            if isinstance(module, (NeuronLayer, RecurrentNeuronLayer)):
                module.reset()
