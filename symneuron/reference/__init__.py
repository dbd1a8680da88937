"""The torch reference: the living definition of a neuron's semantics.

The same equations as torch ops (SymPy's torch printer), a Python loop over t,
and torch autograd for the backward. The surrogate enters as a straight-through
term, S = Θ(u) + σ(u) − stop_grad(σ(u)), so torch differentiates the primitive σ
itself: nothing here uses a SymPy derivative, which makes this an independent
oracle for the generated kernels.

The equations as torch functions come from :mod:`.equations`, built before tracing
under ``torch.compile``, so that a ``backend="torch"`` layer compiles with
``fullgraph=True``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import sympy as sp
import torch

from .. import rng as _rng
from ..definition import Definition
from ..stochastic import check_state_values
from ..surrogate import Surrogate
from ..surrogate import u as U
from .equations import Equations, equations, torch_function

__all__ = ["torch_function", "spike", "level_value", "simulate_reference"]


class _ZeroValue(torch.autograd.Function):
    """0 forward, the gradient unchanged backward: the straight-through term, whose value
    stays exactly 0 where the primitive is not finite (σ − stop_grad(σ) would be NaN).
    Its forward takes no ``ctx`` (``setup_context`` keeps nothing), so ``torch.vmap`` and
    ``torch.func.jacrev`` transform it, with the vmap rule generated. No ``jvp``: Dynamo
    cannot trace a Function that has one; eager runs use :class:`_ZeroValueJvp`."""

    generate_vmap_rule = True

    @staticmethod
    def forward(primitive: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(primitive)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        return None

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _ZeroValueJvp(_ZeroValue):
    """:class:`_ZeroValue` with its forward-mode rule (the tangent unchanged), for
    ``torch.func.jacfwd``, ``jvp`` and ``torch.autograd.forward_ad`` outside compilation."""

    @staticmethod
    def jvp(ctx: Any, tangent: torch.Tensor) -> torch.Tensor:
        return tangent


def _straight_through(value: torch.Tensor) -> torch.Tensor:
    """0, with ``value``'s derivative: the Function that the current mode can run."""
    if torch.compiler.is_compiling():
        return _ZeroValue.apply(value)
    return _ZeroValueJvp.apply(value)


def spike(u: torch.Tensor, surrogate: Surrogate) -> torch.Tensor:
    """Θ(u) (Θ(0) = 1, Θ(NaN) = 0: always exactly 0 or 1) forward; the derivative of the
    surrogate primitive backward (NaN where u is NaN, as in the kernels)."""
    return _spike(u, torch_function([U], surrogate.primitive_in_u()))


def _spike(u: torch.Tensor, primitive_of: Callable[..., torch.Tensor]) -> torch.Tensor:
    """:func:`spike` with the surrogate's primitive σ(u) as a torch function."""
    primitive = primitive_of(u)
    if not isinstance(primitive, torch.Tensor):
        primitive = torch.as_tensor(primitive, dtype=u.dtype, device=u.device)
    return (u >= 0).to(u.dtype) + _straight_through(primitive)


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
    fn = equations(neuron).levels.get(str(level))
    if fn is None:  # a level other than the neuron's own (not under torch.compile)
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
    seed, offset = int(state[0]), int(state[1])
    check_state_values(seed, offset)
    return Draws(seed, offset, neuron, dtype)


class _Step(NamedTuple):
    """One time step of a neuron at fixed param values θ: its :class:`Equations`, θ and
    the reset level as tensors. ``round_h_to`` rounds H and each W̃ in value only
    (``_round_through``). A NamedTuple, which torch.compile traces."""

    neuron: Definition
    equations: Equations
    theta: list[torch.Tensor]
    v_reset: float | torch.Tensor | None
    round_h_to: torch.dtype | None
    draws: Draws | None = None  # the generator's state, for a neuron that draws


def _make_step(
    neuron: Definition,
    params: dict[str, float | torch.Tensor],
    like: torch.Tensor,
    round_h_to: torch.dtype | None,
    draws: Draws | None = None,
) -> _Step:
    """``neuron``'s step with ``params`` as tensors like ``like``."""
    names = list(neuron.params)  # a list: Dynamo cannot iterate the mappingproxy itself
    theta = [as_tensor(params[n], like) for n in names]
    v_reset = neuron.v_reset
    return _Step(
        neuron=neuron,
        equations=equations(neuron),
        theta=theta,
        v_reset=None if v_reset is None else level_value(neuron, v_reset, theta, like),
        round_h_to=round_h_to,
        draws=draws,
    )


def _take_step(
    step: _Step, v: torch.Tensor, w: list[torch.Tensor], x_seq: torch.Tensor, t: int
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """``(S, V, W)`` after step ``t`` from ``(V, W)``.

    Each use indexes ``x_seq[t]`` anew: one select per use fixes the order in which
    autograd sums the gradient of ``x_seq`` (one shared select changes it by an ulp).
    """
    neuron, theta, round_h_to, eqs = step.neuron, step.theta, step.round_h_to, step.equations
    k: list[torch.Tensor] = []  # the stages, each from the earlier ones
    for stage in eqs.stages:
        k.append(as_tensor(stage(v, x_seq[t], *w, *theta, *k), x_seq))
    z = [] if step.draws is None else step.draws.normals(neuron.noise_streams, t, x_seq)
    h = _round_through(as_tensor(eqs.charge(v, x_seq[t], *w, *theta, *k, *z), x_seq), round_h_to)
    w_tilde = [
        _round_through(as_tensor(g(v, x_seq[t], h, *w, *theta, *k, *z), x_seq), round_h_to)
        for g in eqs.updates
    ]
    v_th = as_tensor(eqs.threshold(*w_tilde, *theta), x_seq)
    s = _spike(h - v_th, eqs.primitive) if eqs.probability is None else _escape(step, h, t)
    if neuron.firing == "crossing":  # from below only: the gate is a constant
        s = s * (v < v_th).to(s.dtype).detach()
    s_reset = s.detach() if neuron.detach_reset else s
    v = _reset_v(step, h, v_th, s_reset)
    w = [as_tensor(r(s_reset, *w_tilde, *theta), x_seq).expand_as(v) for r in eqs.resets]
    return s, v, w


def _escape(step: _Step, h: torch.Tensor, t: int) -> torch.Tensor:
    """Escape firing: S = [u < p(H)] forward, dp/dH backward (straight through p)."""
    probability = step.equations.probability
    assert step.draws is not None and probability is not None
    p = as_tensor(probability(h, *step.theta), h)
    return (step.draws.uniform(t, h) < p).to(h.dtype) + _straight_through(p)


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
