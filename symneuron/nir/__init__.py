"""Exchange networks with the Neuromorphic Intermediate Representation (NIR).

:func:`export` turns a trained network of symneuron layers into a ``nir.NIRGraph``
(which ``nir.write`` saves as HDF5 for snnTorch, Norse, Sinabs, Lava, SpiNNaker2 and
others to read); :func:`load` turns a NIR graph into a torch module whose neurons run
on symneuron's generated kernels. Both take the time step ``dt`` that links NIR's
continuous-time ODEs to symneuron's steps; the conversion, and how NIR's v > θ is
matched to symneuron's H ≥ θ, are in :mod:`symneuron.nir.neurons`. See
docs/nir.md for the mapping table and what does not map.

NIR carries no surrogate gradients and no learnability: loaded neurons use the
default surrogate, and their parameters are buffers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..simulate import BACKENDS
from .modules import NEVER, Graph, PerStep, Readout, Scale
from .neurons import METHODS

__all__ = ["export", "load", "Graph", "PerStep", "Readout", "Scale", "METHODS", "NEVER"]


def _require_nir() -> Any:
    try:
        import nir
    except ImportError:
        raise ImportError(
            "symneuron.nir needs the 'nir' package; install it with: pip install symneuron[nir]"
        ) from None
    return nir


def _check(dt: Any, method: str) -> float:
    if isinstance(dt, bool) or not isinstance(dt, (int, float)) or not dt > 0:
        raise ValueError(f"dt must be a positive number (in the unit of NIR's tau), got {dt!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return float(dt)


def export(
    module: nn.Module, sample_input: torch.Tensor, *, dt: float, method: str = "euler"
) -> Any:
    r"""The ``nir.NIRGraph`` of ``module``, one step of symneuron being ``dt`` of NIR's time.

    Parameters
    ----------
    module : nn.Module
        An ``nn.Sequential`` (exported as a chain; nested ones are flattened), a
        :class:`Graph` (as returned by :func:`load`; branches and adds kept), or one
        layer. Layers: ``nn.Linear`` (→ Affine, or Linear without bias), ``nn.Conv1d``,
        ``nn.Conv2d``, ``nn.Flatten``, ``nn.AvgPool2d`` (→ AvgPool2d; with
        ``divisor_override=1`` → SumPool2d), :class:`Scale`, :class:`PerStep`,
        :class:`~symneuron.NeuronLayer` (→ IF, LIF, CubaLIF or Threshold),
        :class:`Readout` (→ I, LI or CubaLI) and
        :class:`~symneuron.RecurrentNeuronLayer` (→ a nested NIRGraph as snnTorch
        writes RLeaky: ``input → lif → output`` and the cycle ``lif → w_rec → lif``,
        w_rec an Affine or Linear of the masked weight).
    sample_input : Tensor [T, B, *shape]
        Input as the module takes it; only its first step is run, through the
        stateless layers, to find each node's shape (NIR shapes have no T or B).
    dt : float
        The step length in the unit of NIR's τ (e.g. 1e-3 for τ in seconds and 1 ms
        steps).
    method : {"euler", "exp_euler"}
        How a neuron's leak per step λ = 1 − ∂H/∂V becomes τ: ``"euler"`` τ = dt/λ
        (symneuron's LIF zoo model is this step), ``"exp_euler"`` τ = −dt/ln(1 − λ).

    Notes
    -----
    A neuron exports when its step map is linear (per neuron, with its trained
    parameter values): H = V + λ(v_leak − V + r·X) gives LIF (τ from λ, r, v_leak);
    λ = 0 gives IF with r = (∂H/∂X)/dt; one synaptic current Ĩ = I + λ_syn(w_in·X − I)
    gives CubaLIF; so LIF (both ``decay_input`` forms), PLIF, ThresholdLIF (trained
    θ per neuron) and CuLIF export. The threshold written is the largest float64
    below θ, since NIR fires on v > θ. Anything else raises a ValueError naming the
    node and the reason: a nonlinear charge (QIF, EIF, Izhikevich, ...), soft reset,
    more states, a state-dependent threshold.

    Examples
    --------
    >>> import torch, symneuron as sn
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 3), sn.NeuronLayer(sn.models.LIF()))
    >>> graph = sn.nir.export(net, torch.zeros(1, 1, 4), dt=1e-3)
    >>> sorted(graph.nodes)
    ['0', '1', 'input', 'output']
    >>> float(graph.nodes["1"].tau[0])   # LIF(tau=2.0): 2 steps of 1 ms
    0.002
    """
    _require_nir()
    from .to_nir import graph_of

    return graph_of(module, sample_input, _check(dt, method), method)


def load(
    graph: Any,
    *,
    dt: float,
    backend: str = "auto",
    method: str = "euler",
    dtype: torch.dtype | None = None,
) -> Graph:
    r"""A module that runs the ``nir.NIRGraph`` ``graph`` with steps of length ``dt``.

    The module (a :class:`Graph`) takes ``x_seq`` [T, B, *shape] per input node and
    returns the output node's [T, B, *shape]; stateless nodes run on all steps at
    once (:class:`PerStep`), neuron nodes are :class:`~symneuron.NeuronLayer` (IF,
    LIF, CubaLIF, Threshold: spikes) or :class:`Readout` (I, LI, CubaLI: V), built
    with :meth:`symneuron.Neuron.from_ode` or :class:`symneuron.Neuron`, their
    parameters per neuron as in the graph. Several edges into a node add up (residual
    connections). Call ``module.reset()`` between sequences.

    Parameters
    ----------
    graph : nir.NIRGraph
        E.g. from ``nir.read(path)``. One form of cycle loads: a spiking neuron node
        (LIF, IF, CubaLIF, Threshold) and an Affine or Linear node that feed each
        other, the latter with no other edges (snnTorch's RLeaky and RSynaptic,
        nested or flat); each becomes a :class:`~symneuron.RecurrentNeuronLayer`
        whose edge back carries the previous step's spikes. Other cycles raise a
        ValueError.
    dt : float
        The step length in the unit of the graph's τ.
    backend : {"auto", "cuda", "cpu", "torch"}
    method : {"euler", "exp_euler"}
        The step of the ODEs: λ = dt/τ (forward Euler, as snnTorch) or
        λ = 1 − exp(−dt/τ) (exact for an input held over the step); see
        :mod:`symneuron.nir.neurons` for every formula.
    dtype : torch.dtype, optional
        Of the parameters (default: torch's default dtype). A threshold θ becomes the
        smallest value of this dtype above θ, so H ≥ it ⟺ H > θ (NIR's firing rule)
        exactly in this dtype; keep the module in this dtype.

    Examples
    --------
    >>> import nir, numpy as np, torch, symneuron as sn
    >>> g = nir.NIRGraph.from_list(
    ...     nir.Affine(weight=np.eye(2), bias=np.zeros(2)),
    ...     nir.LIF(tau=np.full(2, 2e-3), r=np.ones(2), v_leak=np.zeros(2),
    ...             v_threshold=np.ones(2)))
    >>> net = sn.nir.load(g, dt=1e-3)
    >>> net(torch.full((3, 1, 2), 1.5)).squeeze(1).tolist()
    [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]
    """
    _require_nir()
    from .from_nir import module_of

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    dtype = dtype or torch.get_default_dtype()
    return module_of(graph, _check(dt, method), method, backend, dtype)
