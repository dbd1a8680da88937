r"""Recurrent layers <-> NIR's cycles: a neuron node and the Affine/Linear edge back to it.

A :class:`~symneuron.RecurrentNeuronLayer` (X_eff[t] = x[t] + (R ⊙ M)·s[t−1] + b) is,
in NIR, a neuron node whose spikes feed an ``Affine`` (with b) or ``Linear`` node that
feeds the neuron again. Export writes it as snnTorch 1.0.0 writes ``RLeaky`` and
``RSynaptic``: a nested ``NIRGraph`` of four nodes ::

    input -> lif -> output          (lif: LIF, CubaLIF, IF or Threshold)
              ^  \
              |   v
             w_rec                  (Affine [n, n] with bias b, else Linear; R ⊙ M)

Load takes that subgraph and the same two-node cycle anywhere in a graph (snnTorch's
exporter, through nirtorch 2.6, writes it flat: ``"1.lif" <-> "1.w_rec"``). The edge
back carries the previous step's spikes: w_rec's output at step t is R·s[t−1] + b,
with s[−1] = 0, as in snnTorch's ``RLeaky`` (which adds b at the first step too).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..recurrent import RecurrentNeuronLayer
from .modules import SUPPORTED_CYCLE
from .neurons import NEURON_NODES, neuron_of, to_node

__all__ = ["RECURRENT_NEURONS", "loops", "subgraph_layer", "layer_of", "node_of"]

#: The spiking NIR nodes a recurrent layer is built from.
RECURRENT_NEURONS = ("LIF", "IF", "CubaLIF", "Threshold")
_WEIGHTS = ("Affine", "Linear")
#: The names and edges of the nested graph (snnTorch's RLeaky/RSynaptic export).
_NODES = ("input", "lif", "w_rec", "output")
_EDGES = [("input", "lif"), ("lif", "w_rec"), ("w_rec", "lif"), ("lif", "output")]


def _kind(node: Any) -> str:
    return type(node).__name__


def _roles(graph: Any, a: str, b: str) -> tuple[str, str]:
    """(neuron, weight) of two nodes that feed each other, as far as their kinds tell."""
    if _kind(graph.nodes[a]) in _WEIGHTS or _kind(graph.nodes[b]) in NEURON_NODES:
        return b, a
    return a, b


def _check_pair(graph: Any, neuron: str, weight: str, where: str) -> None:
    """ValueError unless ``neuron`` <-> ``weight`` is the supported form."""
    kinds = (_kind(graph.nodes[neuron]), _kind(graph.nodes[weight]))
    if kinds[0] not in RECURRENT_NEURONS or kinds[1] not in _WEIGHTS:
        raise ValueError(
            f"NIR nodes {where + neuron!r} ({kinds[0]}) and {where + weight!r} ({kinds[1]}) "
            f"feed each other, a cycle symneuron.nir does not load. {SUPPORTED_CYCLE}."
        )
    others = [e for e in graph.edges if weight in e and set(e) != {neuron, weight}]
    if others:
        raise ValueError(
            f"NIR node {where + weight!r} ({kinds[1]}) feeds {where + neuron!r} back but also "
            f"has the edges {others}. {SUPPORTED_CYCLE}; give the other edges their own node."
        )


def loops(graph: Any, where: str = "") -> dict[str, str]:
    """{neuron node: its recurrent weight node} for every two-node cycle of ``graph``.

    Raises ValueError for a two-node cycle of another form (naming the supported one);
    longer cycles are left to :class:`~symneuron.nir.Graph`, which refuses them.
    """
    edges = {(str(src), str(dst)) for src, dst in graph.edges}
    found: dict[str, str] = {}
    for src, dst in sorted(edges):
        if src == dst or (dst, src) not in edges or src > dst:
            continue
        neuron, weight = _roles(graph, src, dst)
        _check_pair(graph, neuron, weight, where)
        if neuron in found:
            raise ValueError(
                f"NIR node {where + neuron!r} has two recurrent edges ({found[neuron]!r}, "
                f"{weight!r}); add them into one Affine/Linear node. {SUPPORTED_CYCLE}."
            )
        found[neuron] = weight
    return found


def layer_of(
    neuron_node: Any,
    weight_node: Any,
    dt: float,
    method: str,
    backend: str,
    dtype: torch.dtype,
) -> RecurrentNeuronLayer:
    """The :class:`~symneuron.RecurrentNeuronLayer` of a neuron node and its weight node."""
    weight = np.asarray(weight_node.weight, dtype=np.float64)
    bias = getattr(weight_node, "bias", None)
    neuron, params = neuron_of(neuron_node, dt, method, dtype)
    layer = RecurrentNeuronLayer(
        neuron, weight.shape[0], bias=bias is not None, backend=backend, params=params
    ).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(weight))
        if layer.bias is not None:
            values = np.broadcast_to(np.asarray(bias, dtype=np.float64), weight.shape[:1])
            layer.bias.copy_(torch.from_numpy(values.copy()))
    return layer


def subgraph_layer(module: Any) -> RecurrentNeuronLayer | None:
    """The recurrent layer a loaded nested graph consists of (input -> it -> output), or None."""
    inner = list(module.nodes.values())
    if len(inner) != 1 or not isinstance(inner[0], RecurrentNeuronLayer):
        return None
    if len(module.inputs) != 1 or len(module.outputs) != 1 or len(module.edges) != 2:
        return None
    return inner[0]


def node_of(
    name: str, layer: RecurrentNeuronLayer, shape: tuple[int, ...], dt: float, method: str
) -> Any:
    """The nested ``nir.NIRGraph`` of ``layer`` (neurons of ``shape``: must be [size])."""
    import nir

    if layer.delay != 1:
        raise ValueError(
            f"node {name!r}: a RecurrentNeuronLayer with delay={layer.delay} has no NIR form "
            "the simulators read: a NIR cycle carries the previous step's spikes (delay 1), "
            "and snnTorch and Norse load no Delay node inside one. Export a layer with "
            "delay=1, or keep this one in symneuron (torch.save of its state_dict)."
        )
    if shape != (layer.size,):
        raise ValueError(
            f"node {name!r}: a RecurrentNeuronLayer of size {layer.size} takes inputs "
            f"[T, B, {layer.size}], got a step of shape {list(shape)} (without T and B)."
        )
    weight = layer.effective_weight.detach().cpu().to(torch.float64).numpy()
    if layer.bias is None:
        w_rec = nir.Linear(weight=weight)
    else:
        w_rec = nir.Affine(weight=weight, bias=layer.bias.detach().cpu().double().numpy())
    size = np.array([layer.size])
    nodes = dict(
        zip(
            _NODES,
            (
                nir.Input(input_type={"input": size}),
                to_node(name, layer.cell, shape, dt, method),
                w_rec,
                nir.Output(output_type={"output": size}),
            ),
            strict=True,
        )
    )
    return nir.NIRGraph(nodes=nodes, edges=list(_EDGES))
