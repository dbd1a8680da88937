"""A neuron's EventProp spec as torch functions, and the zero search along its flow.

The float64 EventProp reference (:mod:`.events`) evaluates only what
:func:`~symneuron.derivation.events.derive_events` derived: the closed-form flow
x(s) = Φ(s)x + Γ(s), the threshold function g and its rates, the reset, the synapse,
the adjoint's jumps and the parameter terms, each made a torch function of
(*x, *λ, w, B, s, *θ) once per neuron (:func:`model_of`). :func:`root_along_flow` finds
where such a function changes sign along the flow: a spike's time, a turn of ġ or V̇.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sympy as sp
import torch

from ..definition import Definition
from ..derivation.events import EventSpec, derive_events, system_text
from ..memo import BoundedTable
from ..ode import ODESystem
from .equations import torch_function

__all__ = ["EventModel", "symbol_values", "model_of", "root_along_flow"]

_EPS = float(torch.finfo(torch.float64).eps)
#: Sub-intervals a crossing search cuts a piece into for more than two states: g along
#: the flow is a sum of n exponentials and a constant, ġ has at most n − 1 zeros, and
#: each sub-interval is taken to hold at most one.
_PARTS = 8


class EventModel:
    """A spec's expressions as torch functions of (*x, *λ, w, B, s, *θ)."""

    def __init__(self, definition: Definition, spec: EventSpec) -> None:
        self.spec, self.definition = spec, definition
        #: sub-intervals a crossing search cuts each into
        #: (:meth:`.event_forward.Layer.first_crossing`)
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
        if spec.flow is None or spec.flow_offset is None:
            self.flow = self.offset = _no_flow(definition.name)
        else:
            self.flow = self._vector(list(spec.flow))
            self.offset = self._vector(list(spec.flow_offset))
        #: f(x) and dλ/dt = −Jᵀλ, for the RK4 path (:mod:`.event_rk4`)
        self.rhs = self._vector(list(spec.rhs))
        self.adjoint_rhs = self._vector(list(spec.adjoint_rhs))
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


def _no_flow(name: str) -> Callable[..., list[torch.Tensor]]:
    def refuse(*_: Any) -> list[torch.Tensor]:
        raise NotImplementedError(
            f"{name} is nonlinear (its Jacobian depends on the state): it has no closed-form "
            "flow. event_network runs it by RK4 (integrator='rk4'); readouts need a linear "
            "model."
        )

    return refuse


def symbol_values(
    model: EventModel, params: Mapping[str, torch.Tensor], **parts: Any
) -> dict[sp.Symbol, Any]:
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
_MODELS: BoundedTable[tuple[Definition, str, str | None], EventModel] = BoundedTable(
    16, "reference.event_model.models"
)


def root_along_flow(
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


def model_of(
    neuron: Definition, system: ODESystem | None, target: str | None
) -> tuple[EventModel, float]:
    """The memoised torch functions of ``neuron``'s EventProp spec, and its step."""
    system = system if system is not None else getattr(neuron, "ode", None)
    key = (neuron, system_text(system), target)
    model = _MODELS.get(key)
    if model is None:
        model = _MODELS.put(key, EventModel(neuron, derive_events(neuron, system, target=target)))
    assert system is not None  # derive_events refuses a neuron without one
    return model, system.dt
