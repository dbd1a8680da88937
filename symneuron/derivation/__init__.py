"""The derivation stage: Definition -> KernelSpec.

The step map of a neuron is a small graph of named nodes evaluated in order:

    H    = f(V, X; θ)                       charge
    Vth  = v_threshold                      threshold (an expression)
    S    = Θ(H − Vth)                       fire; dS/dH = σ'(H − Vth) = SG
    Vnew = H(1 − S) + V_reset·S  |  H − Vth·S   reset

preceded, for an integrator's stages (``Definition.stages``), by one node per stage.
The backward step is the transposed Jacobian of this map, built here by reverse
accumulation over the nodes with SymPy partials, with SG standing in for the
step function's derivative. Extra state variables are more nodes in the same
graph (docs/architecture.md, "Neurons with several state variables"); the
single-state neuron is the k = 0 case.

The result is plain data: named expressions after common-subexpression
elimination and the inputs each step needs. Nothing here prints code.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import sympy as sp

from ..definition import Definition, H, S, V, X
from ..memo import memoized
from ..signature import param_cnames
from ..surrogate import u as U_SURROGATE
from ..validate import check_expression
from .program import Assign, Block, blocks, cse_block

__all__ = [
    "KernelSpec",
    "Assign",
    "Block",
    "K",
    "StepMap",
    "Adjoint",
    "derive",
    "partials",
    "partial_definitions",
]


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
class Node:
    """One node of the step map: ``symbol = expr`` (``spike`` marks S = Θ(H − Vth); a
    ``stage`` is a named intermediate value, whose adjoint is named too)."""

    symbol: sp.Symbol
    expr: sp.Expr
    spike: bool = False
    is_reset: bool = False
    stage: bool = False


class StepMap(NamedTuple):
    """The forward step map by its parts, in evaluation order (:attr:`nodes`): the
    stages (an integrator's, :attr:`symneuron.Definition.stages`) come first."""

    charge: Node
    updates: tuple[Node, ...]
    threshold: Node
    spike: Node
    reset: Node
    state_resets: tuple[Node, ...]
    stages: tuple[Node, ...] = ()

    @property
    def nodes(self) -> list[Node]:
        return [
            *self.stages,
            self.charge,
            *self.updates,
            self.threshold,
            self.spike,
            self.reset,
            *self.state_resets,
        ]


class Adjoint(NamedTuple):
    """What :func:`transpose` returns: the adjoint of every node input, and the lines
    that name each stage's adjoint (``grad_<stage>``), in the order they are computed."""

    values: dict[sp.Symbol, sp.Expr]
    lines: tuple[Assign, ...]


@dataclass(frozen=True)
class KernelSpec:
    """Everything the code generators need, as named SymPy expressions.

    What each kernel reads is derived from the expressions (:attr:`needs_x`,
    :attr:`needs_v`, :attr:`needs_w`, :attr:`needs_wt`), not kept beside them.

    Attributes
    ----------
    name, key : kernel name and definition hash.
    params : all parameter names in kernel-argument order.
    learnable : the parameters that get gradients (a subset of ``params``).
    param_symbols : name -> SymPy symbol used inside the expressions (``p<i>_<name>``).
    charge : block computing ``h`` from ``V``, ``X`` and the params.
    threshold : ``v_th`` as an expression in the params (and the ``wt<i>``).
    surrogate : block computing ``sg`` from ``u = h − v_th``.
    reset : block computing the new state ``V`` from ``h``, ``s`` and ``v_th``.
    backward : block computing ``grad_V`` (dL/dV[t−1]), ``grad_W<i>``, ``grad_X`` and
        ``grad_<θ>`` from ``h, s, sg, V, X``, the params, ``grad_s`` (∂L/∂S[t]),
        ``grad_v`` (total dL/dV[t]) and ``grad_w<i>`` (total dL/dW_i[t]).
    v_start : V[0] when no ``v_init`` is given (a numeric v_reset, else 0; a
        v_reset that is an expression in the params always comes as a v_init tensor).
    partials : the derived partials of the charge, by readable name.
    states : names of the extra state variables W_i (empty for single-state neurons).
        Inside the expressions W_i[t−1] is ``w<i>``, its update W̃_i is ``wt<i>``.
    state_init : W_i[0] when no initial value is given.
    updates : block computing each ``wt<i>`` from V, the ``w<i>``, X, h, params.
    state_resets : block computing the new ``w<i>`` from the ``wt<i>``, s, params.
    firing : ``"level"``, ``"crossing"`` (on an upward crossing, no reset) or ``"escape"``.
    noise_streams : the streams of the standard-normal draws the charge and updates read
        (stream i is the symbol ``noise`` or ``noise<i>``: an input of the step, like X).
    probability : p(h) of escape firing, S = [u < p(h)] (its partials stand for S's).
    hard_reset : V ← H(1 − S) + V_reset·S; the kernels add +0 after it, so that
        −0.0·(1 − S) leaves +0.0 as the reference's ``+ V_reset·S`` does.
    """

    name: str
    key: str
    params: tuple[str, ...]
    learnable: tuple[str, ...]
    param_symbols: dict[str, sp.Symbol]
    charge: Block
    threshold: sp.Expr
    surrogate: Block
    reset: Block
    backward: Block
    v_start: float
    partials: dict[str, sp.Expr] = field(compare=False)
    states: tuple[str, ...] = ()
    state_init: tuple[float, ...] = ()
    updates: Block = Block()
    state_resets: Block = Block()
    firing: str = "level"
    hard_reset: bool = False
    noise_streams: tuple[int, ...] = ()
    probability: sp.Expr | None = None

    @property
    def param_cnames(self) -> dict[str, str]:
        """name -> the param's kernel name (:func:`symneuron.signature.param_cnames`)."""
        return dict(zip(self.params, param_cnames(self.params), strict=True))

    @property
    def crossing(self) -> bool:
        """Spikes on an upward crossing (``gate`` = [V[t−1] < v_th]), no reset."""
        return self.firing == "crossing"

    @cached_property
    def needs_x(self) -> bool:
        """Whether the backward step reads X[t] (then the forward's caller keeps it)."""
        return X in self.backward.reads

    @cached_property
    def needs_v(self) -> bool:
        """Whether the backward step reads V[t−1] (recomputed from H[t−1])."""
        return V in self.backward.reads or K.gate in self.backward.reads

    @cached_property
    def needs_w(self) -> bool:
        """Whether the backward step reads W[t−1] (recomputed from W̃[t−1], S[t−1])."""
        return bool(self.backward.reads & set(state_symbols(len(self.states))[0]))

    @cached_property
    def threshold_per_step(self) -> bool:
        """The threshold uses the states, so it changes every step."""
        return bool(self.threshold.free_symbols & set(state_symbols(len(self.states))[1]))

    @cached_property
    def needs_wt(self) -> bool:
        """Whether the backward reads the W̃ the forward saves: its lines, the spike (the
        threshold) or, when it recomputes step t−1, that step's reset use them. When not,
        the training forward saves none (Izhikevich's W̃ enters its step only linearly)."""
        read = self.backward.reads | self.threshold.free_symbols
        if self.needs_v or self.needs_w:
            read |= self.reset.reads
        return self.needs_w or bool(read & set(state_symbols(len(self.states))[1]))

    @property
    def saved_states(self) -> int:
        """How many [T, N] W̃ tensors the training forward saves for the backward: every
        state's when the backward reads W̃ (:attr:`needs_wt`), else none."""
        return len(self.states) if self.needs_wt else 0


def grad_symbol(name: str) -> sp.Symbol:
    """Symbol of the backward output for input ``name`` (``V``, ``X`` or a param)."""
    return sp.Symbol(f"grad_{name}", real=True)


def partial_definitions(neuron: Definition) -> dict[str, tuple[sp.Expr, sp.Symbol]]:
    """Each reported partial as (function, variable), keyed ``'dH/dV'``, ``'dW~/dH'``, ...

    The charge's partials with respect to V, X, every state and every learnable
    param; each state update's (W̃ = g) with respect to V, X, H, the states and
    the learnable params it uses. A neuron with stages reports instead each stage's
    that reads no other stage (``'dk1_V/dV'``: an ODE's right-hand sides) with respect
    to the V, X, states and learnable params it uses; the later stages, the charge and
    the updates are differentiated where they stand, in the reverse accumulation.
    """
    learn = [neuron.symbols[n] for n in neuron.learnable]
    states = list(neuron.state_symbols.values())
    if neuron.stages:
        named = {s for s, _ in neuron.stages}
        return {
            f"d{s}/d{z}": (expr, z)
            for s, expr in neuron.stages
            if not expr.free_symbols & named
            for z in [V, X, *states, *learn]
            if expr.has(z)
        }
    out = {f"dH/d{z}": (neuron.step_charge, z) for z in [V, X, *states, *learn]}
    for wname, state in neuron.states.items():
        update = state.update
        assert update is not None
        for z in [V, X, H, *states, *learn]:
            if update.has(z):
                out[f"d{wname}~/d{z}"] = (update, z)
    return out


@memoized(256, "derivation.partials")
def partials(neuron: Definition) -> dict[str, sp.Expr]:
    """The derived partials (see :func:`partial_definitions`), keyed by readable names."""
    out = {key: sp.diff(f, z) for key, (f, z) in partial_definitions(neuron).items()}
    for key, expr in out.items():
        check_expression(expr, f"derivative {key}")
    return out


def state_symbols(k: int) -> tuple[list[sp.Symbol], list[sp.Symbol], list[sp.Symbol]]:
    """Internal symbols of k extra states: W[t−1] (``w<i>``), W̃ (``wt<i>``), W[t] (``wn<i>``)."""
    w, wt, wn = ([sp.Symbol(f"{p}{i}", real=True) for i in range(k)] for p in ("w", "wt", "wn"))
    return w, wt, wn


def grad_w_seed(i: int) -> sp.Symbol:
    """Total dL/dW_i[t] (from the future and from the loss), the seed of state ``i``."""
    return sp.Symbol(f"grad_w{i}", real=True)


def step_map(neuron: Definition, rename: dict[sp.Symbol, sp.Symbol]) -> StepMap:
    """The forward step map by its parts, params (and stages) renamed by ``rename``: the
    stages, H, W̃_i, V_th, S, V_new, W_i new (k = 0 leaves H, V_th, S, V_new)."""
    prev, tilde, new = state_symbols(len(neuron.states))
    publics = list(neuron.state_symbols.values())
    as_prev = {**rename, **dict(zip(publics, prev, strict=True))}
    as_tilde = {**rename, **dict(zip(publics, tilde, strict=True))}
    p = neuron.spike_probability  # escape: S's partials are p's (sg = 1, straight through)
    if neuron.firing == "crossing":
        v_new = K.h
    elif neuron.v_reset is None:
        v_new = K.h - K.v_th * K.s
    else:
        v_new = K.h * (1 - K.s) + sp.sympify(neuron.v_reset).xreplace(rename) * K.s
    states = list(neuron.states.values())
    return StepMap(
        stages=tuple(Node(as_prev[z], e.xreplace(as_prev), stage=True) for z, e in neuron.stages),
        charge=Node(K.h, neuron.step_charge.xreplace(as_prev)),
        updates=tuple(
            Node(wt, sp.sympify(st.update).xreplace({**as_prev, H: K.h}))
            for wt, st in zip(tilde, states, strict=True)
        ),
        threshold=Node(K.v_th, sp.sympify(neuron.v_threshold).xreplace(as_tilde)),
        spike=Node(K.s, K.h - K.v_th if p is None else p.xreplace({**rename, H: K.h}), spike=True),
        reset=Node(K.v_new, v_new, is_reset=True),
        state_resets=tuple(
            Node(wn, sp.sympify(st.on_spike).xreplace({**as_tilde, S: K.s}), is_reset=True)
            for wn, st in zip(new, states, strict=True)
        ),
    )


def transpose(
    nodes: list[Node],
    seeds: dict[sp.Symbol, sp.Expr],
    known: Mapping[sp.Symbol, Mapping[sp.Symbol, sp.Expr]],
    detach_reset: bool,
    crossing: bool = False,
    inputs: Collection[sp.Symbol] | None = None,
) -> Adjoint:
    """Reverse accumulation: adjoints of every node input, given the output seeds.

    ``known`` supplies partials of some nodes (node symbol -> input -> partial), so they
    are the ones reported by :func:`partials`; the others are taken here. A spike node's
    partial with respect to its argument is ``SG`` (``SG·gate`` for crossing firing, the
    gate [V[t−1] < θ] a constant); a reset node sends no adjoint into ``S`` when
    detached. A stage node's adjoint, complete when its turn comes (only later nodes read
    it), is named ``grad_<stage>`` by a line of :attr:`Adjoint.lines`, so that the earlier
    nodes' adjoints read that symbol instead of a copy of the expression. With
    ``inputs``, only the adjoints of those inputs and of the nodes are accumulated.
    """
    adjoint: dict[sp.Symbol, sp.Expr] = dict(seeds)
    wanted = None if inputs is None else {*inputs, *(n.symbol for n in nodes)}
    lines: list[Assign] = []
    for node in reversed(nodes):
        a = adjoint.get(node.symbol, sp.Integer(0))
        if a == 0:
            continue
        if node.stage:
            named = grad_symbol(node.symbol.name)
            lines.append(Assign(named, a))
            a = adjoint[node.symbol] = named
        given = known.get(node.symbol, {})
        for dep in sorted(node.expr.free_symbols, key=str):
            if wanted is not None and dep not in wanted:
                continue
            if node.spike:
                d = K.sg * (K.gate if crossing else 1) * sp.diff(node.expr, dep)
            elif dep in given:
                d = given[dep]
            elif node.is_reset and dep == K.s and detach_reset:
                continue
            else:
                d = sp.diff(node.expr, dep)
            adjoint[dep] = adjoint.get(dep, sp.Integer(0)) + a * d
    return Adjoint(adjoint, tuple(lines))


def _known_partials(
    neuron: Definition,
    found: Mapping[str, sp.Expr],
    symbol_of: Mapping[str, sp.Symbol],
    as_internal: Mapping[sp.Symbol, sp.Symbol],
) -> dict[sp.Symbol, dict[sp.Symbol, sp.Expr]]:
    """The reported partials (:func:`partials`) by the node they belong to: the charge's,
    or with stages each first stage's, in the kernels' symbols."""
    names = ["V", "X", *neuron.states, *neuron.learnable]
    if not neuron.stages:
        return {K.h: {symbol_of[n]: found[f"dH/d{n}"].xreplace(as_internal) for n in names}}
    out: dict[sp.Symbol, dict[sp.Symbol, sp.Expr]] = {}
    for z, _ in neuron.stages:
        keys = {n: f"d{z}/d{n}" for n in names if f"d{z}/d{n}" in found}
        out[as_internal[z]] = {
            symbol_of[n]: found[k].xreplace(as_internal) for n, k in keys.items()
        }
    return out


@memoized(256, "derivation.derive")
def derive(neuron: Definition) -> KernelSpec:
    """Differentiate ``neuron``'s step map and return its :class:`KernelSpec`."""
    found = dict(partials(neuron))
    prev, _tilde, new = state_symbols(len(neuron.states))
    cnames = dict(zip(neuron.params, param_cnames(tuple(neuron.params)), strict=True))
    rename = {neuron.symbols[n]: sp.Symbol(c, real=True) for n, c in cnames.items()}
    symbol_of = {"V": V, "X": X, **{n: rename[neuron.symbols[n]] for n in neuron.params}}
    symbol_of.update(dict(zip(neuron.states, prev, strict=True)))
    # stages get kernel names of their own, as the params do: st<i>_<name>
    rename.update({z: sp.Symbol(f"st{i}_{z}", real=True) for i, (z, _) in enumerate(neuron.stages)})
    as_internal = {**rename, **dict(zip(neuron.state_symbols.values(), prev, strict=True))}
    step = step_map(neuron, rename)
    seeds = {K.s: K.grad_s, K.v_new: K.grad_v, **{wn: grad_w_seed(i) for i, wn in enumerate(new)}}
    inputs = ["V", *neuron.states, "X", *neuron.learnable]
    adjoint = transpose(
        step.nodes,
        seeds,
        _known_partials(neuron, found, symbol_of, as_internal),
        neuron.detach_reset,
        neuron.firing == "crossing",
        [symbol_of[n] for n in inputs],
    )
    grad_names = {"V": "V", "X": "X", **cnames, **{w: f"W{i}" for i, w in enumerate(neuron.states)}}
    targets = [
        (grad_symbol(grad_names[n]), adjoint.values.get(symbol_of[n], sp.Integer(0)))
        for n in inputs
    ]
    stages = [(n.symbol, n.expr) for n in step.stages]
    charge, backward = blocks(stages, (K.h, step.charge.expr), targets, adjoint.lines)
    resets = step.state_resets
    sg = neuron.surrogate.derivative().subs(U_SURROGATE, K.u)
    p = step.spike.expr if neuron.firing == "escape" else None  # p(h) in the kernels' symbols
    return KernelSpec(
        name=neuron.name,
        key=neuron.key(),
        params=tuple(neuron.params),
        learnable=neuron.learnable,
        param_symbols={n: rename[neuron.symbols[n]] for n in neuron.params},
        charge=charge,
        threshold=step.threshold.expr,
        surrogate=cse_block([(K.sg, sg if p is None else sp.Integer(1))], "g"),
        reset=cse_block([(V, step.reset.expr)], "r"),
        backward=backward,
        v_start=neuron.v_start if isinstance(neuron.v_start, float) else 0.0,
        partials=found,
        states=tuple(neuron.states),
        state_init=tuple(s.init for s in neuron.states.values()),
        updates=cse_block([(n.symbol, n.expr) for n in step.updates], "a"),
        state_resets=cse_block([(w, n.expr) for w, n in zip(prev, resets, strict=True)], "q"),
        firing=neuron.firing,
        hard_reset=neuron.v_reset is not None,  # crossing firing has v_reset None
        noise_streams=neuron.noise_streams,
        probability=p,
    )
