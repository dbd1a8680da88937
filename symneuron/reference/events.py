"""The float64 torch reference of EventProp: the exact forward and its adjoint backward.

A feedforward network of layers of one linear ODE neuron (a LIF with a current synapse:
any neuron whose :class:`~symneuron.derivation.events.EventSpec` has a closed-form flow)
runs in continuous time, and its gradient is EventProp's (docs/eventprop.md), built from
the derived expressions only (this module writes no model's equation):

Forward, each layer's neurons in lockstep over steps of ``dt``: the input spikes arrive
at their exact times t_k + d_ji (delays continuous); between breakpoints (arrivals and
step ends) the state moves by the closed-form flow x(s) = Φ(s)x + Γ(s); a crossing of
g = 0 inside a sub-interval is found by splitting it at the zero of ġ (at most one for
two states with distinct real rates: g along the flow is c₀ + c₁e^{μ₁s} + c₂e^{μ₂s}),
then Newton's method safeguarded by bisection on the monotone piece, to rounding; the
reset is applied there and the rest of the sub-interval is run again, so a neuron may
spike several times in a step.

Backward, layer by layer from the output: per neuron, its events in reverse (its own
spikes and its arrivals), λ(t − s) = Φ(s)ᵀλ(t) between them, the derived jump at a
spike with B = Σ Q (of the spike's arrivals in the next layer) − ∂L/∂t_k, and at an
arrival dL/dw += λ·∂m/∂w, dL/dd −= Q, B_source += Q. Time constants and other params
of f get ∫λ·∂f/∂θ dt by 8-point Gauss–Legendre quadrature on pieces no longer than
``dt`` (λ and x are sums of exponentials there: error far below float64's rounding for
dt ≤ τ), thresholds and reset levels the derived spike terms.

API (a first step, no kernels yet): :func:`event_network` is a differentiable function
of tensors, as ``torch.nn.functional``'s are: given the input spike times and each
layer's weights, delays and params, it returns each layer's spike times (slots padded
with +inf), and ``backward()`` through any loss of those times (e.g.
:func:`first_spike_cross_entropy`) runs EventProp. Spike times as padded per-neuron
lists make losses ordinary torch code and keep the counts visible (finite entries).
Readouts (:func:`max_voltage`, :func:`mean_voltage`) are functions of a layer's spike
times too: a layer of the neuron run without its threshold, whose max or weighted mean
of V is the output, with the loss's kick (or continuous source) in the adjoint.
One sample per call.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import sympy as sp
import torch

from ..definition import Definition
from ..derivation.events import EventSpec, derive_events
from ..memo import BoundedTable
from ..ode import ODESystem
from .equations import torch_function

__all__ = [
    "EventLayer",
    "GrazingSpikeWarning",
    "MaxVoltage",
    "event_network",
    "first_spike_cross_entropy",
    "max_voltage",
    "mean_voltage",
]

_GAUSS_NODES, _GAUSS_WEIGHTS = np.polynomial.legendre.leggauss(8)
_EPS = float(torch.finfo(torch.float64).eps)
#: Sub-intervals a crossing search cuts a piece into for more than two states: g along
#: the flow is a sum of n exponentials and a constant, ġ has at most n − 1 zeros, and
#: each sub-interval is taken to hold at most one.
_PARTS = 8


class EventLayer(NamedTuple):
    """One feedforward layer: ``weight`` and ``delay`` [n_out, n_in] (delays ≥ 0, in the
    ODE's time unit), and ``params`` per neuron ([n_out], by name; a param not given
    takes its default and gets no gradient)."""

    weight: torch.Tensor
    delay: torch.Tensor
    params: Mapping[str, torch.Tensor] = {}


class _Arrivals(NamedTuple):
    """Arrivals sorted by time per neuron ([n, M + 1], an +inf column last): time,
    weight, and the source neuron and slot of the spike that sent each."""

    times: torch.Tensor
    weights: torch.Tensor
    source: torch.Tensor
    slot: torch.Tensor


class _Grads(NamedTuple):
    """One layer's dL/dW, dL/dD, dL/dθ and each presynaptic spike's B (Σ Q)."""

    weight: torch.Tensor
    delay: torch.Tensor
    params: dict[str, torch.Tensor]
    source_b: torch.Tensor


class _Kick(NamedTuple):
    """A loss's ∂L/∂x(t) at one time: λ jumps by ``value`` there (backward in time)."""

    time: float
    value: torch.Tensor


#: ∂ℓ_V/∂x at times [q] as [n_states, q]: a continuous source in dλ/dt.
_Source = Callable[[torch.Tensor], torch.Tensor]


class _StateLoss(NamedTuple):
    """What a loss on a neuron's state adds to its adjoint: kicks and a source."""

    kicks: Sequence[_Kick] = ()
    source: _Source | None = None


_NO_STATE_LOSS = _StateLoss()
_ORDER = {"kick": 0, "arrival": 1, "spike": 2}


class _Spike(NamedTuple):
    time: float
    before: torch.Tensor  # x⁻, [n_states]


class _Model:
    """A spec's expressions as torch functions of (*x, *λ, w, B, s, *θ)."""

    def __init__(self, definition: Definition, spec: EventSpec) -> None:
        if spec.flow is None or spec.flow_offset is None:
            raise ValueError("The EventProp reference runs linear models (a closed-form flow).")
        self.spec, self.definition = spec, definition
        #: sub-intervals a crossing search cuts each into (:meth:`_Layer.first_crossing`)
        self.parts = 1 if len(spec.states) == 2 else _PARTS
        self.names = list(spec.params)
        self.args = (
            *spec.states,
            *spec.adjoints,
            spec.weight,
            spec.coupling,
            spec.elapsed,
            *spec.params.values(),
        )
        rate_slope = sp.Matrix([spec.threshold_rate]).jacobian(spec.states).dot(spec.rhs)
        self.flow = self._vector(list(spec.flow))
        self.offset = self._vector(list(spec.flow_offset))
        self.g = self._vector([spec.threshold])
        self.g_dot = self._vector([spec.threshold_rate])
        self.g_ddot = self._vector([rate_slope])
        voltage_slope = sp.Matrix([spec.rhs[0]]).jacobian(spec.states).dot(spec.rhs)
        self.voltage = self._vector([spec.states[0]])
        self.voltage_rate = self._vector([spec.rhs[0]])
        self.voltage_slope = self._vector([voltage_slope])
        self.reset = self._vector(list(spec.reset))
        self.margin = self._vector([spec.reset_margin])
        self.synapse = self._vector(list(spec.synapse))
        self.jump = self._vector(list(spec.jump))
        self.synapse_t = self._vector(list(spec.synapse_jacobian.T * sp.Matrix(spec.adjoints)))
        self.weight_partial = self._vector([spec.weight_partial.dot(sp.Matrix(spec.adjoints))])
        self.target_term = self._vector([spec.target_term])
        self.spike_partials = self._vector([spec.spike_partials[n] for n in self.names])
        lam = sp.Matrix(spec.adjoints)
        self.integrands = self._vector([lam.dot(spec.rhs_partials[n]) for n in self.names])
        init = [definition.v_start, *(st.init for st in definition.states.values())]
        self.init = self._vector([sp.sympify(e) for e in init])

    def _vector(self, exprs: Sequence[sp.Expr]) -> Callable[..., list[torch.Tensor]]:
        fns = [torch_function(self.args, sp.sympify(e)) for e in exprs]

        def evaluate(env: Mapping[sp.Symbol, Any], like: torch.Tensor) -> list[torch.Tensor]:
            values = [env.get(a, 0.0) for a in self.args]
            return [torch.as_tensor(f(*values), dtype=like.dtype).expand_as(like) for f in fns]

        return evaluate


def _env(model: _Model, params: Mapping[str, torch.Tensor], **parts: Any) -> dict[sp.Symbol, Any]:
    """Each symbol's value: params, states ``x`` and adjoints ``lam`` (lists or tensors
    whose first axis runs over them), ``w``, ``B``, ``s``."""
    spec = model.spec
    env: dict[sp.Symbol, Any] = {spec.params[n]: v for n, v in params.items()}
    for key, symbols in (("x", spec.states), ("lam", spec.adjoints)):
        if key in parts:
            env.update(zip(symbols, parts[key], strict=True))
    for key, symbol in (("w", spec.weight), ("B", spec.coupling), ("s", spec.elapsed)):
        if key in parts:
            env[symbol] = parts[key]
    return env


#: The torch functions of a neuron's spec, by (neuron, its ODEs' text, target).
_MODELS: BoundedTable[tuple[Definition, str, str | None], _Model] = BoundedTable(
    16, "reference.events.models"
)


class _Layer:
    """One layer's forward in lockstep over its neurons, and its per-neuron backward."""

    def __init__(self, model: _Model, layer: EventLayer, n_out: int) -> None:
        self.model = model
        self.weight, self.delay = layer.weight, layer.delay
        defaults = model.definition.params
        self.params = {
            n: (
                layer.params[n]
                if n in layer.params
                else torch.full((n_out,), defaults[n], dtype=torch.float64)
            )
            for n in model.names
        }
        self.n = n_out

    # -- forward ------------------------------------------------------------
    def flow(self, x: list[torch.Tensor], s: torch.Tensor) -> list[torch.Tensor]:
        env = _env(self.model, self.params, s=s)
        phi, gamma = self.model.flow(env, s), self.model.offset(env, s)
        k = len(x)
        return [sum((phi[i * k + j] * x[j] for j in range(k)), gamma[i]) for i in range(k)]

    def value(self, fn: Callable[..., list[torch.Tensor]], x: list[torch.Tensor]) -> torch.Tensor:
        return fn(_env(self.model, self.params, x=x), x[0])[0]

    def arrivals(self, pre_times: torch.Tensor, t_end: float) -> _Arrivals:
        """Each neuron's arrivals of the spikes ``pre_times`` before ``t_end``."""
        n_in, slots = pre_times.shape
        times = (pre_times[None, :, :] + self.delay[:, :, None]).reshape(self.n, -1)
        times = torch.where(times < t_end, times, torch.inf)
        weights = self.weight[:, :, None].expand(-1, -1, slots).reshape(self.n, -1)
        order = torch.argsort(times, dim=1, stable=True)
        pad = torch.full((self.n, 1), torch.inf, dtype=torch.float64)
        times = torch.cat([times.gather(1, order), pad], dim=1)
        weights = torch.cat([weights.gather(1, order), pad.zero_()], dim=1)
        return _Arrivals(times, weights, order // slots, order % slots)

    def forward(self, pre_times: torch.Tensor, t_end: float, dt: float) -> list[list[_Spike]]:
        times, weights, _, _ = self.arrivals(pre_times, t_end)
        zero = torch.zeros(self.n, dtype=torch.float64)
        x = self.model.init(_env(self.model, self.params), zero)
        t, ptr = zero.clone(), torch.zeros(self.n, dtype=torch.long)
        spikes: list[list[_Spike]] = [[] for _ in range(self.n)]
        for step in range(int(round(t_end / dt))):
            end = torch.full_like(t, min((step + 1) * dt, t_end))
            while True:
                due = times.gather(1, ptr[:, None])[:, 0]
                x, t = self.advance(x, t, torch.minimum(due, end), spikes)
                arriving = due < end
                if not bool(arriving.any()):
                    break
                w = weights.gather(1, ptr[:, None])[:, 0]
                jumped = self.model.synapse(_env(self.model, self.params, x=x, w=w), zero)
                x = [torch.where(arriving, a, b) for a, b in zip(jumped, x, strict=True)]
                ptr = ptr + arriving.long()
        return spikes

    def advance(
        self, x: list[torch.Tensor], t: torch.Tensor, to: torch.Tensor, spikes: list[list[_Spike]]
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """x and t moved to ``to``, spiking and resetting at each crossing on the way."""
        while True:
            length = to - t
            crossing, s = self.first_crossing(x, length)
            moved = self.flow(x, torch.where(crossing, s, length))
            if not bool(crossing.any()):
                return moved, to.clone()
            for j in crossing.nonzero()[:, 0].tolist():
                before = torch.stack([m[j] for m in moved])
                spikes[j].append(_Spike(float(t[j] + s[j]), before))
            reset = self.model.reset(_env(self.model, self.params, x=moved), t)
            margin = self.value(self.model.margin, moved)
            if bool((crossing & (margin >= 0)).any()):
                raise RuntimeError("A reset did not leave the threshold (g(h(x)) ≥ 0) at a spike.")
            x = [torch.where(crossing, r, m) for r, m in zip(reset, moved, strict=True)]
            t = torch.where(crossing, t + s, to)

    def first_crossing(
        self, x: list[torch.Tensor], length: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Whether g reaches 0 within (0, length] of the flow from x (g(x) < 0), and where:
        the first crossing of ``model.parts`` equal sub-intervals, each searched by
        :meth:`crossing_in`."""
        if self.model.parts == 1:
            return self.crossing_in(x, length)
        piece = length / self.model.parts
        found, where = torch.zeros_like(length, dtype=torch.bool), length.clone()
        for k in range(self.model.parts):
            crossing, s = self.crossing_in(x, torch.where(found, 0.0, piece))
            where = torch.where(crossing & ~found, k * piece + s, where)
            found = found | crossing
            if bool(found.all()):
                break
            x = self.flow(x, piece)
        return found, where

    def crossing_in(
        self, x: list[torch.Tensor], length: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Whether g reaches 0 within (0, length] of the flow from x (g(x) < 0), and where,
        given at most one zero of ġ there."""
        end = self.flow(x, length)
        g_end = self.value(self.model.g, end)
        rate_0, rate_end = self.value(self.model.g_dot, x), self.value(self.model.g_dot, end)
        turns = (rate_0 * rate_end < 0) & (length > 0)
        zero = torch.zeros_like(length)
        if bool(turns.any()):
            peak = self.root(
                self.model.g_dot, self.model.g_ddot, x, zero, length, rate_0 < 0, turns
            )
        else:
            peak = length
        g_peak = torch.where(turns, self.value(self.model.g, self.flow(x, peak)), g_end)
        first = (g_peak >= 0) & (length > 0)
        second = ~first & turns & (g_end >= 0)
        crossing = first | second
        if not bool(crossing.any()):
            return crossing, length
        lo, hi = torch.where(first, zero, peak), torch.where(first, peak, length)
        ones = torch.ones_like(crossing)
        return crossing, self.root(self.model.g, self.model.g_dot, x, lo, hi, ones, crossing)

    def root(
        self,
        fn: Callable[..., list[torch.Tensor]],
        slope: Callable[..., list[torch.Tensor]],
        x: list[torch.Tensor],
        lo: torch.Tensor,
        hi: torch.Tensor,
        rising: torch.Tensor,
        active: torch.Tensor,
    ) -> torch.Tensor:
        return _root(self.flow, self.value, (fn, slope), x, (lo, hi), rising, active)


def _root(
    flow: Callable[[Any, torch.Tensor], Any],
    value: Callable[[Callable[..., list[torch.Tensor]], Any], torch.Tensor],
    fns: tuple[Callable[..., list[torch.Tensor]], Callable[..., list[torch.Tensor]]],
    x: Any,
    bracket: tuple[torch.Tensor, torch.Tensor],
    rising: torch.Tensor,
    active: torch.Tensor,
) -> torch.Tensor:
    """The zero of ``fns[0]`` (slope ``fns[1]``) along ``flow`` from x within ``bracket``,
    where it changes sign once (from negative where ``rising``): Newton's method kept in
    the bracket, bisection where it leaves it, to rounding. Rows not ``active`` return
    the bracket's upper end."""
    fn, slope = fns
    lo, hi = bracket
    s = 0.5 * (lo + hi)
    for _ in range(200):
        at = flow(x, s)
        v = value(fn, at)
        below = (v < 0) == rising
        lo, hi = torch.where(below, s, lo), torch.where(below, hi, s)
        newton = s - v / value(slope, at)
        inside = (newton > lo) & (newton < hi)
        new = torch.where(inside, newton, 0.5 * (lo + hi))
        new = torch.where(v == 0, s, new)
        done = (new - s).abs() <= 2 * _EPS * s.abs().clamp_min(1e-300)
        s = new
        if bool((done | ~active).all()):
            break
    return torch.where(active, s, hi)


def event_network(
    neuron: Definition,
    layers: Sequence[EventLayer],
    input_times: torch.Tensor,
    *,
    t_end: float,
    system: ODESystem | None = None,
    target: str | None = None,
    grazing: float = 1e-3,
) -> tuple[torch.Tensor, ...]:
    """Each layer's spike times [n_l, K_l] (+inf padded, ascending) of a feedforward
    network of ``neuron`` (a linear ODE neuron, :meth:`~symneuron.Neuron.from_ode`) run
    exactly up to ``t_end`` in steps of its ``dt``, differentiable by EventProp in each
    layer's weights, delays and given params and in ``input_times`` ([n_in, K], +inf
    padded).

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
                neuron, layers, x, t_end=t_end, system=system, target=target, grazing=grazing
            )
            for x in input_times
        ]
        return tuple(_stacked([row[i] for row in rows]) for i in range(len(layers)))
    model, dt = _model(neuron, system, target)
    flat: list[torch.Tensor] = []
    for layer in layers:
        flat += [layer.weight, layer.delay, *(layer.params[n] for n in sorted(layer.params))]
    shapes = [sorted(layer.params) for layer in layers]
    return tuple(_EventProp.apply(model, shapes, (t_end, dt, grazing), input_times, *flat))


def _model(
    neuron: Definition, system: ODESystem | None, target: str | None
) -> tuple[_Model, float]:
    """The memoised torch functions of ``neuron``'s EventProp spec, and its step."""
    system = system if system is not None else getattr(neuron, "ode", None)
    key = (neuron, repr(system), target)
    model = _MODELS.get(key)
    if model is None:
        model = _MODELS.put(key, _Model(neuron, derive_events(neuron, system, target=target)))
    assert system is not None  # derive_events refuses a neuron without one
    return model, system.dt


def _layers(model: _Model, shapes: list[list[str]], flat: Sequence[torch.Tensor]) -> list[_Layer]:
    out, i = [], 0
    for names in shapes:
        weight, delay = flat[i], flat[i + 1]
        params = dict(zip(names, flat[i + 2 : i + 2 + len(names)], strict=True))
        out.append(
            _Layer(
                model,
                EventLayer(
                    weight.detach(), delay.detach(), {k: v.detach() for k, v in params.items()}
                ),
                weight.shape[0],
            )
        )
        i += 2 + len(names)
    return out


class GrazingSpikeWarning(RuntimeWarning):
    """A spike at which the threshold function barely rises (ġ⁻ below a tolerance):
    its time's derivative, and so EventProp's jump, scales with 1/ġ⁻."""


def _report_grazing(
    layer: _Layer, index: int, spikes: list[list[_Spike]], tolerance: float
) -> None:
    """A :class:`GrazingSpikeWarning` for each spike of ``layer`` with ġ⁻ < tolerance."""
    found = [(j, spike) for j, row in enumerate(spikes) for spike in row]
    if not found:
        return
    neurons = torch.tensor([j for j, _ in found])
    states = torch.stack([spike.before for _, spike in found], dim=1)
    params = {n: v[neurons] for n, v in layer.params.items()}
    env = _env(layer.model, params, x=states)
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


def _padded(spikes: list[list[_Spike]]) -> torch.Tensor:
    slots = max(1, max(len(s) for s in spikes))
    out = torch.full((len(spikes), slots), torch.inf, dtype=torch.float64)
    for j, row in enumerate(spikes):
        out[j, : len(row)] = torch.tensor([sp_.time for sp_ in row], dtype=torch.float64)
    return out


class _EventProp(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        model: _Model,
        shapes: list[list[str]],
        times_: tuple[float, float, float],
        input_times: torch.Tensor,
        *flat: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        t_end, dt, grazing = times_
        layers = _layers(model, shapes, flat)
        times, spikes = input_times.detach(), []
        for index, layer in enumerate(layers):
            spikes.append(layer.forward(times, t_end, dt))
            _report_grazing(layer, index, spikes[-1], grazing)
            times = _padded(spikes[-1])
        ctx.saved = (model, shapes, t_end, dt, layers, spikes, input_times.detach())
        return tuple(_padded(s) for s in spikes)

    @staticmethod
    def backward(ctx: Any, *grad_times: torch.Tensor) -> tuple[Any, ...]:
        model, shapes, t_end, dt, layers, spikes, input_times = ctx.saved
        grads: list[_Grads] = []
        later_b = torch.zeros_like(grad_times[-1])
        for index in reversed(range(len(layers))):
            pre = input_times if index == 0 else _padded(spikes[index - 1])
            own_b = later_b - grad_times[index]  # B = Σ Q − ∂L/∂t_k
            grads.append(_backward_layer(layers[index], pre, spikes[index], own_b, t_end, dt))
            later_b = grads[-1].source_b
        flat: list[torch.Tensor] = []
        for names, layer in zip(shapes, reversed(grads), strict=True):
            flat += [layer.weight, layer.delay, *(layer.params[n] for n in names)]
        grad_input = torch.where(torch.isfinite(input_times), -later_b, 0.0)
        return (None, None, None, grad_input, *flat)


def _backward_layer(
    layer: _Layer,
    pre_times: torch.Tensor,
    spikes: list[list[_Spike]],
    own_b: torch.Tensor,
    t_end: float,
    dt: float,
) -> _Grads:
    """One layer's gradients, neuron by neuron, given each of its spikes' B."""
    arrivals = layer.arrivals(pre_times, t_end)
    grads = _Grads(
        torch.zeros_like(layer.weight),
        torch.zeros_like(layer.delay),
        {n: torch.zeros(layer.n, dtype=torch.float64) for n in layer.model.names},
        torch.zeros_like(pre_times),
    )
    for j in range(layer.n):
        row = _Arrivals(*(part[j] for part in arrivals))
        _Neuron(layer, j, dt).backward(row, spikes[j], own_b[j], t_end, grads)
    return grads


class _Neuron:
    """One neuron's replay of its forward (its states at its events) and its adjoint."""

    def __init__(self, layer: _Layer, j: int, dt: float) -> None:
        self.model, self.dt, self.j = layer.model, dt, j
        self.params = {n: v[j] for n, v in layer.params.items()}
        self.one = torch.ones((), dtype=torch.float64)

    def env(self, **parts: Any) -> dict[sp.Symbol, Any]:
        return _env(self.model, self.params, **parts)

    def flow(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """x [k] (or [k, q] with s [q]) after the flow over s."""
        env = self.env(s=s)
        k = x.shape[0]
        like = s if isinstance(s, torch.Tensor) else self.one
        phi = torch.stack(self.model.flow(env, like)).reshape(k, k, *like.shape)
        gamma = torch.stack(self.model.offset(env, like))
        return torch.einsum("ij...,j...->i...", phi, x) + gamma

    def adjoint_flow(self, lam: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """λ(t − s) = Φ(s)ᵀ λ(t)."""
        like = s if isinstance(s, torch.Tensor) else self.one
        k = lam.shape[0]
        phi = torch.stack(self.model.flow(self.env(s=s), like)).reshape(k, k, *like.shape)
        return torch.einsum("ji...,j...->i...", phi, lam)

    def events(
        self, arrivals: _Arrivals, spikes: list[_Spike], kicks: Sequence[_Kick] = ()
    ) -> list[tuple[float, str, int]]:
        """The neuron's events in forward order: (time, "kick"|"arrival"|"spike", index);
        at one time a kick (a loss's ∂L/∂x there) before an arrival before a spike."""
        times = arrivals.times.tolist()
        out = [(float(t), "arrival", a) for a, t in enumerate(times) if np.isfinite(t)]
        out += [(s.time, "spike", k) for k, s in enumerate(spikes)]
        out += [(kick.time, "kick", k) for k, kick in enumerate(kicks)]
        return sorted(out, key=lambda e: (e[0], _ORDER[e[1]]))

    def replay(
        self, events: list[tuple[float, str, int]], arrivals: _Arrivals, spikes: list[_Spike]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The state before each event, and after each (after[0]: at t = 0)."""
        x = torch.stack(self.model.init(self.env(), self.one))
        after, before, t = [x], [], 0.0
        for time, kind, index in events:
            x = self.flow(x, torch.tensor(time - t, dtype=torch.float64))
            before.append(x)
            if kind == "spike":
                x = torch.stack(self.model.reset(self.env(x=spikes[index].before), self.one))
            elif kind == "arrival":
                w = arrivals.weights[index]
                x = torch.stack(self.model.synapse(self.env(x=x, w=w), self.one))
            after.append(x)
            t = time
        return before, after

    def backward(
        self,
        arrivals: _Arrivals,
        spikes: list[_Spike],
        own_b: torch.Tensor,
        t_end: float,
        grads: _Grads,
        loss: _StateLoss = _NO_STATE_LOSS,
    ) -> None:
        """λ from t_end back to 0 through the neuron's events, adding into ``grads``;
        ``loss`` adds ∂L/∂x at its kicks and a continuous source ∂ℓ_V/∂x."""
        events = self.events(arrivals, spikes, loss.kicks)
        before, after = self.replay(events, arrivals, spikes)
        lam, upper = torch.zeros_like(after[0]), t_end
        for e in range(len(events), 0, -1):
            time, kind, index = events[e - 1]
            lam = self.integrate(time, upper, after[e], lam, grads.params, loss.source)
            if kind == "spike":
                lam = self.spike(spikes[index], lam, float(own_b[index]), grads.params)
            elif kind == "arrival":
                lam = self.arrival(arrivals, index, before[e - 1], lam, grads)
            else:
                lam = lam + loss.kicks[index].value
            upper = time
        self.integrate(0.0, upper, after[0], lam, grads.params, loss.source)

    def arrival(
        self, arrivals: _Arrivals, index: int, x: torch.Tensor, lam: torch.Tensor, grads: _Grads
    ) -> torch.Tensor:
        """λ before an arrival; dL/dw += λ·∂m/∂w, dL/dd −= Q, the source's B += Q."""
        i, k = int(arrivals.source[index]), int(arrivals.slot[index])
        env = self.env(x=x, lam=lam, w=arrivals.weights[index])
        grads.weight[self.j, i] += self.model.weight_partial(env, self.one)[0]
        q = self.model.target_term(env, self.one)[0]
        grads.delay[self.j, i] -= q
        grads.source_b[i, k] += q
        return torch.stack(self.model.synapse_t(env, self.one))

    def spike(
        self, spike: _Spike, lam: torch.Tensor, b: float, grad_p: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        env = self.env(x=spike.before, lam=lam, B=torch.tensor(b, dtype=torch.float64))
        for n, term in zip(self.model.names, self.model.spike_partials(env, self.one), strict=True):
            grad_p[n][self.j] += term
        return torch.stack(self.model.jump(env, self.one))

    def pieces(self, start: float, upper: float) -> list[float]:
        """[start, upper] cut into pieces no longer than ``dt``."""
        cuts = [start]
        while cuts[-1] + self.dt < upper:
            cuts.append(cuts[-1] + self.dt)
        cuts.append(upper)
        return cuts

    def integrate(
        self,
        start: float,
        upper: float,
        x_start: torch.Tensor,
        lam: torch.Tensor,
        grad_p: dict[str, torch.Tensor],
        source: _Source | None = None,
    ) -> torch.Tensor:
        """λ at ``start`` from λ at ``upper``, adding ∫λ·∂f/∂θ over [start, upper]."""
        cuts = self.pieces(start, upper)
        states = [x_start]
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            states.append(self.flow(states[-1], torch.tensor(b - a, dtype=torch.float64)))
        for piece in range(len(cuts) - 2, -1, -1):
            a, b = cuts[piece], cuts[piece + 1]
            length = b - a
            if length > 0:
                nodes = torch.tensor(0.5 * length * (_GAUSS_NODES + 1), dtype=torch.float64)
                xs = self.flow(states[piece][:, None].expand(-1, nodes.numel()), nodes)
                lams = self.adjoint_at(lam, b, a + nodes, source)
                values = self.model.integrands(self.env(x=xs, lam=lams), nodes)
                weights = torch.tensor(0.5 * length * _GAUSS_WEIGHTS, dtype=torch.float64)
                for n, v in zip(self.model.names, values, strict=True):
                    grad_p[n][self.j] += (weights * v).sum()
                lam = self.adjoint_at(lam, b, torch.tensor([a], dtype=torch.float64), source)[:, 0]
        return lam

    def adjoint_at(
        self, lam: torch.Tensor, upper: float, times: torch.Tensor, source: _Source | None
    ) -> torch.Tensor:
        """λ [k, q] at ``times`` [q] ≤ ``upper`` from λ(upper), no event between:
        Φ(upper − t)ᵀλ(upper) + ∫_t^upper Φ(τ − t)ᵀ ∂ℓ_V/∂x(τ) dτ, the source's integral
        by Gauss–Legendre on [t, upper]."""
        out = self.adjoint_flow(lam[:, None].expand(-1, times.numel()), upper - times)
        if source is None:
            return out
        span = (upper - times)[:, None]
        taus = times[:, None] + 0.5 * span * torch.as_tensor(_GAUSS_NODES + 1)
        pushed = self.adjoint_flow(source(taus.reshape(-1)), (taus - times[:, None]).reshape(-1))
        weights = 0.5 * span * torch.as_tensor(_GAUSS_WEIGHTS)
        return out + (pushed.reshape(-1, *taus.shape) * weights).sum(-1)


def first_spike_cross_entropy(
    times: torch.Tensor, label: int | torch.Tensor, tau0: float, t_end: float
) -> torch.Tensor:
    """−log p_label with p = softmax(−t/τ₀) over the outputs' first spike times (a silent
    output counts as ``t_end``, with no gradient): ∂L/∂t_j = (δ_j,label − p_j)/τ₀
    (Göltz et al. 2021; EVENTPROP.md (d)). A batch, ``times`` [batch, n, K] and
    ``label`` [batch], gives the mean over the batch, as ``F.cross_entropy`` does."""
    first = times[..., 0]
    silent = ~torch.isfinite(first)
    first = torch.where(silent, torch.full_like(first, t_end), first)
    log_p = torch.log_softmax(-first / tau0, dim=-1)
    if times.dim() == 3:
        return torch.nn.functional.nll_loss(log_p, torch.as_tensor(label))
    return -log_p[label]


class MaxVoltage(NamedTuple):
    """:func:`max_voltage`'s result, as ``torch.max``'s: each readout's maximum of V
    (differentiable) and the time it is reached (not)."""

    values: torch.Tensor
    times: torch.Tensor


def max_voltage(
    neuron: Definition,
    readout: EventLayer,
    input_times: torch.Tensor,
    *,
    t_end: float,
    system: ODESystem | None = None,
    target: str | None = None,
) -> MaxVoltage:
    """y_j = max over [0, t_end] of V_j of a readout layer of ``neuron`` fed the spikes
    ``input_times`` ([n_in, K], +inf padded: an :func:`event_network` layer's output),
    differentiable by EventProp in the readout's weights, delays and given params and in
    ``input_times``.

    A readout does not spike: this function runs ``neuron``'s dynamics and synapse only,
    never its threshold or reset (a LIF of the hidden layers serves as its own readout).
    The gradient kicks λ_V by ∂L/∂y_j at the maximum's time t*_j; where t*_j is an
    arrival t_a (V rising, then an inhibitory input), y moves with it:
    ∂L/∂t_a = ∂L/∂y_j·V̇⁻(t_a) joins that arrival's delay gradient and its source's
    spike time (EVENTPROP.md (d)). Elsewhere V̇(t*) = 0 (or t* is 0 or ``t_end``).
    A batch, ``input_times`` [batch, n_in, K], gives [batch, n_out].

    Examples
    --------
    >>> import sympy as sp, torch, symneuron as sn
    >>> from symneuron.reference.events import EventLayer, max_voltage
    >>> tau_m, tau_s, I = sp.symbols("tau_m tau_s I", positive=True)
    >>> lif = sn.Neuron.from_ode((-sn.V + I) / tau_m, dt=1.0, method="exact",
    ...     params={tau_m: 10.0, tau_s: 5.0}, states={I: sn.ODEState(-I / tau_s + sn.X)})
    >>> w = torch.tensor([[2.0], [1.0]], dtype=torch.float64, requires_grad=True)
    >>> y = max_voltage(lif, EventLayer(w, torch.zeros(2, 1, dtype=torch.float64)),
    ...     torch.tensor([[1.0]], dtype=torch.float64), t_end=30.0).values
    >>> torch.nn.functional.cross_entropy(y[None], torch.tensor([0])).backward()
    >>> bool(w.grad[0, 0] < 0 < w.grad[1, 0])
    True
    """
    if input_times.dim() == 3:
        rows = [
            max_voltage(neuron, readout, x, t_end=t_end, system=system, target=target)
            for x in input_times
        ]
        return MaxVoltage(*(torch.stack(part) for part in zip(*rows, strict=True)))
    model, dt = _model(neuron, system, target)
    names = sorted(readout.params)
    loss = _ReadoutLoss("max", None, t_end)
    flat = [readout.weight, readout.delay, *(readout.params[n] for n in names)]
    values, times = _Readout.apply(model, names, dt, loss, input_times, *flat)
    return MaxVoltage(values, times)


def mean_voltage(
    neuron: Definition,
    readout: EventLayer,
    input_times: torch.Tensor,
    *,
    t_end: float,
    tau_weight: float | None = None,
    system: ODESystem | None = None,
    target: str | None = None,
) -> torch.Tensor:
    """y_j = (1/T)∫₀ᵀ κ(t) V_j dt (T = ``t_end``; κ = 1, or e^{−t/τ} with ``tau_weight``)
    of a readout layer of ``neuron``, as :func:`max_voltage` runs it (no threshold, no
    reset), differentiable by EventProp: a continuous source −∂L/∂y_j·κ(t)/T in dλ_V/dt,
    no jump. Both integrals (the forward's and the adjoint's) are 8-point Gauss–Legendre
    on pieces of at most ``dt`` between arrivals, exact to rounding for dt ≤ τ.
    A batch, ``input_times`` [batch, n_in, K], gives [batch, n_out].

    >>> import sympy as sp, torch, symneuron as sn
    >>> from symneuron.reference.events import EventLayer, mean_voltage
    >>> tau_m, tau_s, I = sp.symbols("tau_m tau_s I", positive=True)
    >>> lif = sn.Neuron.from_ode((-sn.V + I) / tau_m, dt=1.0, method="exact",
    ...     params={tau_m: 10.0, tau_s: 5.0}, states={I: sn.ODEState(-I / tau_s + sn.X)})
    >>> w = torch.ones(1, 1, dtype=torch.float64)
    >>> y = mean_voltage(lif, EventLayer(w, torch.zeros(1, 1, dtype=torch.float64)),
    ...     torch.tensor([[0.0]], dtype=torch.float64), t_end=1000.0)
    >>> round(float(y) * 1000.0, 6)  # ∫V dt = ∫I dt = w·τ_s over all time
    5.0
    """
    if input_times.dim() == 3:
        return torch.stack(
            [
                mean_voltage(
                    neuron,
                    readout,
                    x,
                    t_end=t_end,
                    tau_weight=tau_weight,
                    system=system,
                    target=target,
                )
                for x in input_times
            ]
        )
    model, dt = _model(neuron, system, target)
    names = sorted(readout.params)
    loss = _ReadoutLoss("mean", tau_weight, t_end)
    flat = [readout.weight, readout.delay, *(readout.params[n] for n in names)]
    values, _ = _Readout.apply(model, names, dt, loss, input_times, *flat)
    return values


class _ReadoutLoss(NamedTuple):
    kind: str  # "max" or "mean"
    tau_weight: float | None
    t_end: float


class _Peak(NamedTuple):
    """A readout's maximum: V there, its time, and the arrival it sits on (or None)."""

    value: torch.Tensor
    time: float
    arrival: int | None


class _Read:
    """One readout neuron's run: its events, states at them, and the loss's value."""

    def __init__(self, layer: _Layer, j: int, dt: float, arrivals: _Arrivals, t_end: float):
        if layer.model.parts != 1:
            raise NotImplementedError(
                "Readouts locate V's maxima for two states (V̇ has at most one zero between "
                f"arrivals); {layer.model.definition.name} has {len(layer.model.spec.states)}."
            )
        self.neuron = _Neuron(layer, j, dt)
        self.row = _Arrivals(*(part[j] for part in arrivals))
        self.events = self.neuron.events(self.row, [])
        self.before, self.after = self.neuron.replay(self.events, self.row, [])
        self.starts = [0.0, *(e[0] for e in self.events)]
        self.ends = [*self.starts[1:], t_end]

    def value(self, fn: Callable[..., list[torch.Tensor]], at: torch.Tensor) -> torch.Tensor:
        return fn(self.neuron.env(x=at), at[0])[0]

    def peak(self) -> _Peak:
        """max V over the pieces between arrivals: their starts, the end, and each
        piece's interior maximum (V̇ from + to −, at most one zero for two states)."""
        model, flow = self.neuron.model, self.neuron.flow
        x0 = torch.stack(self.after, dim=1)
        lengths = torch.tensor(self.ends, dtype=torch.float64) - torch.tensor(self.starts)
        rate_0 = self.value(model.voltage_rate, x0)
        rate_end = self.value(model.voltage_rate, flow(x0, lengths))
        turns = (rate_0 > 0) & (rate_end < 0) & (lengths > 0)
        fns = (model.voltage_rate, model.voltage_slope)
        zero = torch.zeros_like(lengths)
        s = _root(flow, self.value, fns, x0, (zero, lengths), turns & False, turns)
        inner = torch.where(turns, self.value(model.voltage, flow(x0, s)), -torch.inf)
        last = self.value(model.voltage, flow(x0[:, -1:], lengths[-1:]))
        candidates = torch.cat([self.value(model.voltage, x0), inner, last])
        best, q = int(torch.argmax(candidates)), len(self.starts)
        if best < q:
            arrival = self.events[best - 1][2] if best > 0 else None
            return _Peak(candidates[best], self.starts[best], arrival)
        if best < 2 * q:
            return _Peak(candidates[best], self.starts[best - q] + float(s[best - q]), None)
        return _Peak(candidates[best], self.ends[-1], None)

    def mean(self, weight: Callable[[torch.Tensor], torch.Tensor], t_end: float) -> torch.Tensor:
        """(1/T)∫κ(t)V dt by Gauss–Legendre on pieces of at most dt."""
        total = torch.zeros((), dtype=torch.float64)
        for x, start, end in zip(self.after, self.starts, self.ends, strict=True):
            cuts = self.neuron.pieces(start, end)
            for a, b in zip(cuts[:-1], cuts[1:], strict=True):
                nodes = torch.tensor(0.5 * (b - a) * (_GAUSS_NODES + 1), dtype=torch.float64)
                at = self.neuron.flow(x[:, None].expand(-1, nodes.numel()), nodes)
                kappa = weight(a + nodes)
                total = (
                    total + (0.5 * (b - a) * torch.as_tensor(_GAUSS_WEIGHTS) * kappa * at[0]).sum()
                )
                x = self.neuron.flow(x, torch.tensor(b - a, dtype=torch.float64))
        return total / t_end


def _weighting(tau: float | None) -> Callable[[torch.Tensor], torch.Tensor]:
    if tau is None:
        return torch.ones_like
    return lambda t: torch.exp(-t / tau)


def _peak_time_term(read: _Read, peak: _Peak, grad_y: torch.Tensor) -> torch.Tensor:
    """∂L/∂t_a = ∂L/∂y·V̇⁻(t_a) of a maximum on an arrival (0 elsewhere)."""
    if peak.arrival is None:
        return torch.zeros((), dtype=torch.float64)
    index = [e[2] for e in read.events].index(peak.arrival)
    return grad_y * read.value(read.neuron.model.voltage_rate, read.before[index][:, None])[0]


class _Readout(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        model: _Model,
        names: list[str],
        dt: float,
        loss: _ReadoutLoss,
        input_times: torch.Tensor,
        *flat: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        (layer,) = _layers(model, [names], flat)
        arrivals = layer.arrivals(input_times.detach(), loss.t_end)
        reads = [_Read(layer, j, dt, arrivals, loss.t_end) for j in range(layer.n)]
        if loss.kind == "max":
            peaks = [read.peak() for read in reads]
            values = torch.stack([p.value for p in peaks])
            times = torch.tensor([p.time for p in peaks], dtype=torch.float64)
        else:
            weight = _weighting(loss.tau_weight)
            peaks = []
            values = torch.stack([read.mean(weight, loss.t_end) for read in reads])
            times = torch.full_like(values, torch.nan)
        ctx.saved = (model, names, loss, layer, arrivals, reads, peaks, input_times.detach())
        ctx.mark_non_differentiable(times)
        return values, times

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor, _: torch.Tensor) -> tuple[Any, ...]:
        model, names, loss, layer, arrivals, reads, peaks, input_times = ctx.saved
        grads = _Grads(
            torch.zeros_like(layer.weight),
            torch.zeros_like(layer.delay),
            {n: torch.zeros(layer.n, dtype=torch.float64) for n in model.names},
            torch.zeros_like(input_times),
        )
        e_v = torch.zeros(len(model.spec.states), dtype=torch.float64)
        e_v[0] = 1.0
        none = torch.zeros(0, dtype=torch.float64)
        for j, read in enumerate(reads):
            c = grad_y[j]
            if loss.kind == "max":
                state_loss = _StateLoss(kicks=[_Kick(peaks[j].time, c * e_v)])
            else:
                weight = _weighting(loss.tau_weight)
                source = _source(e_v, c / loss.t_end, weight)
                state_loss = _StateLoss(source=source)
            read.neuron.backward(read.row, [], none, loss.t_end, grads, state_loss)
            if loss.kind == "max" and peaks[j].arrival is not None:
                term = _peak_time_term(read, peaks[j], c)
                a = peaks[j].arrival
                i, k = int(read.row.source[a]), int(read.row.slot[a])
                grads.delay[j, i] += term
                grads.source_b[i, k] -= term
        grad_input = torch.where(torch.isfinite(input_times), -grads.source_b, 0.0)
        return (
            None,
            None,
            None,
            None,
            grad_input,
            grads.weight,
            grads.delay,
            *(grads.params[n] for n in names),
        )


def _source(
    direction: torch.Tensor, scale: torch.Tensor, weight: Callable[[torch.Tensor], torch.Tensor]
) -> _Source:
    return lambda taus: direction[:, None] * (scale * weight(taus))[None, :]
