"""``Neuron``: a definition together with its derived views.

:class:`Neuron` is a :class:`~symneuron.definition.Definition` (the validated,
immutable equations) that also answers what the later stages make of it: its
partials (:meth:`~Neuron.derivatives`, derived and checked at construction), its
:class:`~symneuron.derivation.KernelSpec` (:meth:`~Neuron.spec`) and its
generated kernel source (:meth:`~Neuron.source`). It sits above the derivation
and code-generation stages and delegates to them; nothing below imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import sympy as sp

from . import derivation, ode
from .codegen import render_source
from .definition import Definition, H, V, X
from .derivation.events import EventSpec, derive_events
from .memo import BoundedTable

if TYPE_CHECKING:
    import torch

__all__ = ["Neuron", "VIEW_NODES"]

#: The largest step (nodes of its expression tree) that a view shows with its stages
#: substituted; the zoo's largest below it is FitzHugh–Nagumo's rk4 step (841 nodes),
#: above it Morris–Lecar's (7,778 nodes, whose partials print as 630,000 characters of
#: LaTeX) and Wang–Buzsáki's (6.6 million).
VIEW_NODES = 2_000

#: (neuron key, staged expression) -> its view (substituting takes seconds for large steps)
_VIEWS: BoundedTable[tuple[str, sp.Expr], sp.Expr] = BoundedTable(1024, "neuron.views")


class Neuron(Definition):
    """A spiking neuron defined by its charge function H = f(V, X; θ).

    A neuron is immutable: :meth:`replace` builds a changed copy.

    Parameters
    ----------
    charge : sympy.Expr
        f(V, X, params): the membrane potential after charging, from the state
        before charging ``V`` (:data:`symneuron.V`) and this step's input ``X``
        (:data:`symneuron.X`). Plain ``sympy.Symbol("V")``/``("X")`` work too.
        It may add noise: :data:`symneuron.noise` is one standard-normal draw per
        neuron and step, entering linearly (``sigma*sn.noise``; docs/noise.md).
    params : mapping, optional
        Each parameter symbol (or its name) to its default value.
    learnable : iterable, optional
        Parameters (symbols or names) that receive gradients.
    v_threshold : float or sympy.Expr
        Firing threshold: S = Θ(H − v_threshold), with Θ(0) = 1. An expression in the
        params (e.g. a param symbol listed in ``learnable``) makes it learnable.
    v_reset : float, sympy.Expr or None
        Hard reset value (a number or an expression in the params); ``None``
        selects the soft reset V = H − v_threshold·S.
    surrogate : Surrogate
        Surrogate whose derivative stands in for dΘ/du in the backward pass.
    detach_reset : bool
        Treat S as a constant inside the reset (no gradient through it).
    name : str, optional
        Used in reprs and kernel names.
    states : mapping, optional
        Extra state variables: each symbol (or name) to its :class:`~symneuron.State`.
    firing : {"level", "crossing", "escape"}
        ``"level"`` (default): S[t] = Θ(H[t] − v_threshold), then the reset.
        ``"crossing"``: S[t] = Θ(H[t] − θ)·[V[t−1] < θ], a spike when H crosses the
        threshold from below, and no reset (V[t] = H[t]; states keep W̃), as for
        Hodgkin–Huxley. Its surrogate gradient is σ'(H − θ)·[V[t−1] < θ]: the
        crossing gate is a constant in the backward pass.
        ``"escape"``: S[t] = [u < p(H[t])] with u uniform in (0, 1) (escape noise),
        then the reset; the backward takes dp/dH for dS/dH (straight through p).
    spike_probability : sympy.Expr, optional
        p(H) of ``firing="escape"``, in :data:`symneuron.H` and the params; it must lie
        in [0, 1] (checked at the default params for H in [−1000, 1000]).
    v_init : float, optional
        V[0] when ``simulate`` is given no ``v_init``; defaults to ``v_reset`` (0
        under soft reset or crossing firing).
    stages : sequence of (name, sympy.Expr), optional
        Named intermediate values of the step, in evaluation order, that the charge and
        the state updates may read (each in V, X, the states, the params and earlier
        stages). :meth:`from_ode` writes a Runge–Kutta method's stages here, so that the
        step and its derivative stay a short program instead of one expression per state.

    Examples
    --------
    >>> import sympy as sp, symneuron as sn
    >>> tau = sp.Symbol("tau", positive=True)
    >>> lif = sn.Neuron(sn.V + (sn.X - sn.V) / tau, params={tau: 2.0}, learnable=[tau])
    >>> sorted(lif.derivatives())
    ['dH/dV', 'dH/dX', 'dH/dtau']
    """

    def __init__(self, charge: sp.Expr, **kw: Any) -> None:
        super().__init__(charge, **kw)
        derivation.partials(self)  # derived and checked now: a bad derivative fails here

    @classmethod
    def from_ode(
        cls,
        dv: sp.Expr,
        *,
        dt: float,
        method: str = "exp_euler",
        states: Mapping[Any, ode.ODEState] | None = None,
        params: Mapping[Any, float] | None = None,
        **kw: Any,
    ) -> Neuron:
        """A neuron given as differential equations, discretised symbolically.

        ``dv`` is dV/dt = F(V, W..., X; θ); ``states`` map each extra state to an
        :class:`~symneuron.ODEState` (dW/dt, on-spike rule, initial value); ``dt``
        the time step; ``method`` one of ``"euler"``, ``"exp_euler"``, ``"rk2"``
        (midpoint) and ``"rk4"`` (Brian2's definitions: :mod:`symneuron.ode`). X is
        held constant over a step. The other keyword arguments (``learnable``,
        ``v_threshold``, ``v_reset``, ``surrogate``, ``detach_reset``, ``name``) are
        :class:`Neuron`'s; the charge is V's value after the step.

        >>> import sympy as sp, symneuron as sn
        >>> tau = sp.Symbol("tau")
        >>> lif = sn.Neuron.from_ode((sn.X - sn.V) / tau, dt=1.0, params={tau: 2.0})
        >>> lif.ode.dv
        (-V + X)/tau
        >>> float(lif.charge.subs({sn.V: 0, sn.X: 1, lif.symbols["tau"]: 2}))  # 1 - e^(-1/2)
        0.3934693402873666
        """
        step = ode.discretise(dv, dt=dt, method=method, states=states, params=params)
        _check_step_keeps_v(step, dv, dt, method)
        neuron = cls(
            step.charge, params=params, states=step.states or None, stages=step.stages, **kw
        )
        own = {s.name: s for s in [*neuron.symbols.values(), *neuron.state_symbols.values()]}

        def mine(expr: Any) -> sp.Expr:
            expr = sp.sympify(expr)
            return expr.xreplace({s: own.get(s.name, s) for s in expr.free_symbols})

        system = ode.ODESystem(
            dv=mine(dv),
            states={
                str(getattr(w, "name", w)): ode.ODEState(
                    mine(st.ode),
                    None if st.on_spike is None else mine(st.on_spike),
                    float(st.init),
                )
                for w, st in (states or {}).items()
            },
            dt=float(dt),
            method=method,
        )
        object.__setattr__(neuron, "ode", system)
        return neuron

    #: The differential equations of a neuron built by :meth:`from_ode` (None
    #: otherwise); :meth:`replace` keeps them unless the equations change.
    ode: ode.ODESystem | None = None

    def replace(self, **changes: Any) -> Definition:
        """A new neuron with some constructor arguments changed (see
        :meth:`Definition.replace`); an ODE neuron keeps :attr:`ode` unless
        ``charge``, ``states`` or ``params`` change."""
        out = super().replace(**changes)
        if self.ode is not None and not {"charge", "states", "params", "stages"} & set(changes):
            object.__setattr__(out, "ode", self.ode)
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_with_ode, (type(self), self._given, self.ode))

    def view(self, expr: sp.Expr) -> sp.Expr:
        """``expr`` (the step charge, a state's update) as a user reads it: the model's
        mathematics, with no stage of the integrator (the kernels keep them). A neuron
        built with ``method="exp_euler"`` shows the exact step of each linear equation
        (:func:`~symneuron.ode.exact_step`); every other neuron with stages shows ``expr``
        with them substituted, unless that step would exceed :data:`VIEW_NODES` nodes,
        where a Runge–Kutta step shows its right-hand sides as functions ``f_V(V, W)``
        (:func:`~symneuron.ode.rk_outline`). Kept per neuron and expression."""
        if not self.stages:
            return expr
        key = (self.key(), expr)
        found = _VIEWS.get(key)
        return _VIEWS.put(key, self._view(expr)) if found is None else found

    def _view(self, expr: sp.Expr) -> sp.Expr:
        system = self.ode
        own = self.state_symbols
        steps = {self.step_charge: V, **{st.update: own[n] for n, st in self.states.items()}}
        z = steps.get(expr)
        if system is None or z is None:
            return self.inline_stages(expr)
        if system.method == "exp_euler":
            rhs = {V: system.dv, **{own[n]: st.ode for n, st in system.states.items()}}
            return ode.exact_step(z, rhs[z], system.dt)
        if system.method in ode.TABLEAUS and ode.expanded_size(self.stages, expr) > VIEW_NODES:
            held = [X, *(self.symbols[n] for n in self.learnable)]
            return ode.rk_outline(system.method, [V, *own.values()], system.dt, held)[z]
        return self.inline_stages(expr)

    def derivatives(self) -> dict[str, sp.Expr]:
        """The derived partials, keyed ``'dH/dV'``, ``'dH/dX'``, ``'dH/d<θ>'`` (and, for
        extra states, ``'dW~/d<z>'``), of the expressions :meth:`view` shows."""
        if self.charge is self.step_charge:
            return dict(derivation.partials(self))
        learn = [self.symbols[n] for n in self.learnable]
        states = list(self.state_symbols.values())
        out = {f"dH/d{z}": sp.diff(self.charge, z) for z in [V, X, *states, *learn]}
        for name, state in self.states.items():
            update = self.view(state.update) if state.update is not None else None
            for z in [V, X, H, *states, *learn]:
                if update is not None and update.has(z):
                    out[f"d{name}~/d{z}"] = sp.diff(update, z)
        return out

    def events(self, target: str | None = None) -> EventSpec:
        """EventProp's derived adjoint of this ODE neuron (:func:`~symneuron.derivation.
        events.derive_events`): spike inputs through X, or into the state ``target``."""
        return derive_events(self, self.ode, target=target)

    def spec(self) -> derivation.KernelSpec:
        """The :class:`~symneuron.derivation.KernelSpec` (derived once per process)."""
        return derivation.derive(self)

    def source(
        self, backend: str = "cuda", dtype: torch.dtype | str = "float32", recurrent: bool = False
    ) -> str:
        """Generated kernel source (every forward and backward variant) for ``backend``
        and ``dtype``; ``recurrent``: the kernels of a recurrent layer of this neuron (its
        forward and backward with the connection's stage, for every delay)."""
        return render_source(self.spec(), backend, dtype, recurrent=recurrent)


def _check_step_keeps_v(step: ode.Discretised, dv: Any, dt: float, method: str) -> None:
    """Reject a discretisation in which V cancels (Euler with dt equal to the time
    constant jumps to the fixed point), showing the discretised charge and dt. Only an
    unstaged (Euler) step can: the exponential step keeps V·e^{a dt}, and the Runge–Kutta
    polynomials of a dt have no real root."""
    charge = sp.sympify(step.charge)
    if not step.stages and (not charge.has(V) or sp.diff(charge, V) == 0):
        raise ValueError(
            f"With dt = {dt}, the {method} step of dV/dt = {dv} is H = {charge}, in which V "
            "cancels: the step lands on the fixed point whatever V was (dt equals the time "
            "constant, for a linear ODE). Use a smaller dt, or method='exp_euler'."
        )


def _rebuild_with_ode(cls: type[Neuron], given: dict[str, Any], system: Any) -> Neuron:
    """Unpickle a neuron, with the ODEs it was built from."""
    neuron = cls(**given)
    if system is not None:
        object.__setattr__(neuron, "ode", system)
    return neuron
