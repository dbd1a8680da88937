"""The EventProp reference's backward: one neuron's adjoint through its events.

Per neuron, its events in reverse (its own spikes and its arrivals), λ(t − s) = Φ(s)ᵀλ(t)
between them, the derived jump at a spike with B = Σ Q (of the spike's arrivals in the
next layer) − ∂L/∂t_k, and at an arrival dL/dw += λ·∂m/∂w, dL/dd −= Q, B_source += Q.
Time constants and other params of f get ∫λ·∂f/∂θ dt by 8-point Gauss–Legendre
quadrature on pieces no longer than ``dt`` (λ and x are sums of exponentials there:
error far below float64's rounding for dt ≤ τ), thresholds and reset levels the derived
spike terms. A loss on the state (a readout's, :mod:`.readouts`) adds kicks to λ and a
continuous source to dλ/dt. A layer's neurons run back together, in time order: in a
recurrent layer a spike's B takes the Q of its arrivals at the layer's own neurons too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import sympy as sp
import torch

from .event_forward import Arrivals, Layer, Spike, padded_times
from .event_model import symbol_values

__all__ = [
    "GAUSS_NODES",
    "GAUSS_WEIGHTS",
    "Grads",
    "Kick",
    "Source",
    "StateLoss",
    "NO_STATE_LOSS",
    "NeuronAdjoint",
    "Sweep",
    "backward_layer",
    "zero_grads",
]

#: 8-point Gauss–Legendre nodes on [−1, 1] and their weights.
GAUSS_NODES, GAUSS_WEIGHTS = np.polynomial.legendre.leggauss(8)


class Grads(NamedTuple):
    """One layer's dL/dW, dL/dD, dL/dθ and each presynaptic spike's B (Σ Q); a
    recurrent layer's dL/dW_rec and dL/dD_rec too."""

    weight: torch.Tensor
    delay: torch.Tensor
    params: dict[str, torch.Tensor]
    source_b: torch.Tensor
    recurrent_weight: torch.Tensor | None = None
    recurrent_delay: torch.Tensor | None = None

    def looped(self, own_b: torch.Tensor) -> Grads:
        """A recurrent layer's recurrent gradients in a feedforward layer's places: the
        source spikes' B of its arrivals is the layer's own, ``own_b``."""
        assert self.recurrent_weight is not None and self.recurrent_delay is not None
        return Grads(self.recurrent_weight, self.recurrent_delay, self.params, own_b)


def zero_grads(layer: Layer, pre_times: torch.Tensor) -> Grads:
    """Zero gradients of ``layer`` fed ``pre_times`` (a recurrent layer's recurrent ones too)."""
    loop = layer.recurrent
    return Grads(
        torch.zeros_like(layer.weight),
        torch.zeros_like(layer.delay),
        {n: torch.zeros(layer.n, dtype=torch.float64) for n in layer.model.names},
        torch.zeros_like(pre_times),
        None if loop is None else torch.zeros_like(loop[0]),
        None if loop is None else torch.zeros_like(loop[1]),
    )


class Kick(NamedTuple):
    """A loss's ∂L/∂x(t) at one time: λ jumps by ``value`` there (backward in time)."""

    time: float
    value: torch.Tensor


#: ∂ℓ_V/∂x at times [q] as [n_states, q]: a continuous source in dλ/dt.
Source = Callable[[torch.Tensor], torch.Tensor]


class StateLoss(NamedTuple):
    """What a loss on a neuron's state adds to its adjoint: kicks and a source."""

    kicks: Sequence[Kick] = ()
    source: Source | None = None


NO_STATE_LOSS = StateLoss()
_ORDER = {"kick": 0, "arrival": 1, "spike": 2}


def backward_layer(
    layer: Layer,
    pre_times: torch.Tensor,
    spikes: list[list[Spike]],
    own_b: torch.Tensor,
    t_end: float,
    dt: float,
) -> Grads:
    """One layer's gradients given each of its spikes' B: its neurons' adjoints run back
    together, the layer's events in reverse time order. In a recurrent layer this puts a
    recurrent arrival's Q into its source spike's B (in ``own_b``, which gains it)
    before that neuron's adjoint reaches the spike, earlier by the delay (> 0)."""
    own_times = None if layer.recurrent is None else padded_times(spikes)
    arrivals = layer.arrivals(pre_times, t_end, own_times)
    grads = zero_grads(layer, pre_times)
    looped = None if layer.recurrent is None else grads.looped(own_b)
    sweeps = [
        Sweep(
            NeuronAdjoint(layer, j, dt),
            Arrivals(*(part[j] for part in arrivals)),
            spikes[j],
            own_b[j],
            t_end,
            grads,
            looped=looped,
        )
        for j in range(layer.n)
    ]
    order = sorted(
        (time, _ORDER[kind], j) for j, sweep in enumerate(sweeps) for time, kind, _ in sweep.events
    )
    for _, _, j in reversed(order):
        sweeps[j].step()
    for sweep in sweeps:
        sweep.finish()
    return grads


class Sweep:
    """One neuron's adjoint run back through its events, from λ(``t_end``) = 0: built,
    it has replayed the forward; each :meth:`step` takes the latest event not yet taken,
    :meth:`finish` runs λ back to 0. Its spikes' B is read from ``own_b`` when the step
    reaches them; arrivals through recurrent connections add into ``looped``."""

    def __init__(
        self,
        neuron: NeuronAdjoint,
        arrivals: Arrivals,
        spikes: list[Spike],
        own_b: torch.Tensor,
        t_end: float,
        grads: Grads,
        *,
        loss: StateLoss = NO_STATE_LOSS,
        looped: Grads | None = None,
    ) -> None:
        self.neuron, self.arrivals, self.spikes = neuron, arrivals, spikes
        self.own_b, self.grads, self.loss, self.looped = own_b, grads, loss, looped
        self.events = neuron.events(arrivals, spikes, loss.kicks)
        self.before, self.after = neuron.replay(self.events, arrivals, spikes)
        self.lam, self.upper, self.left = torch.zeros_like(self.after[0]), t_end, len(self.events)

    def step(self) -> None:
        e, neuron = self.left, self.neuron
        time, kind, index = self.events[e - 1]
        params = self.grads.params
        self.lam = neuron.integrate(
            time, self.upper, self.after[e], self.lam, params, self.loss.source
        )
        if kind == "spike":
            self.lam = neuron.spike(self.spikes[index], self.lam, float(self.own_b[index]), params)
        elif kind == "arrival":
            into = self.grads
            if self.looped is not None and bool(self.arrivals.recurrent[index]):
                into = self.looped
            self.lam = neuron.arrival(self.arrivals, index, self.before[e - 1], self.lam, into)
        else:
            self.lam = self.lam + self.loss.kicks[index].value
        self.upper, self.left = time, e - 1

    def finish(self) -> None:
        self.neuron.integrate(
            0.0, self.upper, self.after[0], self.lam, self.grads.params, self.loss.source
        )


class NeuronAdjoint:
    """One neuron's replay of its forward (its states at its events) and its adjoint."""

    def __init__(self, layer: Layer, j: int, dt: float) -> None:
        self.model, self.dt, self.j = layer.model, dt, j
        self.params = {n: v[j] for n, v in layer.params.items()}
        self.one = torch.ones((), dtype=torch.float64)

    def env(self, **parts: Any) -> dict[sp.Symbol, Any]:
        return symbol_values(self.model, self.params, **parts)

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
        self, arrivals: Arrivals, spikes: list[Spike], kicks: Sequence[Kick] = ()
    ) -> list[tuple[float, str, int]]:
        """The neuron's events in forward order: (time, "kick"|"arrival"|"spike", index);
        at one time a kick (a loss's ∂L/∂x there) before an arrival before a spike."""
        times = arrivals.times.tolist()
        out = [(float(t), "arrival", a) for a, t in enumerate(times) if np.isfinite(t)]
        out += [(s.time, "spike", k) for k, s in enumerate(spikes)]
        out += [(kick.time, "kick", k) for k, kick in enumerate(kicks)]
        return sorted(out, key=lambda e: (e[0], _ORDER[e[1]]))

    def replay(
        self, events: list[tuple[float, str, int]], arrivals: Arrivals, spikes: list[Spike]
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
        arrivals: Arrivals,
        spikes: list[Spike],
        own_b: torch.Tensor,
        t_end: float,
        grads: Grads,
        loss: StateLoss = NO_STATE_LOSS,
    ) -> None:
        """λ from t_end back to 0 through the neuron's events, adding into ``grads``;
        ``loss`` adds ∂L/∂x at its kicks and a continuous source ∂ℓ_V/∂x."""
        sweep = Sweep(self, arrivals, spikes, own_b, t_end, grads, loss=loss)
        while sweep.left:
            sweep.step()
        sweep.finish()

    def arrival(
        self, arrivals: Arrivals, index: int, x: torch.Tensor, lam: torch.Tensor, grads: Grads
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
        self, spike: Spike, lam: torch.Tensor, b: float, grad_p: dict[str, torch.Tensor]
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
        source: Source | None = None,
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
                nodes = torch.tensor(0.5 * length * (GAUSS_NODES + 1), dtype=torch.float64)
                xs = self.flow(states[piece][:, None].expand(-1, nodes.numel()), nodes)
                lams = self.adjoint_at(lam, b, a + nodes, source)
                values = self.model.integrands(self.env(x=xs, lam=lams), nodes)
                weights = torch.tensor(0.5 * length * GAUSS_WEIGHTS, dtype=torch.float64)
                for n, v in zip(self.model.names, values, strict=True):
                    grad_p[n][self.j] += (weights * v).sum()
                lam = self.adjoint_at(lam, b, torch.tensor([a], dtype=torch.float64), source)[:, 0]
        return lam

    def adjoint_at(
        self, lam: torch.Tensor, upper: float, times: torch.Tensor, source: Source | None
    ) -> torch.Tensor:
        """λ [k, q] at ``times`` [q] ≤ ``upper`` from λ(upper), no event between:
        Φ(upper − t)ᵀλ(upper) + ∫_t^upper Φ(τ − t)ᵀ ∂ℓ_V/∂x(τ) dτ, the source's integral
        by Gauss–Legendre on [t, upper]."""
        out = self.adjoint_flow(lam[:, None].expand(-1, times.numel()), upper - times)
        if source is None:
            return out
        span = (upper - times)[:, None]
        taus = times[:, None] + 0.5 * span * torch.as_tensor(GAUSS_NODES + 1)
        pushed = self.adjoint_flow(source(taus.reshape(-1)), (taus - times[:, None]).reshape(-1))
        weights = 0.5 * span * torch.as_tensor(GAUSS_WEIGHTS)
        return out + (pushed.reshape(-1, *taus.shape) * weights).sum(-1)
