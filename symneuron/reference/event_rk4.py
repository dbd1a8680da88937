"""The EventProp reference for nonlinear ODE neurons: RK4 steps, crossings on the step's
cubic Hermite interpolant, and the adjoint integrated back by RK4.

A neuron whose Jacobian J = ∂f/∂x depends on the state (QIF, EIF, AdEx: no closed-form
flow) runs here, its neurons in lockstep as :mod:`.event_forward` runs a linear one.
Forward, per sub-step [t_a, t_b] (steps of ``dt`` cut at arrivals and spikes): one RK4
step from x_a gives x_b; g along the sub-step is the cubic Hermite interpolant p_g(u),
u = (t − t_a)/(t_b − t_a), of (g, ġ) at both ends (for a threshold linear in x, g of the
states' Hermite interpolant p(u) from (x_a, f_a, x_b, f_b)). p_g′ is a quadratic: its
zeros in (0, 1) cut the sub-step into monotone pieces, so a crossing that comes back
down within the sub-step is found too; the first piece that ends at p_g ≥ 0 holds the
first crossing, found by Newton's method kept in its bracket, to rounding. The state
just before the spike is p(u*); the reset is applied there and the rest of the sub-step
is integrated again. Each sub-step's states at its start, middle (p(u/2)) and end are
recorded.

Backward, the record in reverse, all neurons in lockstep: dλ/dt = −Jᵀλ and the
parameter integrals ∫λ·∂f/∂θ dt by one RK4 step per sub-step (x at its end, middle and
start), the derived jump at each spike (B from the next layer), at each arrival
dL/dw += λ·∂m/∂w, dL/dd −= Q and the source's B += Q. The result approximates the
continuous model's gradient to O(dt⁴); it is not the exact gradient of the discretised
forward, which differs from it at O(dt³) (docs/eventprop.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import sympy as sp
import torch

from .event_adjoint import Grads, zero_grads
from .event_forward import Arrivals, Layer, Spike, padded_times
from .event_model import root_along_flow, symbol_values

__all__ = ["Segment", "Jump", "RK4Layer", "backward_rk4_layer", "hermite_root"]

Vector = list[torch.Tensor]


class Segment(NamedTuple):
    """One sub-step of every neuron of a layer (each [n]; ``length`` 0 where a neuron
    did not move): its length and the states at its start, middle and end."""

    length: torch.Tensor
    start: Vector
    middle: Vector
    end: Vector


class Jump(NamedTuple):
    """The events at the end of the segment recorded before it: which neurons
    (``mask``) spiked (``kind`` "spike", ``which`` the spike's slot) or received an
    arrival ("arrival", ``which`` its index in the sorted arrivals), and each one's state
    just before (x⁻)."""

    kind: str
    mask: torch.Tensor
    which: torch.Tensor
    before: Vector


def _axpy(a: torch.Tensor | float, x: Vector, y: Vector) -> Vector:
    """y + a·x, componentwise."""
    return [yi + a * xi for xi, yi in zip(x, y, strict=True)]


def _where(mask: torch.Tensor, a: Vector, b: Vector) -> Vector:
    return [torch.where(mask, ai, bi) for ai, bi in zip(a, b, strict=True)]


def hermite(
    ends: tuple[Vector, Vector],
    slopes: tuple[Vector, Vector],
    length: torch.Tensor,
    u: torch.Tensor,
) -> Vector:
    """The cubic Hermite interpolant at u ∈ [0, 1] of values ``ends`` = (x_a, x_b) and
    time derivatives ``slopes`` = (f_a, f_b) over a sub-step of ``length``."""
    (x_a, x_b), (f_a, f_b) = ends, slopes
    u2, u3 = u * u, u * u * u
    h00, h10 = 2 * u3 - 3 * u2 + 1, u3 - 2 * u2 + u
    h01, h11 = -2 * u3 + 3 * u2, u3 - u2
    return [
        h00 * xa + h10 * length * fa + h01 * xb + h11 * length * fb
        for xa, xb, fa, fb in zip(x_a, x_b, f_a, f_b, strict=True)
    ]


def _cubic(c: Sequence[torch.Tensor], u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """c₀ + c₁u + c₂u² + c₃u³ and its derivative."""
    value = c[0] + u * (c[1] + u * (c[2] + u * c[3]))
    slope = c[1] + u * (2 * c[2] + u * 3 * c[3])
    return value, slope


def _turns(c: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The zeros of the cubic's derivative c₁ + 2c₂u + 3c₃u² in (0, 1), ascending, 1
    where there is none (the stable quadratic formula)."""
    disc = c[2] * c[2] - 3 * c[1] * c[3]
    root = torch.sqrt(disc.clamp_min(0.0))
    q = -(c[2] + torch.where(c[2] >= 0, root, -root))
    first, second = q / (3 * c[3]), c[1] / q  # ±inf or NaN where c₃ or q is 0
    one = torch.ones_like(disc)
    inside = [(disc >= 0) & torch.isfinite(r) & (r > 0) & (r < 1) for r in (first, second)]
    first = torch.where(inside[0], first, one)
    second = torch.where(inside[1], second, one)
    return torch.minimum(first, second), torch.maximum(first, second)


def hermite_root(
    ends: tuple[torch.Tensor, torch.Tensor],
    slopes: tuple[torch.Tensor, torch.Tensor],
    length: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether the cubic Hermite interpolant of g (values ``ends`` = (g_a, g_b) < 0 at
    the start, time derivatives ``slopes``, over ``length``) reaches 0 in (0, 1], and
    the first u where it does (1 where not), to rounding.

    The interpolant's turns (zeros of its derivative, a quadratic) cut [0, 1] into
    monotone pieces; the first piece that ends at a value ≥ 0 brackets the first
    crossing, even where the interpolant comes back below 0 before u = 1.
    """
    (g_a, g_b), (r_a, r_b) = ends, slopes
    c = (
        g_a,
        length * r_a,
        -3 * g_a - 2 * length * r_a + 3 * g_b - length * r_b,
        2 * g_a + length * r_a - 2 * g_b + length * r_b,
    )
    zero, one = torch.zeros_like(g_a), torch.ones_like(g_a)
    moving = length > 0
    # the Hermite basis: h00 + h01 = 1, |h10|, |h11| ≤ 4/27 on [0, 1]
    bound = torch.maximum(g_a, g_b) + 4 / 27 * length * (r_a.abs() + r_b.abs())
    if not bool((moving & (bound >= 0)).any()):
        return torch.zeros_like(moving), one
    bounds = [zero, *_turns(c), one]
    found = torch.zeros_like(moving)
    lo, hi = zero, one
    for k in range(1, 4):
        reached = moving & ~found & (_cubic(c, bounds[k])[0] >= 0)
        lo = torch.where(reached, bounds[k - 1], lo)
        hi = torch.where(reached, bounds[k], hi)
        found = found | reached
    if not bool(found.any()):
        return found, one
    return found, torch.where(found, _bracketed_newton(c, lo, hi, found), one)


def _bracketed_newton(
    c: Sequence[torch.Tensor], lo: torch.Tensor, hi: torch.Tensor, active: torch.Tensor
) -> torch.Tensor:
    """The zero of the cubic ``c`` in [lo, hi], where it is < 0 at lo and ≥ 0 at hi and
    monotone between (:func:`~.event_model.root_along_flow` along u itself)."""

    def value(u: torch.Tensor) -> list[torch.Tensor]:
        return [_cubic(c, u)[0]]

    def slope(u: torch.Tensor) -> list[torch.Tensor]:
        return [_cubic(c, u)[1]]

    return root_along_flow(
        lambda _, u: u,
        lambda fn, u: fn(u)[0],
        (value, slope),
        None,
        (lo, hi),
        torch.ones_like(active),
        active,
    )


class RK4Layer(Layer):
    """A layer of a nonlinear neuron (:class:`~.event_forward.Layer`'s arrivals and
    params): its RK4 forward in lockstep over its neurons, recorded for
    :func:`backward_rk4_layer`."""

    #: the forward's segments and jumps, in forward order (set by :meth:`forward`)
    record: list[Segment | Jump]

    def rhs(self, x: Vector) -> Vector:
        return self.model.rhs(symbol_values(self.model, self.params, x=x), x[0])

    def rk4(self, x: Vector, h: torch.Tensor) -> Vector:
        """One classical Runge–Kutta step of dx/dt = f(x) over ``h`` ([n])."""
        k1 = self.rhs(x)
        k2 = self.rhs(_axpy(0.5 * h, k1, x))
        k3 = self.rhs(_axpy(0.5 * h, k2, x))
        k4 = self.rhs(_axpy(h, k3, x))
        total = [a + 2 * b + 2 * c + d for a, b, c, d in zip(k1, k2, k3, k4, strict=True)]
        return _axpy(h / 6, total, x)

    def forward(self, pre_times: torch.Tensor, t_end: float, dt: float) -> list[list[Spike]]:
        self.record = []
        return super().forward(pre_times, t_end, dt)

    def arrive(self, arriving: torch.Tensor, index: torch.Tensor, x: Vector) -> None:
        self.record.append(Jump("arrival", arriving, index.clone(), x))

    def advance(
        self, x: Vector, t: torch.Tensor, to: torch.Tensor, spikes: list[list[Spike]]
    ) -> tuple[Vector, torch.Tensor]:
        """x and t moved to ``to`` by an RK4 step, cut at each crossing on the way: the
        spike there, the reset, and a new RK4 step over the rest."""
        while True:
            length = to - t
            end = self.rk4(x, length)
            slopes = (self.rhs(x), self.rhs(end))
            crossing, u = self.crossing(x, end, length)
            middle = hermite((x, end), slopes, length, 0.5 * u)
            before = hermite((x, end), slopes, length, u) if bool(crossing.any()) else end
            stop = _where(crossing, before, end)
            self.record.append(Segment(u * length, x, middle, stop))
            if not bool(crossing.any()):
                return end, to.clone()
            slots = torch.tensor([len(row) for row in spikes])
            for j in crossing.nonzero()[:, 0].tolist():
                spike_at = float(t[j] + u[j] * length[j])
                spikes[j].append(Spike(spike_at, torch.stack([b[j] for b in before])))
            self.record.append(Jump("spike", crossing, slots, before))
            reset = self.model.reset(symbol_values(self.model, self.params, x=before), t)
            margin = self.value(self.model.margin, before)
            if bool((crossing & (margin >= 0)).any()):
                raise RuntimeError("A reset did not leave the threshold (g(h(x)) ≥ 0) at a spike.")
            x = _where(crossing, reset, end)
            t = torch.where(crossing, t + u * length, to)

    def crossing(
        self, x: Vector, end: Vector, length: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Whether g crosses 0 on the sub-step from x to ``end`` (on the Hermite
        interpolant of g and ġ at both ends), and the first u ∈ (0, 1] where (1 where
        it does not)."""
        g = (self.value(self.model.g, x), self.value(self.model.g, end))
        rates = (self.value(self.model.g_dot, x), self.value(self.model.g_dot, end))
        return hermite_root(g, rates, length)


class _Adjoint:
    """One layer's adjoint state λ [n] per state, run back through its record."""

    def __init__(self, layer: RK4Layer, grads: Grads, own_b: torch.Tensor) -> None:
        self.layer, self.model, self.grads, self.own_b = layer, layer.model, grads, own_b
        self.zero = torch.zeros(layer.n, dtype=torch.float64)
        self.lam: Vector = [self.zero.clone() for _ in self.model.spec.states]

    def env(self, x: Vector, lam: Vector, **parts: torch.Tensor) -> dict[sp.Symbol, Any]:
        return symbol_values(self.model, self.layer.params, x=x, lam=lam, **parts)

    def rates(self, x: Vector, lam: Vector) -> tuple[Vector, Vector]:
        """dλ/ds = Jᵀλ (s = time run backward) and the integrands λ·∂f/∂θ, at x."""
        env = self.env(x, lam)
        return (
            [-r for r in self.model.adjoint_rhs(env, self.zero)],
            self.model.integrands(env, self.zero),
        )

    def segment(self, seg: Segment) -> None:
        """λ from the segment's end to its start by one RK4 step (x at the end, middle
        and start), adding ∫λ·∂f/∂θ over it to the param gradients."""
        h = seg.length
        k1, i1 = self.rates(seg.end, self.lam)
        k2, i2 = self.rates(seg.middle, _axpy(0.5 * h, k1, self.lam))
        k3, i3 = self.rates(seg.middle, _axpy(0.5 * h, k2, self.lam))
        k4, i4 = self.rates(seg.start, _axpy(h, k3, self.lam))
        step = [a + 2 * b + 2 * c + d for a, b, c, d in zip(k1, k2, k3, k4, strict=True)]
        self.lam = _axpy(h / 6, step, self.lam)
        for name, a, b, c, d in zip(self.model.names, i1, i2, i3, i4, strict=True):
            self.grads.params[name] += h / 6 * (a + 2 * b + 2 * c + d)

    def spike(self, jump: Jump) -> None:
        """The derived jump λ⁺ → λ⁻ at each masked neuron's spike, and its param terms."""
        slot = torch.where(jump.mask, jump.which, 0)
        b = self.own_b.gather(1, slot[:, None])[:, 0]
        env = self.env(jump.before, self.lam, B=b)
        for name, term in zip(
            self.model.names, self.model.spike_partials(env, self.zero), strict=True
        ):
            self.grads.params[name] += torch.where(jump.mask, term, 0.0)
        self.lam = _where(jump.mask, self.model.jump(env, self.zero), self.lam)

    def arrival(self, jump: Jump, arrivals: Arrivals) -> None:
        """At each masked neuron's arrival: dL/dw += λ·∂m/∂w, dL/dd −= Q, the source
        spike's B += Q (a recurrent arrival's: the recurrent W and D, the layer's own
        spike's B), and λ ← (∂m/∂x)ᵀλ."""
        a = torch.where(jump.mask, jump.which, 0)[:, None]
        env = self.env(jump.before, self.lam, w=arrivals.weights.gather(1, a)[:, 0])
        j = jump.mask.nonzero()[:, 0]
        i, k = arrivals.source.gather(1, a)[j, 0], arrivals.slot.gather(1, a)[j, 0]
        partial = self.model.weight_partial(env, self.zero)[0][j]
        q = self.model.target_term(env, self.zero)[0][j]
        looped = arrivals.recurrent.gather(1, a)[j, 0]
        routes = [(~looped, self.grads)]
        if bool(looped.any()):
            routes.append((looped, self.grads.looped(self.own_b)))
        for rows, into in routes:
            into.weight.index_put_((j[rows], i[rows]), partial[rows], True)
            into.delay.index_put_((j[rows], i[rows]), -q[rows], True)
            into.source_b.index_put_((i[rows], k[rows]), q[rows], True)
        self.lam = _where(jump.mask, self.model.synapse_t(env, self.zero), self.lam)


def backward_rk4_layer(
    layer: Layer,
    pre_times: torch.Tensor,
    spikes: list[list[Spike]],
    own_b: torch.Tensor,
    t_end: float,
    dt: float,
) -> Grads:
    """One :class:`RK4Layer`'s gradients (as :func:`~.event_adjoint.backward_layer`'s),
    its recorded forward run back in lockstep, given each of its spikes' B. In a
    recurrent layer an arrival of the layer's own spike is recorded in a later step than
    the spike (the delay is at least one step), so its Q is in the spike's B
    (``own_b``, which gains it) before the record's spike is reached."""
    assert isinstance(layer, RK4Layer)
    del dt  # the record holds each spike's state and slot, and the sub-steps
    arrivals = layer.arrivals(pre_times, t_end, padded_times(spikes))
    adjoint = _Adjoint(layer, zero_grads(layer, pre_times), own_b)
    for entry in reversed(layer.record):
        if isinstance(entry, Segment):
            adjoint.segment(entry)
        elif entry.kind == "spike":
            adjoint.spike(entry)
        else:
            adjoint.arrival(entry, arrivals)
    return adjoint.grads
