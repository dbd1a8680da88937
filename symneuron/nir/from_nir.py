"""Load: a ``nir.NIRGraph`` -> a :class:`~symneuron.nir.Graph` of torch and symneuron layers."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from .modules import Graph, PerStep, Scale
from .neurons import NEURON_NODES, from_node
from .recurrent import layer_of, loops, subgraph_layer

__all__ = ["module_of"]

_LOADED = (
    "Input, Output, Affine, Linear, Scale, Conv1d, Conv2d, Flatten, SumPool2d, AvgPool2d, "
    "IF, LIF, CubaLIF, LI, I, CubaLI, Threshold, nested NIRGraph, and a spiking neuron fed "
    "back through an Affine/Linear node (a RecurrentNeuronLayer)"
)


def _tensor(array: Any, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(np.array(array, dtype=np.float64)).to(dtype)


def _linear(node: Any, dtype: torch.dtype) -> nn.Module:
    weight = np.asarray(node.weight)
    if weight.ndim != 2:
        raise ValueError(f"Affine/Linear weights must be 2-D, got shape {weight.shape}.")
    bias = getattr(node, "bias", None)
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=dtype)
    with torch.no_grad():
        layer.weight.copy_(_tensor(weight, dtype))
        if bias is not None:
            layer.bias.copy_(_tensor(np.broadcast_to(bias, weight.shape[:1]), dtype))
    return layer


def _conv(node: Any, dtype: torch.dtype) -> nn.Module:
    weight = np.asarray(node.weight)
    kind = nn.Conv1d if weight.ndim == 3 else nn.Conv2d
    padding = node.padding if isinstance(node.padding, str) else tuple(np.atleast_1d(node.padding))
    layer = kind(
        weight.shape[1] * int(node.groups),
        weight.shape[0],
        tuple(weight.shape[2:]),
        stride=tuple(np.atleast_1d(node.stride).tolist()),
        padding=padding,
        dilation=tuple(np.atleast_1d(node.dilation).tolist()),
        groups=int(node.groups),
        dtype=dtype,
    )
    with torch.no_grad():
        layer.weight.copy_(_tensor(weight, dtype))
        assert layer.bias is not None
        layer.bias.copy_(_tensor(node.bias, dtype))
    return layer


def _pool(node: Any, divisor: int | None) -> nn.Module:
    def pair(value: Any) -> tuple[int, int]:
        flat = np.broadcast_to(np.asarray(value, dtype=np.int64).ravel(), (2,))
        return int(flat[0]), int(flat[1])

    return nn.AvgPool2d(
        pair(node.kernel_size), pair(node.stride), pair(node.padding), divisor_override=divisor
    )


def _flatten(node: Any) -> nn.Module:
    end = node.end_dim + 1 if node.end_dim >= 0 else node.end_dim
    return nn.Flatten(node.start_dim + 1, end)


def _stateless(kind: str, node: Any, dtype: torch.dtype) -> nn.Module | None:
    if kind in ("Affine", "Linear"):
        return _linear(node, dtype)
    if kind in ("Conv1d", "Conv2d"):
        return _conv(node, dtype)
    if kind in ("SumPool2d", "AvgPool2d"):
        return _pool(node, 1 if kind == "SumPool2d" else None)
    if kind == "Flatten":
        return _flatten(node)
    if kind == "Scale":
        return Scale(_tensor(node.scale, dtype))
    return None


def _node_module(
    node: Any, path: str, dt: float, method: str, backend: str, dtype: torch.dtype
) -> nn.Module | None:
    """The module of one NIR node (``None`` for Input and Output)."""
    kind = type(node).__name__
    if kind in ("Input", "Output"):
        return None
    if kind == "NIRGraph":
        inner = module_of(node, dt, method, backend, dtype, where=f"{path}.")
        recurrent = subgraph_layer(inner)  # snnTorch's RLeaky/RSynaptic: the layer itself
        return inner if recurrent is None else recurrent
    if kind in NEURON_NODES:
        return from_node(node, dt, method, backend, dtype)
    layer = _stateless(kind, node, dtype)
    if layer is None:
        raise ValueError(
            f"NIR node {path!r} of type {kind} cannot be loaded; symneuron.nir loads {_LOADED}."
        )
    return PerStep(layer)


def module_of(
    graph: Any, dt: float, method: str, backend: str, dtype: torch.dtype, where: str = ""
) -> Graph:
    """The module running ``graph`` (see :func:`symneuron.nir.load`)."""
    recurrent = loops(graph, where)  # neuron node -> its recurrent Affine/Linear node
    modules: dict[str, nn.Module | None] = {}
    for name, node in graph.nodes.items():
        if name in recurrent:
            weight = graph.nodes[recurrent[name]]
            modules[name] = layer_of(node, weight, dt, method, backend, dtype)
        elif name not in recurrent.values():
            modules[name] = _node_module(node, f"{where}{name}", dt, method, backend, dtype)
    cycle = {(n, w) for n, w in recurrent.items()} | {(w, n) for n, w in recurrent.items()}
    edges = [(str(src), str(dst)) for src, dst in graph.edges]
    return Graph(modules, [edge for edge in edges if edge not in cycle])
