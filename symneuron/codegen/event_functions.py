"""A neuron's EventProp expressions printed as C functions.

Every model-specific line of the EventProp kernels (:mod:`.events`) is printed here
from the :class:`~symneuron.derivation.events.EventSpec` that SymPy derived: for a
linear neuron the closed-form flow x(s) = Φ(s)x + Γ(s) and its transpose
λ(t − s) = Φ(s)ᵀλ(t), for a nonlinear one (no closed form: QIF, EIF, AdEx) the right-hand
side f(x) and the adjoint's dλ/dt = −Jᵀλ that the kernels' RK4 path steps, the
threshold function g and its first two rates along the flow (and V's, for readouts), the
reset h and its margin g(h(x)), the synapse m(x, w), the adjoint's jump at a spike, a
spike's share of each param's gradient, the arrival terms (λ·∂m/∂w, Q, (∂m/∂x)ᵀλ), the
integrands λ·∂f/∂θ and the initial state. Each becomes one ``SN_INLINE`` function
(``static inline`` in C, a ``__device__`` one in CUDA: :mod:`.events` defines the word)
of the same signature,

    void sn_<name>(const real* x, const real* lam, real w, real B, real s,
                   const real* p, real* out)

(states, adjoints, weight, coupling, elapsed time, params in :attr:`EventSpec.params`
order), its common subexpressions hoisted by SymPy's ``cse`` and every output computed
before any is written, so ``out`` may be one of the inputs. Subexpressions of the params
alone (1/τ, τ_s/(τ_m − τ_s), ...) are lifted out of them into ``sn_constants``, which
the kernels run once per neuron into the params' array after the params, where the
functions read them: an event's arithmetic then multiplies where it divided.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sympy as sp

from ..definition import Definition
from ..derivation.events import EventSpec, turns_once
from .printer import KernelPrinter

__all__ = ["EventFunctions", "event_functions", "STATE_FREE"]

#: the functions whose expressions must not depend on the state for a backward that does
#: not replay the forward (the kernels replay it when one does, :attr:`EventFunctions.replay`)
STATE_FREE = ("weight_partial", "target_term", "synapse_t")


@dataclass(frozen=True)
class EventFunctions:
    """The printed functions of one neuron and what the kernels' skeleton needs to know.

    Attributes
    ----------
    source : the C text of every ``sn_<name>`` function.
    states, params : the counts (``NS``, ``NP``).
    constants : how many subexpressions of the params alone ``sn_constants`` computes
        once per neuron into ``p[NP + m]`` (``NK``; the functions read them there).
    store : indices (into the states) of the values a spike stores.
    replay : whether the backward needs the forward's states between events (an arrival
        term that depends on them).
    integrands : whether any param has a nonzero ∂f/∂θ (its gradient needs ∫λ·∂f/∂θ dt).
    rk4 : whether the kernels step the state by RK4 (printed ``sn_rhs`` and
        ``sn_adjoint_rhs``; a spec without a closed-form flow) rather than by the flow.
    whole : whether the forward moves from arrival to arrival in one piece of the flow,
        however many steps apart (ġ vanishes at most once along any stretch of it:
        :func:`~symneuron.derivation.events.turns_once`); else steps of dt bound each.
    passes : whether an arrival leaves λ as it is ((∂m/∂x)ᵀ is the identity: a synapse
        that adds to a state): λ at every arrival between two spikes then follows from
        λ at the later one alone, not from the arrival after it.
    """

    source: str
    states: int
    params: int
    constants: int
    store: tuple[int, ...]
    replay: bool
    integrands: bool
    rk4: bool = False
    whole: bool = False
    passes: bool = False


def _symbols(spec: EventSpec) -> dict[sp.Symbol, sp.Symbol]:
    """The spec's symbols -> the C locals the functions declare (x0, l0, p0, w, B, s)."""
    names = {z: sp.Symbol(f"x{i}", real=True) for i, z in enumerate(spec.states)}
    names.update({a: sp.Symbol(f"l{i}", real=True) for i, a in enumerate(spec.adjoints)})
    names.update({p: sp.Symbol(f"p{k}", real=True) for k, p in enumerate(spec.params.values())})
    names.update({spec.weight: sp.Symbol("w", real=True), spec.coupling: sp.Symbol("B")})
    names[spec.elapsed] = sp.Symbol("s", real=True)
    return names


def _locals(used: set[sp.Symbol], compute: str) -> list[str]:
    """Declarations of the array elements a function reads, in a fixed order."""
    out = []
    for sym in sorted(used, key=lambda s: (s.name[0], s.name)):
        name = sym.name
        if name[0] in "xlp" and name[1:].isdigit():
            array = {"x": "x", "l": "lam", "p": "p"}[name[0]]
            out.append(f"    const {compute} {name} = {array}[{name[1:]}];")
    return out


def _function(
    name: str, exprs: Sequence[sp.Expr], names: dict[sp.Symbol, sp.Symbol], printer: KernelPrinter
) -> str:
    """One ``sn_<name>`` function writing ``out[i] = exprs[i]``."""
    compute = printer.compute
    renamed = [sp.sympify(e).xreplace(names) for e in exprs]
    temps, reduced = sp.cse(renamed, symbols=sp.numbered_symbols("c"), optimizations="basic")
    used: set[sp.Symbol] = set()
    for e in [*renamed, *(t for _, t in temps)]:
        used |= e.free_symbols
    body = _locals(used, compute)
    body += [f"    const {compute} {t} = {printer.doprint(v)};" for t, v in temps]
    body += [f"    const {compute} r{i} = {printer.doprint(v)};" for i, v in enumerate(reduced)]
    body += [f"    out[{i}] = r{i};" for i in range(len(reduced))]
    head = (
        f"SN_INLINE void sn_{name}(const {compute}* x, const {compute}* lam, {compute} w, "
        f"{compute} B, {compute} s, const {compute}* p, {compute}* out)"
    )
    unused = "    (void)x; (void)lam; (void)w; (void)B; (void)s; (void)p;"
    return "\n".join([head + " {", unused, *body, "}"])


def _expressions(definition: Definition, spec: EventSpec, rk4: bool) -> dict[str, list[sp.Expr]]:
    """Each function's outputs, from the spec alone (and the definition's initial state):
    the closed-form flow and its transpose where the spec has one, else f and −Jᵀλ."""
    lam = sp.Matrix(spec.adjoints)
    x = sp.Matrix(spec.states)
    rate_slope = sp.Matrix([spec.threshold_rate]).jacobian(spec.states).dot(spec.rhs)
    voltage_rate = spec.rhs[0]  # V is the first state
    voltage_slope = sp.Matrix([voltage_rate]).jacobian(spec.states).dot(spec.rhs)
    names = list(spec.params)
    init = [definition.v_start, *(st.init for st in definition.states.values())]
    if not rk4 and spec.flow is not None and spec.flow_offset is not None:
        moves = {
            "flow": list(spec.flow * x + spec.flow_offset),
            "adjoint_flow": list(spec.flow.T * lam),
        }
    else:
        moves = {"rhs": list(spec.rhs), "adjoint_rhs": list(spec.adjoint_rhs)}
    return {
        **moves,
        "g": [spec.threshold],
        "g_dot": [spec.threshold_rate],
        "g_ddot": [rate_slope],
        "v": [spec.states[0]],
        "v_dot": [voltage_rate],
        "v_ddot": [voltage_slope],
        "reset": list(spec.reset),
        "margin": [spec.reset_margin],
        "synapse": list(spec.synapse),
        "init": [sp.sympify(e) for e in init],
        "jump": list(spec.jump),
        "spike_partials": [spec.spike_partials[n] for n in names],
        "weight_partial": [spec.weight_partial.dot(lam)],
        "target_term": [spec.target_term],
        "synapse_t": list(spec.synapse_jacobian.T * lam),
        "integrands": [lam.dot(spec.rhs_partials[n]) for n in names],
    }


def _cheap(expr: sp.Expr) -> bool:
    """A symbol, a number, or a number times a symbol (−ϑ: no cheaper as a constant)."""
    if expr.is_Atom:
        return True
    return bool(expr.is_Mul and len(expr.args) == 2 and all(a.is_Atom for a in expr.args))


class _Hoisted:
    """Subexpressions of the params alone, lifted out of the functions: each is computed
    once per neuron (``sn_constants``, into ``p[NP + m]``, read as the symbol
    ``p{NP + m}``), so a function evaluated at every event multiplies by 1/τ where it
    divided by τ, and evaluates no constant twice."""

    def __init__(self, params: Sequence[sp.Symbol]) -> None:
        self.params = set(params)
        self.first = len(params)
        self.found: dict[sp.Expr, sp.Symbol] = {}

    def _constant(self, expr: sp.Expr) -> sp.Symbol:
        if expr not in self.found:
            self.found[expr] = sp.Symbol(f"p{self.first + len(self.found)}", real=True)
        return self.found[expr]

    def _only_params(self, expr: sp.Expr) -> bool:
        return expr.free_symbols <= self.params

    def __call__(self, expr: sp.Expr) -> sp.Expr:
        """``expr`` with each largest subexpression of the params alone (not a bare
        symbol or number; in a sum or product, the params' terms or factors together)
        replaced by its constant."""
        expr = sp.sympify(expr)
        if expr.is_Atom or not expr.free_symbols:
            return expr
        if self._only_params(expr):
            return expr if _cheap(expr) else self._constant(expr)
        if isinstance(expr, sp.Add | sp.Mul):
            fixed = [a for a in expr.args if self._only_params(a)]
            rest = [self(a) for a in expr.args if not self._only_params(a)]
            if fixed and any(a.free_symbols for a in fixed):
                part = expr.func(*fixed)
                rest.append(part if _cheap(part) else self._constant(part))
            else:
                rest += fixed
            return expr.func(*rest)
        return expr.func(*(self(a) for a in expr.args))

    def constants(self) -> list[sp.Expr]:
        """Each constant's expression, in the order of their indices."""
        return list(self.found)


def event_functions(
    definition: Definition, spec: EventSpec, compute: str, rk4: bool | None = None
) -> EventFunctions:
    """The C functions of ``spec`` in ``compute`` (``"float"`` or ``"double"``) arithmetic,
    for the kernels' RK4 path where ``rk4`` (None: where the spec has no closed-form flow).

    >>> import sympy as sp, symneuron as sn
    >>> tau_m, tau_s, I = sp.symbols("tau_m tau_s I")
    >>> lif = sn.Neuron.from_ode((-sn.V + I) / tau_m, dt=1.0, method="exact",
    ...     params={tau_m: 10.0, tau_s: 5.0}, states={I: sn.ODEState(-I / tau_s + sn.X)})
    >>> fns = event_functions(lif, lif.events(), "double")
    >>> fns.store, fns.replay, fns.integrands
    ((1,), False, True)
    >>> "exp(p2*s)" in fns.source, fns.constants, fns.rk4  # p2 = −1/τ_m, once per neuron
    (True, 8, False)

    A spec without a closed-form flow (its Jacobian depends on the state) prints f and
    −Jᵀλ for the kernels' RK4 path instead of the flow (so may a linear one, ``rk4=True``).
    """
    if rk4 is None:
        rk4 = spec.flow is None
    if not rk4 and spec.flow is None:
        raise ValueError(
            f"{definition.name} is nonlinear (its Jacobian depends on the state): there is no "
            "closed-form flow; its kernels step it by RK4 (rk4=True, integrator='rk4')."
        )
    printer = KernelPrinter(compute)
    names = _symbols(spec)
    exprs = _expressions(definition, spec, rk4)
    hoisted = _Hoisted([names[p] for p in spec.params.values()])
    lifted = {n: [hoisted(sp.sympify(e).xreplace(names)) for e in es] for n, es in exprs.items()}
    lifted["constants"] = hoisted.constants()
    source = "\n\n".join(_function(n, e, names, printer) for n, e in lifted.items())
    states = set(spec.states)
    replay = any(sp.sympify(e).free_symbols & states for n in STATE_FREE for e in exprs[n])
    integrands = any(not sp.sympify(e).is_zero for e in exprs["integrands"])
    return EventFunctions(
        source=source,
        states=len(spec.states),
        params=len(spec.params),
        constants=len(lifted["constants"]),
        store=tuple(spec.states.index(z) for z in spec.store),
        replay=replay,
        integrands=integrands,
        rk4="rhs" in exprs,
        whole="rhs" not in exprs and turns_once(spec),
        passes=spec.synapse_jacobian == sp.eye(len(spec.states)),
    )
