"""Export: a torch module of symneuron layers -> a ``nir.NIRGraph``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ..layer import NeuronLayer
from ..recurrent import RecurrentNeuronLayer
from .modules import Graph, PerStep, Readout, Scale
from .neurons import to_node
from .recurrent import node_of

__all__ = ["graph_of"]

_SUPPORTED = (
    "nn.Linear, nn.Conv1d, nn.Conv2d, nn.Flatten, nn.AvgPool2d (divisor_override=1: SumPool2d), "
    "nn.Identity, symneuron.nir.Scale, symneuron.NeuronLayer, symneuron.RecurrentNeuronLayer, "
    "symneuron.nir.Readout, and nn.Sequential / symneuron.nir.PerStep / symneuron.nir.Graph "
    "of these"
)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().to(torch.float64).numpy()


def _pair(value: Any) -> np.ndarray:
    return np.array(value if isinstance(value, (tuple, list)) else (value, value))


def _conv(module: nn.Module, name: str, shape: tuple[int, ...]) -> Any:
    import nir

    assert isinstance(module, (nn.Conv1d, nn.Conv2d))
    if module.padding_mode != "zeros":
        raise ValueError(f"node {name!r}: padding_mode={module.padding_mode!r} is not in NIR.")
    bias = (
        _numpy(module.bias) if module.bias is not None else np.zeros(module.out_channels)
    )  # NIR's Conv has a bias: zeros stand in for none
    weight = _numpy(module.weight)
    if isinstance(module, nn.Conv1d):
        padding: str | int = (
            module.padding if isinstance(module.padding, str) else int(module.padding[0])
        )
        return nir.Conv1d(
            input_shape=shape[1],
            weight=weight,
            stride=module.stride[0],
            padding=padding,
            dilation=module.dilation[0],
            groups=module.groups,
            bias=bias,
        )
    padding_2d = module.padding if isinstance(module.padding, str) else tuple(module.padding)
    return nir.Conv2d(
        input_shape=tuple(shape[1:]),
        weight=weight,
        stride=tuple(module.stride),
        padding=padding_2d,
        dilation=tuple(module.dilation),
        groups=module.groups,
        bias=bias,
    )


def _pool(module: nn.AvgPool2d, name: str) -> Any:
    import nir

    if module.ceil_mode or (not module.count_include_pad and np.any(_pair(module.padding))):
        raise ValueError(
            f"node {name!r}: AvgPool2d with ceil_mode=True or count_include_pad=False "
            "is not in NIR."
        )
    kind = {None: nir.AvgPool2d, 1: nir.SumPool2d}.get(module.divisor_override)
    if kind is None:
        raise ValueError(
            f"node {name!r}: divisor_override={module.divisor_override} is not in NIR."
        )
    stride = module.kernel_size if module.stride is None else module.stride
    return kind(
        kernel_size=_pair(module.kernel_size), stride=_pair(stride), padding=_pair(module.padding)
    )


def _stateless(module: nn.Module, name: str, shape: tuple[int, ...]) -> Any:
    import nir

    if isinstance(module, nn.Linear):
        if module.bias is None:
            return nir.Linear(weight=_numpy(module.weight))
        return nir.Affine(weight=_numpy(module.weight), bias=_numpy(module.bias))
    if isinstance(module, (nn.Conv1d, nn.Conv2d)):
        return _conv(module, name, shape)
    if isinstance(module, nn.AvgPool2d):
        return _pool(module, name)
    if isinstance(module, nn.Flatten):
        if module.start_dim == 0 or module.end_dim == 0:
            raise ValueError(f"node {name!r}: a Flatten over the batch dimension is not in NIR.")
        end = module.end_dim - 1 if module.end_dim > 0 else module.end_dim
        return nir.Flatten(
            input_type={"input": np.array(shape)}, start_dim=module.start_dim - 1, end_dim=end
        )
    if isinstance(module, Scale):
        scale = module.scale
        assert isinstance(scale, torch.Tensor)
        return nir.Scale(scale=np.broadcast_to(_numpy(scale), shape).copy())
    raise TypeError(
        f"node {name!r}: {type(module).__name__} has no NIR node; supported: {_SUPPORTED}."
    )


class _Builder:
    """Collects NIR nodes and edges while walking the module, inferring shapes on the way."""

    def __init__(self, dt: float, method: str) -> None:
        self.dt, self.method = dt, method
        self.nodes: dict[str, Any] = {}
        self.edges: list[tuple[str, str]] = []

    def add(self, name: str, module: nn.Module, ends: list[tuple[str, torch.Tensor]]) -> list:
        """Add ``module`` fed by ``ends`` ((node, one step of its output) pairs, summed);
        return the new ends."""
        if isinstance(module, nn.Sequential):
            for child, sub in module.named_children():
                ends = self.add(f"{name}_{child}" if name else child, sub, ends)
            return ends
        if isinstance(module, PerStep):
            return self.add(name, module.module, ends)
        if isinstance(module, Graph):
            return self.add_graph(name, module, ends)
        if isinstance(module, nn.Identity):
            return ends
        name = name or type(module).__name__.lower()
        step = ends[0][1]
        for _, more in ends[1:]:
            if more.shape != step.shape:
                raise ValueError(f"node {name!r}: the inputs it adds have different shapes.")
            step = step + more
        shape = tuple(step.shape[1:])
        if isinstance(module, RecurrentNeuronLayer):
            node, out = node_of(name, module, shape, self.dt, self.method), step
        elif isinstance(module, (NeuronLayer, Readout)):
            node, out = to_node(name, module, shape, self.dt, self.method), step
        else:
            node = _stateless(module, name, shape)
            with torch.no_grad():
                out = module(step)
        self.nodes[name] = node
        self.edges += [(src, name) for src, _ in ends]
        return [(name, out)]

    def add_graph(self, prefix: str, graph: Graph, ends: list) -> list:
        if len(graph.inputs) != 1 or len(graph.outputs) != 1:
            raise ValueError("Export supports graphs with one input and one output node.")
        produced: dict[str, list] = {graph.inputs[0]: ends}
        for node in graph.order[1:]:
            feeds = [end for src, dst in graph.edges if dst == node for end in produced[src]]
            module = graph.node(node)
            name = f"{prefix}_{node}" if prefix else node
            produced[node] = feeds if module is None else self.add(name, module, feeds)
        return produced[graph.outputs[0]]


def graph_of(module: nn.Module, sample_input: torch.Tensor, dt: float, method: str) -> Any:
    """The NIR graph of ``module`` (see :func:`symneuron.nir.export`)."""
    import nir

    if not isinstance(sample_input, torch.Tensor) or sample_input.dim() < 3:
        raise ValueError(
            "sample_input must be a tensor [T, B, *shape] as the module takes it, got "
            f"{getattr(sample_input, 'shape', type(sample_input).__name__)}."
        )
    builder = _Builder(dt, method)
    first = sample_input[0].detach()
    shape = np.array(first.shape[1:])
    builder.nodes["input"] = nir.Input(input_type={"input": shape})
    ends = builder.add("", module, [("input", first)])
    if len(ends) != 1:
        raise ValueError("The module ends in an add of several branches; end it with a node.")
    builder.nodes["output"] = nir.Output(output_type={"output": np.array(ends[0][1].shape[1:])})
    builder.edges.append((ends[0][0], "output"))
    graph = nir.NIRGraph(nodes=builder.nodes, edges=builder.edges)
    graph.metadata = {"source": "symneuron", "dt": float(dt), "method": method}
    return graph
