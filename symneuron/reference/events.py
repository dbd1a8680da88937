"""The float64 torch reference of EventProp: the exact forward and its adjoint backward.

A network of layers of one ODE neuron (feedforward, each layer recurrent or not) runs
in continuous time, and its gradient is EventProp's (docs/eventprop.md), built from the
derived expressions only (no module of the reference writes a model's equation): the
spec as torch functions in :mod:`.event_model`; for a linear neuron (a LIF with a
current synapse: any neuron whose :class:`~symneuron.derivation.events.EventSpec` has a
closed-form flow) each layer's exact forward in :mod:`.event_forward` and each neuron's
adjoint in :mod:`.event_adjoint`; for a nonlinear one (QIF, EIF, AdEx) RK4 steps with
crossings on the Hermite interpolant and the adjoint back by RK4, in :mod:`.event_rk4`.

API (a first step, no kernels yet): :func:`event_network` is a differentiable function
of tensors, as ``torch.nn.functional``'s are: given the input spike times and each
layer's weights, delays and params, it returns each layer's spike times (slots padded
with +inf), and ``backward()`` through any loss of those times (e.g.
:func:`~symneuron.reference.readouts.first_spike_cross_entropy`) runs EventProp. Spike
times as padded per-neuron lists make losses ordinary torch code and keep the counts
visible (finite entries). Readouts (:mod:`.readouts`) are functions of a layer's spike
times too. One sample per call.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch

from ..definition import Definition
from ..derivation.events import EventSpec
from ..ode import ODESystem
from .event_adjoint import Grads, backward_layer
from .event_forward import Layer, Spike, layers_of, padded_times
from .event_model import EventModel, model_of, symbol_values
from .event_rk4 import RK4Layer, backward_rk4_layer

__all__ = [
    "EventLayer",
    "GrazingSpikeWarning",
    "event_network",
    "INTEGRATORS",
    "recurrent_layers",
    "uses_rk4",
]


class EventLayer(NamedTuple):
    """One layer: ``weight`` and ``delay`` [n_out, n_in] (delays ≥ 0, in the ODE's time
    unit), and ``params`` per neuron ([n_out], by name; a param not given takes its
    default and gets no gradient).

    A recurrent layer also has ``recurrent_weight`` and ``recurrent_delay`` [n_out, n_out]
    (target, source; both or neither): a spike of its neuron j at t_k arrives at its
    neuron i at t_k + recurrent_delay[i, j] with weight recurrent_weight[i, j]. Recurrent
    delays are continuous and at least one step (the neuron's ``dt``): at zero a spike
    could cause a spike at the same instant, with no order of events and no derivative;
    from one step on, each arrival falls in a later step than its spike, so the step's
    spikes are all known when their arrivals are queued, and their B is complete when
    the adjoint reaches them. The reference runs recurrent layers of any neuron, the
    compiled kernels (:func:`symneuron.eventprop.event_network`) of a linear one."""

    weight: torch.Tensor
    delay: torch.Tensor
    params: Mapping[str, torch.Tensor] = {}
    recurrent_weight: torch.Tensor | None = None
    recurrent_delay: torch.Tensor | None = None


def event_network(
    neuron: Definition,
    layers: Sequence[EventLayer],
    input_times: torch.Tensor,
    *,
    t_end: float,
    system: ODESystem | None = None,
    target: str | None = None,
    grazing: float = 1e-3,
    integrator: str | None = None,
) -> tuple[torch.Tensor, ...]:
    """Each layer's spike times [n_l, K_l] (+inf padded, ascending) of a feedforward
    network of ``neuron`` (an ODE neuron, :meth:`~symneuron.Neuron.from_ode`) run up to
    ``t_end`` in steps of its ``dt``, differentiable by EventProp in each layer's
    weights, delays and given params and in ``input_times`` ([n_in, K], +inf padded).
    A layer with ``recurrent_weight`` and ``recurrent_delay`` (:class:`EventLayer`)
    also receives its own spikes, and is differentiable in those too.

    ``integrator`` is how a layer moves between events: ``"exact"``, the closed-form
    flow of a linear model (the default for one: the forward is exact and the gradient
    is its exact gradient), or ``"rk4"``, RK4 steps with crossings on each step's cubic
    Hermite interpolant and the adjoint integrated back by RK4 (the default for a
    nonlinear model: spike times and gradients accurate to O(dt⁴),
    :mod:`~symneuron.reference.event_rk4`).

    A batch of samples, ``input_times`` [batch, n_in, K] with the same layers, gives
    [batch, n_l, K_l] (K_l the most spikes of any sample): the samples run one after
    another, not in parallel. ``system`` defaults to ``neuron.ode``; ``target`` names
    the state spikes jump (default: through X). Float64 only.

    A spike whose threshold function rises slower than ``grazing`` (ġ⁻ < grazing, in
    threshold units per time unit) is reported by a :class:`GrazingSpikeWarning` with
    its layer, neuron, time and ġ⁻: its gradient scales with 1/ġ⁻ and is kept as it is,
    never clipped. ``warnings.simplefilter("error", GrazingSpikeWarning)`` makes it an
    error.

    Examples
    --------
    >>> import sympy as sp, torch, symneuron as sn
    >>> from symneuron.reference.events import EventLayer, event_network
    >>> tau_m, tau_s, I = sp.symbols("tau_m tau_s I", positive=True)
    >>> lif = sn.Neuron.from_ode((-sn.V + I) / tau_m, dt=1.0, method="exact",
    ...     params={tau_m: 10.0, tau_s: 5.0}, states={I: sn.ODEState(-I / tau_s + sn.X)})
    >>> w = torch.full((1, 1), 5.0, dtype=torch.float64, requires_grad=True)
    >>> layer = EventLayer(w, torch.zeros(1, 1, dtype=torch.float64))
    >>> (out,) = event_network(lif, [layer], torch.tensor([[1.0]], dtype=torch.float64), t_end=20.0)
    >>> out.sum().backward()  # d(spike time)/dw < 0: more weight, earlier spike
    >>> bool(w.grad < 0)
    True
    """
    if input_times.dim() == 3:
        rows = [
            event_network(
                neuron,
                layers,
                x,
                t_end=t_end,
                system=system,
                target=target,
                grazing=grazing,
                integrator=integrator,
            )
            for x in input_times
        ]
        return tuple(_stacked([row[i] for row in rows]) for i in range(len(layers)))
    model, dt = model_of(neuron, system, target)
    loops = recurrent_layers(layers, dt)
    flat: list[torch.Tensor] = []
    for layer in layers:
        flat += [
            layer.weight,
            layer.delay,
            *_present(layer.recurrent_weight, layer.recurrent_delay),
        ]
        flat += [layer.params[n] for n in sorted(layer.params)]
    shapes = [sorted(layer.params) for layer in layers]
    rk4 = uses_rk4(model.spec, model.definition.name, integrator)
    times_ = (t_end, dt, grazing, rk4)
    return tuple(_EventProp.apply(model, (shapes, loops), times_, input_times, *flat))


def _present(*tensors: torch.Tensor | None) -> list[torch.Tensor]:
    """The tensors given (a recurrent layer's recurrent weight and delay, or none)."""
    return [t for t in tensors if t is not None]


def recurrent_layers(layers: Sequence[EventLayer], dt: float) -> list[bool]:
    """Which layers are recurrent, their recurrent weights and delays checked: both
    given, [n, n], finite, delays at least one step (:class:`EventLayer`)."""
    loops = []
    for index, layer in enumerate(layers):
        weight, delay = layer.recurrent_weight, layer.recurrent_delay
        if (weight is None) != (delay is None):
            raise ValueError(
                f"layer {index}: give recurrent_weight and recurrent_delay together, or neither."
            )
        loops.append(weight is not None)
        if weight is None or delay is None:
            continue
        n = layer.weight.shape[0]
        for name, tensor in (("recurrent_weight", weight), ("recurrent_delay", delay)):
            if tensor.shape != (n, n):
                raise ValueError(
                    f"layer {index}: {name} of shape {tuple(tensor.shape)}, expected [{n}, {n}] "
                    "(target, source: the layer's own neurons)."
                )
        if not torch.isfinite(weight).all():
            raise ValueError(f"layer {index}: recurrent weights must be finite.")
        if not torch.isfinite(delay).all() or bool((delay < dt).any()):
            raise ValueError(
                f"layer {index}: recurrent delays must be finite and at least one step "
                f"(dt = {dt:g}), got a smallest of {float(delay.min()):g}. At zero a spike "
                "could cause a spike at the same instant (no order, no derivative); from one "
                "step on, every arrival falls in a later step than its spike. A shorter delay "
                "needs a smaller dt (exact models do not depend on it)."
            )
    return loops


#: How a layer moves between events: closed form (linear models) or RK4 (any).
INTEGRATORS = ("exact", "rk4")


def uses_rk4(spec: EventSpec, name: str, integrator: str | None) -> bool:
    """Whether the neuron ``name`` of ``spec`` moves by RK4 under ``integrator`` (one of
    :data:`INTEGRATORS`, or None: RK4 where the spec has no closed-form flow), checked
    (``"exact"`` for a nonlinear neuron is an error)."""
    if integrator is None:
        return not spec.linear
    if integrator not in INTEGRATORS:
        raise ValueError(f"integrator is one of {INTEGRATORS} (or None), got {integrator!r}")
    if integrator == "exact" and not spec.linear:
        raise ValueError(
            f"{name} is nonlinear (its Jacobian depends on the state): "
            "there is no closed-form flow; use integrator='rk4'."
        )
    return integrator == "rk4"


class GrazingSpikeWarning(RuntimeWarning):
    """A spike at which the threshold function barely rises (ġ⁻ below a tolerance):
    its time's derivative, and so EventProp's jump, scales with 1/ġ⁻."""


def _report_grazing(layer: Layer, index: int, spikes: list[list[Spike]], tolerance: float) -> None:
    """A :class:`GrazingSpikeWarning` for each spike of ``layer`` with ġ⁻ < tolerance."""
    found = [(j, spike) for j, row in enumerate(spikes) for spike in row]
    if not found:
        return
    neurons = torch.tensor([j for j, _ in found])
    states = torch.stack([spike.before for _, spike in found], dim=1)
    params = {n: v[neurons] for n, v in layer.params.items()}
    env = symbol_values(layer.model, params, x=states)
    rates = layer.model.g_dot(env, states[0])[0]
    for (j, spike), rate in zip(found, rates.tolist(), strict=True):
        if rate < tolerance:
            warnings.warn(
                GrazingSpikeWarning(
                    f"layer {index}, neuron {j}: a spike at t = {spike.time!r} grazes the "
                    f"threshold, ġ⁻ = {rate:.3g} < {tolerance:g}; its gradient scales with "
                    "1/ġ⁻ and is not clipped."
                ),
                stacklevel=2,
            )


def _stacked(times: list[torch.Tensor]) -> torch.Tensor:
    """Samples' spike times [n, K_b] as [batch, n, max K_b], +inf padded."""
    slots = max(t.shape[1] for t in times)
    pad = [torch.nn.functional.pad(t, (0, slots - t.shape[1]), value=torch.inf) for t in times]
    return torch.stack(pad)


class _EventProp(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        model: EventModel,
        shapes: tuple[list[list[str]], list[bool]],
        times_: tuple[float, float, float, bool],
        input_times: torch.Tensor,
        *flat: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        t_end, dt, grazing, rk4 = times_
        layers = layers_of(model, shapes[0], flat, RK4Layer if rk4 else Layer, shapes[1])
        times, spikes = input_times.detach(), []
        for index, layer in enumerate(layers):
            spikes.append(layer.forward(times, t_end, dt))
            _report_grazing(layer, index, spikes[-1], grazing)
            times = padded_times(spikes[-1])
        ctx.saved = (model, shapes, t_end, dt, layers, spikes, input_times.detach())
        return tuple(padded_times(s) for s in spikes)

    @staticmethod
    def backward(ctx: Any, *grad_times: torch.Tensor) -> tuple[Any, ...]:
        model, shapes, t_end, dt, layers, spikes, input_times = ctx.saved
        grads: list[Grads] = []
        later_b = torch.zeros_like(grad_times[-1])
        for index in reversed(range(len(layers))):
            pre = input_times if index == 0 else padded_times(spikes[index - 1])
            own_b = later_b - grad_times[index]  # B = Σ Q − ∂L/∂t_k
            backward = backward_rk4_layer if isinstance(layers[index], RK4Layer) else backward_layer
            grads.append(backward(layers[index], pre, spikes[index], own_b, t_end, dt))
            later_b = grads[-1].source_b
        flat: list[torch.Tensor] = []
        for names, layer in zip(shapes[0], reversed(grads), strict=True):
            flat += [
                layer.weight,
                layer.delay,
                *_present(layer.recurrent_weight, layer.recurrent_delay),
            ]
            flat += [layer.params[n] for n in names]
        grad_input = torch.where(torch.isfinite(input_times), -later_b, 0.0)
        return (None, None, None, grad_input, *flat)
