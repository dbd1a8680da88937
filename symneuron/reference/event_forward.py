"""The EventProp reference's forward of one layer: its neurons in lockstep, exactly.

The input spikes arrive at their exact times t_k + d_ji (delays continuous); between
breakpoints (arrivals and step ends) the state moves by the closed-form flow
x(s) = Φ(s)x + Γ(s); a crossing of g = 0 inside a sub-interval is found by splitting it
at the zero of ġ (at most one for two states with distinct real rates: g along the flow
is c₀ + c₁e^{μ₁s} + c₂e^{μ₂s}), then Newton's method safeguarded by bisection on the
monotone piece, to rounding; the reset is applied there and the rest of the sub-interval
is run again, so a neuron may spike several times in a step.

A recurrent layer's own spikes arrive at its neurons too, through its recurrent weights
and delays: the arrivals of each step's spikes join the queue at the step's end, which
is exact because every recurrent delay is at least one step (its arrivals fall in a
later step; :func:`~.events.event_network` checks it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import torch

from .event_model import EventModel, root_along_flow, symbol_values

__all__ = ["Arrivals", "Spike", "Layer", "layers_of", "padded_times"]


class Arrivals(NamedTuple):
    """Arrivals sorted by time per neuron ([n, M + 1], an +inf column last): time,
    weight, the source neuron and slot of the spike that sent each, and whether it came
    through the layer's recurrent connections (the source one of the layer's own)."""

    times: torch.Tensor
    weights: torch.Tensor
    source: torch.Tensor
    slot: torch.Tensor
    recurrent: torch.Tensor


class Spike(NamedTuple):
    """One spike of a neuron: its time and the state just before it."""

    time: float
    before: torch.Tensor  # x⁻, [n_states]


def padded_times(spikes: list[list[Spike]]) -> torch.Tensor:
    """Each neuron's spike times [n, K] (K the most of any neuron, at least 1), +inf padded."""
    slots = max(1, max((len(s) for s in spikes), default=0))
    out = torch.full((len(spikes), slots), torch.inf, dtype=torch.float64)
    for j, row in enumerate(spikes):
        out[j, : len(row)] = torch.tensor([spike.time for spike in row], dtype=torch.float64)
    return out


class Layer:
    """One layer as the reference runs it (its tensors detached, a param not given at its
    default): its forward in lockstep over its neurons, and what each neuron's backward
    (:class:`~.event_adjoint.NeuronAdjoint`) reads. ``recurrent``: the recurrent weights
    and delays [n, n] of a recurrent layer (target, source), or None."""

    def __init__(
        self,
        model: EventModel,
        weight: torch.Tensor,
        delay: torch.Tensor,
        params: Mapping[str, torch.Tensor],
        recurrent: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        self.model = model
        self.weight, self.delay = weight, delay
        self.recurrent = recurrent
        self.n = weight.shape[0]
        defaults = model.definition.params
        self.params = {
            n: (
                params[n]
                if n in params
                else torch.full((self.n,), defaults[n], dtype=torch.float64)
            )
            for n in model.names
        }

    # -- forward ------------------------------------------------------------
    def flow(self, x: list[torch.Tensor], s: torch.Tensor) -> list[torch.Tensor]:
        env = symbol_values(self.model, self.params, s=s)
        phi, gamma = self.model.flow(env, s), self.model.offset(env, s)
        k = len(x)
        return [sum((phi[i * k + j] * x[j] for j in range(k)), gamma[i]) for i in range(k)]

    def value(self, fn: Callable[..., list[torch.Tensor]], x: list[torch.Tensor]) -> torch.Tensor:
        return fn(symbol_values(self.model, self.params, x=x), x[0])[0]

    def arrivals(
        self, pre_times: torch.Tensor, t_end: float, own_times: torch.Tensor | None = None
    ) -> Arrivals:
        """Each neuron's arrivals of the spikes ``pre_times`` before ``t_end`` and, in a
        recurrent layer, of its own spikes ``own_times`` ([n, K]), in one time order (at
        one time: feedforward first, then by source and slot)."""
        parts = [self._sent(pre_times, self.weight, self.delay, t_end, False)]
        if self.recurrent is not None and own_times is not None:
            parts.append(self._sent(own_times, *self.recurrent, t_end, True))
        times, weights, source, slot, recurrent = (
            torch.cat(p, dim=1) for p in zip(*parts, strict=True)
        )
        order = torch.argsort(times, dim=1, stable=True)
        pad = torch.full((self.n, 1), torch.inf, dtype=torch.float64)
        return Arrivals(
            torch.cat([times.gather(1, order), pad], dim=1),
            torch.cat([weights.gather(1, order), torch.zeros_like(pad)], dim=1),
            source.gather(1, order),
            slot.gather(1, order),
            recurrent.gather(1, order),
        )

    def _sent(
        self,
        pre_times: torch.Tensor,
        weight: torch.Tensor,
        delay: torch.Tensor,
        t_end: float,
        recurrent: bool,
    ) -> tuple[torch.Tensor, ...]:
        """The arrivals of ``pre_times`` through ``weight`` and ``delay``, unsorted
        [n, n_in·K]: times (+inf from ``t_end`` on), weights, source, slot, recurrent."""
        slots = pre_times.shape[1]
        times = (pre_times[None, :, :] + delay[:, :, None]).reshape(self.n, -1)
        times = torch.where(times < t_end, times, torch.inf)
        weights = weight[:, :, None].expand(-1, -1, slots).reshape(self.n, -1)
        index = torch.arange(times.shape[1]).expand(self.n, -1)
        flag = torch.full(index.shape, recurrent, dtype=torch.bool)
        return times, weights, index // slots, index % slots, flag

    def forward(self, pre_times: torch.Tensor, t_end: float, dt: float) -> list[list[Spike]]:
        queue = self.arrivals(pre_times, t_end)
        zero = torch.zeros(self.n, dtype=torch.float64)
        x = self.model.init(symbol_values(self.model, self.params), zero)
        t, ptr = zero.clone(), torch.zeros(self.n, dtype=torch.long)
        spikes: list[list[Spike]] = [[] for _ in range(self.n)]
        queued = 0  # the layer's spikes whose recurrent arrivals are in the queue
        for step in range(math.ceil(t_end / dt)):  # the last step cut at t_end
            end = torch.full_like(t, min((step + 1) * dt, t_end))
            count = sum(len(row) for row in spikes)
            if self.recurrent is not None and count > queued:
                now = step * dt
                queue, queued = self.requeued(ptr, now, pre_times, spikes, t_end), count
            while True:
                due = queue.times.gather(1, ptr[:, None])[:, 0]
                x, t = self.advance(x, t, torch.minimum(due, end), spikes)
                arriving = due < end
                if not bool(arriving.any()):
                    break
                w = queue.weights.gather(1, ptr[:, None])[:, 0]
                jumped = self.model.synapse(symbol_values(self.model, self.params, x=x, w=w), zero)
                self.arrive(arriving, ptr, x)
                x = [torch.where(arriving, a, b) for a, b in zip(jumped, x, strict=True)]
                ptr = ptr + arriving.long()
        return spikes

    def requeued(
        self,
        taken: torch.Tensor,
        now: float,
        pre_times: torch.Tensor,
        spikes: list[list[Spike]],
        t_end: float,
    ) -> Arrivals:
        """The arrivals with those of the layer's spikes so far, at the start of a step
        (``now``). The arrivals before it are each neuron's first ``taken``, applied
        already: no new one may join them, as none does when every recurrent delay is at
        least one step (no arrival of a spike falls in the spike's own step)."""
        new = self.arrivals(pre_times, t_end, padded_times(spikes))
        late = ((new.times < now).sum(1) != taken).nonzero()[:, 0].tolist()
        if late:
            raise RuntimeError(
                f"neurons {late}: a recurrent arrival fell inside the step of its spike; "
                "recurrent delays must be at least one step (dt)."
            )
        return new

    def arrive(self, arriving: torch.Tensor, index: torch.Tensor, x: list[torch.Tensor]) -> None:
        """Called at each arrival (``arriving`` neurons; ``index`` into the sorted
        arrivals; x just before it): a hook for :class:`~.event_rk4.RK4Layer`'s record."""

    def advance(
        self, x: list[torch.Tensor], t: torch.Tensor, to: torch.Tensor, spikes: list[list[Spike]]
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
                spikes[j].append(Spike(float(t[j] + s[j]), before))
            reset = self.model.reset(symbol_values(self.model, self.params, x=moved), t)
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
        return root_along_flow(self.flow, self.value, (fn, slope), x, (lo, hi), rising, active)


def layers_of(
    model: EventModel,
    shapes: list[list[str]],
    flat: Sequence[torch.Tensor],
    kind: type[Layer] = Layer,
    recurrent: Sequence[bool] = (),
) -> list[Layer]:
    """The layers of ``flat`` (per layer: weight, delay, the recurrent weight and delay
    where ``recurrent`` says so, then its params in the order ``shapes`` names them),
    detached, each a ``kind``."""
    out, i = [], 0
    for index, names in enumerate(shapes):
        weight, delay = flat[i].detach(), flat[i + 1].detach()
        i += 2
        loop = None
        if index < len(recurrent) and recurrent[index]:
            loop, i = (flat[i].detach(), flat[i + 1].detach()), i + 2
        params = {k: v.detach() for k, v in zip(names, flat[i : i + len(names)], strict=True)}
        out.append(kind(model, weight, delay, params, loop))
        i += len(names)
    return out
