"""Losses of the EventProp reference's spike times: the first-spike loss and the readouts.

:func:`first_spike_cross_entropy` is a loss of an :func:`~.events.event_network` layer's
spike times. Readouts (:func:`max_voltage`, :func:`mean_voltage`) are functions of a
layer's spike times too: a layer of the neuron run without its threshold, whose max or
weighted mean of V is the output, with the loss's kick (or continuous source) in the
adjoint (docs/eventprop.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..definition import Definition
from ..ode import ODESystem
from .event_adjoint import (
    GAUSS_NODES,
    GAUSS_WEIGHTS,
    Grads,
    Kick,
    NeuronAdjoint,
    Source,
    StateLoss,
)
from .event_forward import Arrivals, Layer, layers_of
from .event_model import EventModel, model_of, root_along_flow
from .events import EventLayer

__all__ = ["MaxVoltage", "first_spike_cross_entropy", "max_voltage", "mean_voltage"]


def first_spike_cross_entropy(
    times: torch.Tensor, label: int | torch.Tensor, tau0: float, t_end: float
) -> torch.Tensor:
    """−log p_label with p = softmax(−t/τ₀) over the outputs' first spike times (a silent
    output counts as ``t_end``, with no gradient): ∂L/∂t_j = (δ_j,label − p_j)/τ₀
    (Göltz et al. 2021; docs/eventprop.md). A batch, ``times`` [batch, n, K] and
    ``label`` [batch], gives the mean over the batch, as ``F.cross_entropy`` does."""
    # a silent output (+inf) at t_end; nan_to_num's gradient is 0 where it replaced
    first = torch.nan_to_num(times[..., 0], posinf=t_end)
    logits = first * (-1.0 / tau0)
    if times.dim() == 3:
        return torch.nn.functional.cross_entropy(logits, torch.as_tensor(label))
    return -torch.log_softmax(logits, dim=-1)[label]


class MaxVoltage(NamedTuple):
    """:func:`max_voltage`'s result, as ``torch.max``'s: each readout's maximum of V
    (differentiable) and the time it is reached (not)."""

    values: torch.Tensor
    times: torch.Tensor


def max_voltage(
    neuron: Definition,
    readout: EventLayer,
    input_times: torch.Tensor,
    *,
    t_end: float,
    system: ODESystem | None = None,
    target: str | None = None,
) -> MaxVoltage:
    """y_j = max over [0, t_end] of V_j of a readout layer of ``neuron`` fed the spikes
    ``input_times`` ([n_in, K], +inf padded: an :func:`~.events.event_network` layer's
    output), differentiable by EventProp in the readout's weights, delays and given params and in
    ``input_times``.

    A readout does not spike: this function runs ``neuron``'s dynamics and synapse only,
    never its threshold or reset (a LIF of the hidden layers serves as its own readout).
    The gradient kicks λ_V by ∂L/∂y_j at the maximum's time t*_j; where t*_j is an
    arrival t_a (V rising, then an inhibitory input), y moves with it:
    ∂L/∂t_a = ∂L/∂y_j·V̇⁻(t_a) joins that arrival's delay gradient and its source's
    spike time (docs/eventprop.md). Elsewhere V̇(t*) = 0 (or t* is 0 or ``t_end``).
    A batch, ``input_times`` [batch, n_in, K], gives [batch, n_out].

    Examples
    --------
    >>> import sympy as sp, torch, symneuron as sn
    >>> from symneuron.reference.events import EventLayer
    >>> from symneuron.reference.readouts import max_voltage
    >>> tau_m, tau_s, I = sp.symbols("tau_m tau_s I", positive=True)
    >>> lif = sn.Neuron.from_ode((-sn.V + I) / tau_m, dt=1.0, method="exact",
    ...     params={tau_m: 10.0, tau_s: 5.0}, states={I: sn.ODEState(-I / tau_s + sn.X)})
    >>> w = torch.tensor([[2.0], [1.0]], dtype=torch.float64, requires_grad=True)
    >>> y = max_voltage(lif, EventLayer(w, torch.zeros(2, 1, dtype=torch.float64)),
    ...     torch.tensor([[1.0]], dtype=torch.float64), t_end=30.0).values
    >>> torch.nn.functional.cross_entropy(y[None], torch.tensor([0])).backward()
    >>> bool(w.grad[0, 0] < 0 < w.grad[1, 0])
    True
    """
    if input_times.dim() == 3:
        rows = [
            max_voltage(neuron, readout, x, t_end=t_end, system=system, target=target)
            for x in input_times
        ]
        return MaxVoltage(*(torch.stack(part) for part in zip(*rows, strict=True)))
    _feedforward(readout)
    model, dt = model_of(neuron, system, target)
    names = sorted(readout.params)
    loss = _ReadoutLoss("max", None, t_end)
    flat = [readout.weight, readout.delay, *(readout.params[n] for n in names)]
    values, times = _Readout.apply(model, names, dt, loss, input_times, *flat)
    return MaxVoltage(values, times)


def mean_voltage(
    neuron: Definition,
    readout: EventLayer,
    input_times: torch.Tensor,
    *,
    t_end: float,
    tau_weight: float | None = None,
    system: ODESystem | None = None,
    target: str | None = None,
) -> torch.Tensor:
    """y_j = (1/T)∫₀ᵀ κ(t) V_j dt (T = ``t_end``; κ = 1, or e^{−t/τ} with ``tau_weight``)
    of a readout layer of ``neuron``, as :func:`max_voltage` runs it (no threshold, no
    reset), differentiable by EventProp: a continuous source −∂L/∂y_j·κ(t)/T in dλ_V/dt,
    no jump. Both integrals (the forward's and the adjoint's) are 8-point Gauss–Legendre
    on pieces of at most ``dt`` between arrivals, exact to rounding for dt ≤ τ.
    A batch, ``input_times`` [batch, n_in, K], gives [batch, n_out].

    >>> import sympy as sp, torch, symneuron as sn
    >>> from symneuron.reference.events import EventLayer
    >>> from symneuron.reference.readouts import mean_voltage
    >>> tau_m, tau_s, I = sp.symbols("tau_m tau_s I", positive=True)
    >>> lif = sn.Neuron.from_ode((-sn.V + I) / tau_m, dt=1.0, method="exact",
    ...     params={tau_m: 10.0, tau_s: 5.0}, states={I: sn.ODEState(-I / tau_s + sn.X)})
    >>> w = torch.ones(1, 1, dtype=torch.float64)
    >>> y = mean_voltage(lif, EventLayer(w, torch.zeros(1, 1, dtype=torch.float64)),
    ...     torch.tensor([[0.0]], dtype=torch.float64), t_end=1000.0)
    >>> round(float(y) * 1000.0, 6)  # ∫V dt = ∫I dt = w·τ_s over all time
    5.0
    """
    if input_times.dim() == 3:
        return torch.stack(
            [
                mean_voltage(
                    neuron,
                    readout,
                    x,
                    t_end=t_end,
                    tau_weight=tau_weight,
                    system=system,
                    target=target,
                )
                for x in input_times
            ]
        )
    _feedforward(readout)
    model, dt = model_of(neuron, system, target)
    names = sorted(readout.params)
    loss = _ReadoutLoss("mean", tau_weight, t_end)
    flat = [readout.weight, readout.delay, *(readout.params[n] for n in names)]
    values, _ = _Readout.apply(model, names, dt, loss, input_times, *flat)
    return values


def _feedforward(readout: EventLayer) -> None:
    """A readout does not spike, so it has no recurrent connections to send through."""
    if readout.recurrent_weight is not None or readout.recurrent_delay is not None:
        raise ValueError(
            "A readout layer does not spike: it takes no recurrent_weight or recurrent_delay."
        )


class _ReadoutLoss(NamedTuple):
    kind: str  # "max" or "mean"
    tau_weight: float | None
    t_end: float


class _Peak(NamedTuple):
    """A readout's maximum: V there, its time, and the arrival it sits on (or None)."""

    value: torch.Tensor
    time: float
    arrival: int | None


class _Read:
    """One readout neuron's run: its events, states at them, and the loss's value."""

    def __init__(self, layer: Layer, j: int, dt: float, arrivals: Arrivals, t_end: float):
        if layer.model.parts != 1:
            raise NotImplementedError(
                "Readouts locate V's maxima for two states (V̇ has at most one zero between "
                f"arrivals); {layer.model.definition.name} has {len(layer.model.spec.states)}."
            )
        self.neuron = NeuronAdjoint(layer, j, dt)
        self.row = Arrivals(*(part[j] for part in arrivals))
        self.events = self.neuron.events(self.row, [])
        self.before, self.after = self.neuron.replay(self.events, self.row, [])
        self.starts = [0.0, *(e[0] for e in self.events)]
        self.ends = [*self.starts[1:], t_end]

    def value(self, fn: Callable[..., list[torch.Tensor]], at: torch.Tensor) -> torch.Tensor:
        return fn(self.neuron.env(x=at), at[0])[0]

    def peak(self) -> _Peak:
        """max V over the pieces between arrivals: their starts, the end, and each
        piece's interior maximum (V̇ from + to −, at most one zero for two states)."""
        model, flow = self.neuron.model, self.neuron.flow
        x0 = torch.stack(self.after, dim=1)
        lengths = torch.tensor(self.ends, dtype=torch.float64) - torch.tensor(self.starts)
        rate_0 = self.value(model.voltage_rate, x0)
        rate_end = self.value(model.voltage_rate, flow(x0, lengths))
        turns = (rate_0 > 0) & (rate_end < 0) & (lengths > 0)
        fns = (model.voltage_rate, model.voltage_slope)
        zero = torch.zeros_like(lengths)
        s = root_along_flow(flow, self.value, fns, x0, (zero, lengths), turns & False, turns)
        inner = torch.where(turns, self.value(model.voltage, flow(x0, s)), -torch.inf)
        last = self.value(model.voltage, flow(x0[:, -1:], lengths[-1:]))
        candidates = torch.cat([self.value(model.voltage, x0), inner, last])
        best, q = int(torch.argmax(candidates)), len(self.starts)
        if best < q:
            arrival = self.events[best - 1][2] if best > 0 else None
            return _Peak(candidates[best], self.starts[best], arrival)
        if best < 2 * q:
            return _Peak(candidates[best], self.starts[best - q] + float(s[best - q]), None)
        return _Peak(candidates[best], self.ends[-1], None)

    def mean(self, weight: Callable[[torch.Tensor], torch.Tensor], t_end: float) -> torch.Tensor:
        """(1/T)∫κ(t)V dt by Gauss–Legendre on pieces of at most dt."""
        total = torch.zeros((), dtype=torch.float64)
        for x, start, end in zip(self.after, self.starts, self.ends, strict=True):
            cuts = self.neuron.pieces(start, end)
            for a, b in zip(cuts[:-1], cuts[1:], strict=True):
                nodes = torch.tensor(0.5 * (b - a) * (GAUSS_NODES + 1), dtype=torch.float64)
                at = self.neuron.flow(x[:, None].expand(-1, nodes.numel()), nodes)
                kappa = weight(a + nodes)
                total = (
                    total + (0.5 * (b - a) * torch.as_tensor(GAUSS_WEIGHTS) * kappa * at[0]).sum()
                )
                x = self.neuron.flow(x, torch.tensor(b - a, dtype=torch.float64))
        return total / t_end


def _weighting(tau: float | None) -> Callable[[torch.Tensor], torch.Tensor]:
    if tau is None:
        return torch.ones_like
    return lambda t: torch.exp(-t / tau)


def _peak_time_term(read: _Read, peak: _Peak, grad_y: torch.Tensor) -> torch.Tensor:
    """∂L/∂t_a = ∂L/∂y·V̇⁻(t_a) of a maximum on an arrival (0 elsewhere)."""
    if peak.arrival is None:
        return torch.zeros((), dtype=torch.float64)
    index = [e[2] for e in read.events].index(peak.arrival)
    return grad_y * read.value(read.neuron.model.voltage_rate, read.before[index][:, None])[0]


class _Readout(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        model: EventModel,
        names: list[str],
        dt: float,
        loss: _ReadoutLoss,
        input_times: torch.Tensor,
        *flat: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        (layer,) = layers_of(model, [names], flat)
        arrivals = layer.arrivals(input_times.detach(), loss.t_end)
        reads = [_Read(layer, j, dt, arrivals, loss.t_end) for j in range(layer.n)]
        if loss.kind == "max":
            peaks = [read.peak() for read in reads]
            values = torch.stack([p.value for p in peaks])
            times = torch.tensor([p.time for p in peaks], dtype=torch.float64)
        else:
            weight = _weighting(loss.tau_weight)
            peaks = []
            values = torch.stack([read.mean(weight, loss.t_end) for read in reads])
            times = torch.full_like(values, torch.nan)
        ctx.saved = (model, names, loss, layer, arrivals, reads, peaks, input_times.detach())
        ctx.mark_non_differentiable(times)
        return values, times

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor, _: torch.Tensor) -> tuple[Any, ...]:
        model, names, loss, layer, arrivals, reads, peaks, input_times = ctx.saved
        grads = Grads(
            torch.zeros_like(layer.weight),
            torch.zeros_like(layer.delay),
            {n: torch.zeros(layer.n, dtype=torch.float64) for n in model.names},
            torch.zeros_like(input_times),
        )
        e_v = torch.zeros(len(model.spec.states), dtype=torch.float64)
        e_v[0] = 1.0
        none = torch.zeros(0, dtype=torch.float64)
        for j, read in enumerate(reads):
            c = grad_y[j]
            if loss.kind == "max":
                state_loss = StateLoss(kicks=[Kick(peaks[j].time, c * e_v)])
            else:
                weight = _weighting(loss.tau_weight)
                source = _source(e_v, c / loss.t_end, weight)
                state_loss = StateLoss(source=source)
            read.neuron.backward(read.row, [], none, loss.t_end, grads, state_loss)
            if loss.kind == "max" and peaks[j].arrival is not None:
                term = _peak_time_term(read, peaks[j], c)
                a = peaks[j].arrival
                i, k = int(read.row.source[a]), int(read.row.slot[a])
                grads.delay[j, i] += term
                grads.source_b[i, k] -= term
        grad_input = torch.where(torch.isfinite(input_times), -grads.source_b, 0.0)
        return (
            None,
            None,
            None,
            None,
            grad_input,
            grads.weight,
            grads.delay,
            *(grads.params[n] for n in names),
        )


def _source(
    direction: torch.Tensor, scale: torch.Tensor, weight: Callable[[torch.Tensor], torch.Tensor]
) -> Source:
    return lambda taus: direction[:, None] * (scale * weight(taus))[None, :]
