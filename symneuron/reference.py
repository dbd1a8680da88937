"""The torch reference: the living definition of a neuron's semantics.

The same equations as torch ops (SymPy's torch printer), a Python loop over t,
and torch autograd for the backward. The surrogate enters as a straight-through
term, S = Θ(u) + σ(u) − stop_grad(σ(u)), so torch differentiates the primitive σ
itself: nothing here uses a SymPy derivative, which makes this an independent
oracle for the generated kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

import sympy as sp
import torch
from sympy.printing.pytorch import TorchPrinter

from . import rng as _rng
from .definition import Definition, H, S, V, X
from .stochastic import NOISES
from .surrogate import Surrogate
from .surrogate import u as U

__all__ = ["torch_function", "spike", "level_value", "simulate_reference"]


class _Printer(TorchPrinter):
    """SymPy's torch printer plus the special functions it lacks."""

    _kf = {**TorchPrinter._kf, "erfc": "torch.special.erfc", "erf": "torch.special.erf"}

    def _print_erfc(self, expr: sp.Expr) -> str:
        return f"torch.special.erfc({self._print(expr.args[0])})"

    def _print_erf(self, expr: sp.Expr) -> str:
        return f"torch.special.erf({self._print(expr.args[0])})"

    def _print_expm1(self, expr: sp.Expr) -> str:
        return f"torch.expm1({self._print(expr.args[0])})"

    def _extremum(self, expr: sp.Expr, pairwise: str, bound: str) -> str:
        """Max/Min: tensors pairwise, numbers as a clamp (torch's max/min take no numbers)."""
        numbers = [a for a in expr.args if a.is_number]
        tensors = [self._print(a) for a in expr.args if not a.is_number]
        if not tensors:
            return self._print(sp.Float(expr.evalf(20), 20))
        text = tensors[0]
        for other in tensors[1:]:
            text = f"{pairwise}({text}, {other})"
        for number in numbers:
            text = f"torch.clamp({text}, {bound}={self._print(sp.Float(number.evalf(20), 20))})"
        return text

    def _print_Max(self, expr: sp.Expr) -> str:
        return self._extremum(expr, "torch.maximum", "min")

    def _print_Min(self, expr: sp.Expr) -> str:
        return self._extremum(expr, "torch.minimum", "max")


def _numbers_as_floats(expr: sp.Expr) -> sp.Expr:
    """Constant subexpressions (sqrt(2), exp(-1), pi**2) as floats: torch ops need tensors."""
    return expr.replace(
        lambda e: isinstance(e, sp.Expr) and e.is_number and not e.is_Number,
        lambda e: sp.Float(e.evalf(20), 20),
    )


def torch_function(args: Sequence[sp.Symbol], expr: sp.Expr) -> Callable[..., torch.Tensor]:
    """``expr`` as a Python function of torch tensors (SymPy's lambdify, once per
    arguments and expression: a reference run builds one per equation)."""
    return _lambdified(tuple(args), sp.sympify(expr))


@lru_cache(maxsize=1024)
def _lambdified(args: tuple[sp.Symbol, ...], expr: sp.Expr) -> Callable[..., torch.Tensor]:
    expr = _numbers_as_floats(expr)
    return sp.lambdify(list(args), expr, modules=[{"torch": torch}], printer=_Printer)


@lru_cache(maxsize=256)
def _surrogate_primitive(surrogate: Surrogate) -> Callable[..., torch.Tensor]:
    return torch_function([U], surrogate.primitive_in_u())


class _ZeroValue(torch.autograd.Function):
    """0 forward, the gradient unchanged backward: the straight-through term, whose value
    stays exactly 0 where the primitive is not finite (σ − stop_grad(σ) would be NaN)."""

    @staticmethod
    def forward(ctx: Any, primitive: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(primitive)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def spike(u: torch.Tensor, surrogate: Surrogate) -> torch.Tensor:
    """Θ(u) (Θ(0) = 1, Θ(NaN) = 0: always exactly 0 or 1) forward; the derivative of the
    surrogate primitive backward (NaN where u is NaN, as in the kernels)."""
    primitive = _surrogate_primitive(surrogate)(u)
    if not isinstance(primitive, torch.Tensor):
        primitive = torch.as_tensor(primitive, dtype=u.dtype, device=u.device)
    return (u >= 0).to(u.dtype) + _ZeroValue.apply(primitive)


def as_tensor(value: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(like.dtype)
    return torch.as_tensor(value, dtype=like.dtype, device=like.device)


def _round_through(h: torch.Tensor, storage: torch.dtype | None) -> torch.Tensor:
    """Round ``h`` to ``storage`` in value only (gradient passes straight through).

    An infinite ``h`` stays itself (``h + (inf - inf)`` would be NaN); a finite one past
    the storage type's range becomes ±inf, as the kernels store it.
    """
    if storage is None or storage == h.dtype:
        return h
    value = h.detach()
    rounded = value.to(storage).to(h.dtype)
    return torch.where(rounded == value, h, h + (rounded - value))


def level_value(
    neuron: Definition, level: float | sp.Expr, theta: list[torch.Tensor], like: torch.Tensor
) -> float | torch.Tensor:
    """A threshold or reset level: the number, or its expression at the param values."""
    if not isinstance(level, sp.Expr):
        return level
    fn = torch_function([neuron.symbols[n] for n in neuron.params], level)
    return as_tensor(fn(*theta), like)


class Draws(NamedTuple):
    """A noisy run's draws as the kernels key them (:mod:`symneuron.rng`): the seed and
    offset, each neuron's flat index, the dtype drawn in (float32 or float64)."""

    seed: int
    offset: int
    neuron: torch.Tensor
    dtype: torch.dtype

    def normals(self, streams: Sequence[int], t: int, like: torch.Tensor) -> list[torch.Tensor]:
        """Each stream's standard normals at step ``t``, as ``like``'s dtype."""
        key = (self.seed, self.offset)
        return [_rng.normal(*key, i, t, self.neuron, self.dtype).to(like) for i in streams]

    def uniform(self, t: int, like: torch.Tensor) -> torch.Tensor:
        """The escape stream's uniforms at step ``t``."""
        key = (self.seed, self.offset, _rng.ESCAPE_STREAM, t, self.neuron, self.dtype)
        return _rng.uniform(*key).to(like)


def draws_of(
    state: torch.Tensor | None, like: torch.Tensor, emulated: bool = False
) -> Draws | None:
    """The :class:`Draws` of a generator state (int64 [seed, offset]) for a run like
    ``like`` ([T, *shape]); 16-bit runs, and a float64 run that ``emulated`` them, draw in
    float32, as those kernels compute."""
    if state is None:
        return None
    neuron = torch.arange(like[0].numel(), device=like.device).reshape(like.shape[1:])
    dtype = torch.float64 if like.dtype == torch.float64 and not emulated else torch.float32
    return Draws(int(state[0]), int(state[1]), neuron, dtype)


class _Step(NamedTuple):
    """One time step of a neuron at fixed param values θ, as torch functions.

    In the kernels' order: the integrator's stages K (each from the earlier ones);
    H = f(V, X, W, θ, K); each W̃ = g(V, X, H, W, θ, K);
    S = Θ(H − V_th(W̃, θ)) (for ``firing="crossing"`` only where V was below V_th);
    then the reset of V and each W after the spike. ``round_h_to`` rounds H and each
    W̃ in value only (``_round_through``). A NamedTuple, which torch.compile traces.
    """

    neuron: Definition
    stages: list[Callable[..., torch.Tensor]]  # (V, X, *W, *θ, *K earlier) -> K_i
    charge: Callable[..., torch.Tensor]  # (V, X, *W, *θ, *K) -> H
    updates: list[Callable[..., torch.Tensor]]  # (V, X, H, *W, *θ, *K) -> W̃, one per state
    resets: list[Callable[..., torch.Tensor]]  # (S, *W̃, *θ) -> W after the spike
    threshold: Callable[..., torch.Tensor]  # (*W̃, *θ) -> V_th
    theta: list[torch.Tensor]
    v_reset: float | torch.Tensor | None
    round_h_to: torch.dtype | None
    draws: Draws | None = None  # the generator's state, for a neuron that draws
    probability: Callable[..., torch.Tensor] | None = None  # (H, *θ) -> p(H), escape


def _make_step(
    neuron: Definition,
    params: dict[str, float | torch.Tensor],
    like: torch.Tensor,
    round_h_to: torch.dtype | None,
    draws: Draws | None = None,
) -> _Step:
    """``neuron``'s equations as torch functions, with ``params`` as tensors like ``like``;
    the draws (``noise<i>``) are the last arguments of the charge and the updates."""
    names = list(neuron.params)  # a list: Dynamo cannot iterate the mappingproxy itself
    p_syms = [neuron.symbols[n] for n in names]
    w_syms = list(neuron.state_symbols.values())
    states = neuron.states.values()
    theta = [as_tensor(params[n], like) for n in names]
    v_reset = neuron.v_reset
    base = [*w_syms, *p_syms]
    k_syms = [z for z, _ in neuron.stages]
    z_syms = [NOISES[i] for i in neuron.noise_streams]
    p = neuron.spike_probability
    return _Step(
        neuron=neuron,
        stages=[
            torch_function([V, X, *base, *k_syms[:i]], e) for i, (_, e) in enumerate(neuron.stages)
        ],
        charge=torch_function([V, X, *base, *k_syms, *z_syms], neuron.charge),
        updates=[torch_function([V, X, H, *base, *k_syms, *z_syms], s.update) for s in states],
        resets=[torch_function([S, *w_syms, *p_syms], s.on_spike) for s in states],
        threshold=torch_function([*w_syms, *p_syms], sp.sympify(neuron.v_threshold)),
        theta=theta,
        v_reset=None if v_reset is None else level_value(neuron, v_reset, theta, like),
        round_h_to=round_h_to,
        draws=draws,
        probability=None if p is None else torch_function([H, *p_syms], p),
    )


def _take_step(
    step: _Step, v: torch.Tensor, w: list[torch.Tensor], x_seq: torch.Tensor, t: int
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """``(S, V, W)`` after step ``t`` from ``(V, W)``.

    Each use indexes ``x_seq[t]`` anew: one select per use fixes the order in which
    autograd sums the gradient of ``x_seq`` (one shared select changes it by an ulp).
    """
    neuron, theta, round_h_to = step.neuron, step.theta, step.round_h_to
    k: list[torch.Tensor] = []  # the stages, each from the earlier ones
    for stage in step.stages:
        k.append(as_tensor(stage(v, x_seq[t], *w, *theta, *k), x_seq))
    z = [] if step.draws is None else step.draws.normals(neuron.noise_streams, t, x_seq)
    h = _round_through(as_tensor(step.charge(v, x_seq[t], *w, *theta, *k, *z), x_seq), round_h_to)
    w_tilde = [
        _round_through(as_tensor(g(v, x_seq[t], h, *w, *theta, *k, *z), x_seq), round_h_to)
        for g in step.updates
    ]
    v_th = as_tensor(step.threshold(*w_tilde, *theta), x_seq)
    s = spike(h - v_th, neuron.surrogate) if step.probability is None else _escape(step, h, t)
    if neuron.firing == "crossing":  # from below only: the gate is a constant
        s = s * (v < v_th).to(s.dtype).detach()
    s_reset = s.detach() if neuron.detach_reset else s
    v = _reset_v(step, h, v_th, s_reset)
    w = [as_tensor(r(s_reset, *w_tilde, *theta), x_seq).expand_as(v) for r in step.resets]
    return s, v, w


def _escape(step: _Step, h: torch.Tensor, t: int) -> torch.Tensor:
    """Escape firing: S = [u < p(H)] forward, dp/dH backward (straight through p)."""
    assert step.draws is not None and step.probability is not None
    p = as_tensor(step.probability(h, *step.theta), h)
    return (step.draws.uniform(t, h) < p).to(h.dtype) + _ZeroValue.apply(p)


def _reset_v(
    step: _Step, h: torch.Tensor, v_th: torch.Tensor, s_reset: torch.Tensor
) -> torch.Tensor:
    """V after the spike: H (crossing), H − V_th·S (soft) or to ``v_reset`` (hard)."""
    if step.neuron.firing == "crossing":
        return h
    if step.v_reset is None:
        return h - v_th * s_reset
    return h * (1 - s_reset) + step.v_reset * s_reset


def simulate_reference(
    neuron: Definition,
    x_seq: torch.Tensor,
    v_init: torch.Tensor,
    params: dict[str, float | torch.Tensor],
    *,
    store_v_seq: bool = True,
    round_h_to: torch.dtype | None = None,
    w_init: dict[str, torch.Tensor] | None = None,
    rng: torch.Tensor | None = None,
) -> Any:
    """Run ``neuron`` over ``x_seq`` [T, *shape] with torch ops; differentiable.

    Returns ``(spike_seq, v_seq)``, plus a dict of the extra states' values (after
    every step, or the last) for a neuron with states; ``w_init`` gives their
    initial values (default: each ``State.init``). ``round_h_to`` rounds H (and
    each W̃) to a narrower dtype each step (value only), emulating the kernels'
    16-bit storage so that a float64 run follows the same spike train. ``rng`` is the
    generator's state (int64 [seed, offset]) of a neuron that draws: the draws are the
    kernels' (:mod:`symneuron.rng`, each neuron keyed by its flat index).
    """
    if neuron.draws and rng is None:
        raise ValueError(f"{neuron.name} draws random numbers: give rng=[seed, offset].")
    draws = draws_of(rng, x_seq, emulated=round_h_to is not None)
    step = _make_step(neuron, params, x_seq, round_h_to, draws)
    v = v_init
    w = [
        as_tensor((w_init or {}).get(name, state.init), x_seq).expand_as(v_init)
        for name, state in neuron.states.items()
    ]
    spikes, vs, ws = [], [], []
    for t in range(x_seq.shape[0]):
        s, v, w = _take_step(step, v, w, x_seq, t)
        spikes.append(s)
        vs.append(v)
        ws.append(w)
    v_seq = _stack(vs, x_seq) if store_v_seq else v.unsqueeze(0)
    if len(neuron.states) == 0:
        return _stack(spikes, x_seq), v_seq
    w_seqs = {
        name: _stack([w_t[i] for w_t in ws], x_seq) if store_v_seq else w[i].unsqueeze(0)
        for i, name in enumerate(neuron.states)
    }
    return _stack(spikes, x_seq), v_seq, w_seqs


def _stack(steps: list[torch.Tensor], x_seq: torch.Tensor) -> torch.Tensor:
    """The steps as one [T, *shape] tensor; for T = 0, an empty one shaped as ``x_seq``."""
    return torch.stack(steps) if steps else x_seq * 0
