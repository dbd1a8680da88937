"""The derivation stage: Definition -> KernelSpec.

The step map of a neuron is a small graph of named nodes evaluated in order:

    H    = f(V, X; θ)                       charge
    Vth  = v_threshold                      threshold (an expression)
    S    = Θ(H − Vth)                       fire; dS/dH = σ'(H − Vth) = SG
    Vnew = H(1 − S) + V_reset·S  |  H − Vth·S   reset

The backward step is the transposed Jacobian of this map, built here by reverse
accumulation over the nodes with SymPy partials, with SG standing in for the
step function's derivative. Extra state variables are more nodes in the same
graph (docs/architecture.md, "Multi-state neurons"); the single-state neuron is
the k = 0 case.

The result is plain data: named expressions after common-subexpression
elimination and the inputs each step needs. Nothing here prints code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

import sympy as sp

from .definition import Definition, H, S, V, X
from .surrogate import u as U_SURROGATE
from .validate import check_expression

__all__ = ["KernelSpec", "Assign", "K", "derive", "partials", "partial_definitions"]


class K:
    """The step map's own symbols, named as in the generated kernels.

    ``K.h`` is this step's H inside a kernel, as :data:`symneuron.H` is in a user's
    equations; the two are distinct symbols (``h`` and ``H``), so a user's
    expression is renamed to these before derivation.
    """

    h, s, sg, u, v_th, v_new, grad_s, grad_v, gate = sp.symbols(
        "h s sg u v_th v_new grad_s grad_v gate", real=True
    )


@dataclass(frozen=True)
class Assign:
    """``target = expr``: one line of a step body."""

    target: sp.Symbol
    expr: sp.Expr


@dataclass(frozen=True)
class Node:
    """One node of the step map: ``symbol = expr`` (``spike`` marks S = Θ(H − Vth))."""

    symbol: sp.Symbol
    expr: sp.Expr
    spike: bool = False
    is_reset: bool = False


@dataclass(frozen=True)
class KernelSpec:
    """Everything the code generators need, as named SymPy expressions.

    Attributes
    ----------
    name, key : kernel name and definition hash.
    params : all parameter names in kernel-argument order.
    learnable : the parameters that get gradients (a subset of ``params``).
    param_symbols : name -> SymPy symbol used inside the expressions (``p<i>_<name>``).
    param_cnames : name -> that symbol's name, a C identifier.
    charge : CSE'd lines computing ``h`` from ``V``, ``X`` and the params.
    threshold : ``v_th`` as an expression in the params.
    surrogate : CSE'd lines computing ``sg`` from ``u = h − v_th``.
    reset : CSE'd lines computing the new state ``V`` from ``h``, ``s`` and ``v_th``.
    backward : CSE'd lines computing ``grad_V`` (dL/dV[t−1]), ``grad_X`` and
        ``grad_<θ>`` from ``h, s, sg, V, X``, the params, ``grad_s`` (∂L/∂S[t]) and
        ``grad_v`` (total dL/dV[t]).
    needs_v, needs_x : whether the backward step reads V[t−1] and X[t].
    v_start : V[0] when no ``v_init`` is given (a numeric v_reset, else 0; a
        v_reset that is an expression in the params always comes as a v_init tensor).
    partials : the derived partials of the charge, by readable name.
    states : names of the extra state variables W_i (empty for single-state neurons).
        Inside the expressions W_i[t−1] is ``w<i>``, its update W̃_i is ``wt<i>``.
    state_init : W_i[0] when no initial value is given.
    updates : CSE'd lines computing each ``wt<i>`` from V, the ``w<i>``, X, h, params.
    state_resets : CSE'd lines computing the new ``w<i>`` from the ``wt<i>``, s, params.
    threshold_per_step : the threshold uses the states, so it changes every step.
    needs_w : whether the backward step needs W[t−1] (recomputed from W̃[t−1], S[t−1]).
    needs_wt : whether the backward reads the W̃ the forward saves (its expressions, the
        threshold or the recomputed step t−1 use them); when not, the training forward
        saves none: Izhikevich's W̃, for one, enters the step only linearly.
    crossing : spikes on an upward crossing (``gate`` = [V[t−1] < v_th]), no reset.
    hard_reset : V ← H(1 − S) + V_reset·S; the kernels add +0 after it, so that
        −0.0·(1 − S) leaves +0.0 as the reference's ``+ V_reset·S`` does.
    The backward also computes ``grad_W<i>`` (dL/dW_i[t−1]) from ``grad_w<i>`` (total
    dL/dW_i[t]).
    """

    name: str
    key: str
    params: tuple[str, ...]
    learnable: tuple[str, ...]
    param_symbols: dict[str, sp.Symbol]
    param_cnames: dict[str, str]
    charge: tuple[Assign, ...]
    threshold: sp.Expr
    surrogate: tuple[Assign, ...]
    reset: tuple[Assign, ...]
    backward: tuple[Assign, ...]
    needs_v: bool
    needs_x: bool
    v_start: float
    partials: dict[str, sp.Expr] = field(compare=False)
    states: tuple[str, ...] = ()
    state_init: tuple[float, ...] = ()
    updates: tuple[Assign, ...] = ()
    state_resets: tuple[Assign, ...] = ()
    threshold_per_step: bool = False
    needs_w: bool = False
    needs_wt: bool = False
    crossing: bool = False
    hard_reset: bool = False

    @property
    def saved_states(self) -> int:
        """How many [T, N] W̃ tensors the training forward saves for the backward: every
        state's when the backward reads W̃ (:attr:`needs_wt`), else none."""
        return len(self.states) if self.needs_wt else 0


def c_identifier(name: str, index: int) -> str:
    """The kernel-side name of parameter ``name``: ``p<index>_<name>`` (ASCII).

    Parameters are renamed before derivation, so no user name can clash with the
    step map's own symbols (h, s, sg, grad_v, CSE temporaries, ...).
    """
    clean = re.sub(r"\W", "_", name.encode("ascii", "replace").decode())
    return f"p{index}_{clean}"


def grad_symbol(name: str) -> sp.Symbol:
    """Symbol of the backward output for input ``name`` (``V``, ``X`` or a param)."""
    return sp.Symbol(f"grad_{name}", real=True)


def _cse(targets: list[tuple[sp.Symbol, sp.Expr]], prefix: str) -> tuple[Assign, ...]:
    symbols = sp.numbered_symbols(prefix, real=True)
    temps, reduced = sp.cse([e for _, e in targets], symbols=symbols, optimizations="basic")
    lines = [Assign(t, e) for t, e in temps]
    lines += [Assign(target, e) for (target, _), e in zip(targets, reduced, strict=True)]
    return tuple(lines)


def partial_definitions(neuron: Definition) -> dict[str, tuple[sp.Expr, sp.Symbol]]:
    """Each reported partial as (function, variable), keyed ``'dH/dV'``, ``'dW~/dH'``, ...

    The charge's partials with respect to V, X, every state and every learnable
    param; each state update's (W̃ = g) with respect to V, X, H, the states and
    the learnable params it uses.
    """
    learn = [neuron.symbols[n] for n in neuron.learnable]
    states = list(neuron.state_symbols.values())
    out = {f"dH/d{z}": (neuron.charge, z) for z in [V, X, *states, *learn]}
    for wname, state in neuron.states.items():
        update = state.update
        assert update is not None
        for z in [V, X, H, *states, *learn]:
            if update.has(z):
                out[f"d{wname}~/d{z}"] = (update, z)
    return out


@lru_cache(maxsize=256)
def partials(neuron: Definition) -> dict[str, sp.Expr]:
    """The derived partials (see :func:`partial_definitions`), keyed by readable names."""
    out = {key: sp.diff(f, z) for key, (f, z) in partial_definitions(neuron).items()}
    for key, expr in out.items():
        check_expression(expr, f"derivative {key}")
    return out


def state_symbols(k: int) -> tuple[list[sp.Symbol], list[sp.Symbol], list[sp.Symbol]]:
    """Internal symbols of k extra states: W[t−1] (``w<i>``), W̃ (``wt<i>``), W[t] (``wn<i>``)."""

    def make(prefix: str) -> list[sp.Symbol]:
        return [sp.Symbol(f"{prefix}{i}", real=True) for i in range(k)]

    return make("w"), make("wt"), make("wn")


def grad_w_seed(i: int) -> sp.Symbol:
    """Total dL/dW_i[t] (from the future and from the loss), the seed of state ``i``."""
    return sp.Symbol(f"grad_w{i}", real=True)


def step_nodes(neuron: Definition, rename: dict[sp.Symbol, sp.Symbol]) -> list[Node]:
    """The forward step map as nodes in evaluation order, params renamed by ``rename``.

    Order: H, W̃_i, V_th, S, V_new, W_i new; k = 0 leaves H, V_th, S, V_new.
    """
    prev, tilde, new = state_symbols(len(neuron.states))
    publics = list(neuron.state_symbols.values())
    as_prev = {**rename, **dict(zip(publics, prev, strict=True))}
    as_tilde = {**rename, **dict(zip(publics, tilde, strict=True))}
    charge = neuron.charge.xreplace(as_prev)
    v_th = sp.sympify(neuron.v_threshold).xreplace(as_tilde)
    if neuron.firing == "crossing":
        v_new = K.h
    elif neuron.v_reset is None:
        v_new = K.h - K.v_th * K.s
    else:
        v_new = K.h * (1 - K.s) + sp.sympify(neuron.v_reset).xreplace(rename) * K.s
    states = list(neuron.states.values())
    updates = [
        Node(wt, sp.sympify(st.update).xreplace({**as_prev, H: K.h}))
        for wt, st in zip(tilde, states, strict=True)
    ]
    resets = [
        Node(wn, sp.sympify(st.on_spike).xreplace({**as_tilde, S: K.s}), is_reset=True)
        for wn, st in zip(new, states, strict=True)
    ]
    return [
        Node(K.h, charge),
        *updates,
        Node(K.v_th, v_th),
        Node(K.s, K.h - K.v_th, spike=True),
        Node(K.v_new, v_new, is_reset=True),
        *resets,
    ]


def transpose(
    nodes: list[Node],
    seeds: dict[sp.Symbol, sp.Expr],
    charge_partials: dict[sp.Symbol, sp.Expr],
    detach_reset: bool,
    crossing: bool = False,
) -> dict[sp.Symbol, sp.Expr]:
    """Reverse accumulation: adjoints of every node input, given the output seeds.

    ``charge_partials`` supplies the partials of the charge node (so they are the
    ones reported by :func:`partials`). A spike node's partial with respect to its
    argument is ``SG`` (``SG·gate`` for crossing firing, the gate [V[t−1] < θ] a
    constant); a reset node sends no adjoint into ``S`` when detached.
    """
    adjoint: dict[sp.Symbol, sp.Expr] = dict(seeds)
    for node in reversed(nodes):
        a = adjoint.get(node.symbol, sp.Integer(0))
        if a == 0:
            continue
        for dep in sorted(node.expr.free_symbols, key=str):
            if node.spike:
                d = K.sg * (K.gate if crossing else 1) * sp.diff(node.expr, dep)
            elif node.symbol == K.h:
                d = charge_partials.get(dep, sp.diff(node.expr, dep))
            elif node.is_reset and dep == K.s and detach_reset:
                continue
            else:
                d = sp.diff(node.expr, dep)
            adjoint[dep] = adjoint.get(dep, sp.Integer(0)) + a * d
    return adjoint


@lru_cache(maxsize=256)
def derive(neuron: Definition) -> KernelSpec:
    """Differentiate ``neuron``'s step map and return its :class:`KernelSpec`."""
    found = dict(partials(neuron))
    k = len(neuron.states)
    prev, tilde, new = state_symbols(k)
    cnames = {n: c_identifier(n, i) for i, n in enumerate(neuron.params)}
    rename = {neuron.symbols[n]: sp.Symbol(c, real=True) for n, c in cnames.items()}
    symbol_of = {"V": V, "X": X, **{n: rename[neuron.symbols[n]] for n in neuron.params}}
    symbol_of.update(dict(zip(neuron.states, prev, strict=True)))
    as_internal = {**rename, **dict(zip(neuron.state_symbols.values(), prev, strict=True))}
    charge_partials = {
        symbol_of[n]: found[f"dH/d{n}"].xreplace(as_internal)
        for n in ["V", "X", *neuron.states, *neuron.learnable]
    }
    nodes = step_nodes(neuron, rename)
    charge, threshold = nodes[0].expr, nodes[1 + k].expr
    seeds = {K.s: K.grad_s, K.v_new: K.grad_v, **{wn: grad_w_seed(i) for i, wn in enumerate(new)}}
    crossing = neuron.firing == "crossing"
    adjoint = transpose(nodes, seeds, charge_partials, neuron.detach_reset, crossing)
    inputs = ["V", *neuron.states, "X", *neuron.learnable]
    grad_names = {"V": "V", "X": "X", **cnames, **{w: f"W{i}" for i, w in enumerate(neuron.states)}}
    targets = [
        (grad_symbol(grad_names[n]), adjoint.get(symbol_of[n], sp.Integer(0))) for n in inputs
    ]
    backward = _cse(targets, "b")
    used = set().union(*(line.expr.free_symbols for line in backward))
    sg = neuron.surrogate.derivative().subs(U_SURROGATE, K.u)
    update_nodes, reset_nodes = nodes[1 : 1 + k], nodes[-k:] if k else []
    needs_v, needs_w = V in used or K.gate in used, bool(used & set(prev))
    reset = _cse([(V, nodes[3 + k].expr)], "r")
    # what the backward step evaluates: its lines and the spike (threshold), and, when it
    # recomputes step t-1, that step's reset (the new W from W̃ only when W[t-1] is used)
    read = used | threshold.free_symbols
    if needs_v or needs_w:
        read |= set().union(*(line.expr.free_symbols for line in reset))
    return KernelSpec(
        name=neuron.name,
        key=neuron.key(),
        params=tuple(neuron.params),
        learnable=neuron.learnable,
        param_symbols={n: rename[neuron.symbols[n]] for n in neuron.params},
        param_cnames=cnames,
        charge=_cse([(K.h, charge)], "c"),
        threshold=threshold,
        surrogate=_cse([(K.sg, sg)], "g"),
        reset=reset,
        backward=backward,
        needs_v=needs_v,
        needs_x=X in used,
        v_start=neuron.v_start if isinstance(neuron.v_start, float) else 0.0,
        partials=found,
        states=tuple(neuron.states),
        state_init=tuple(s.init for s in neuron.states.values()),
        updates=_cse([(n.symbol, n.expr) for n in update_nodes], "a") if k else (),
        state_resets=(
            _cse([(w, n.expr) for w, n in zip(prev, reset_nodes, strict=True)], "q") if k else ()
        ),
        threshold_per_step=bool(threshold.free_symbols & set(tilde)),
        needs_w=needs_w,
        needs_wt=needs_w or bool(read & set(tilde)),
        crossing=crossing,
        hard_reset=neuron.v_reset is not None,  # crossing firing has v_reset None
    )
