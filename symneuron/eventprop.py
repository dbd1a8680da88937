"""Exact event-based gradients (EventProp) for batches, with compiled C or CUDA kernels.

:func:`event_network` runs a feedforward network of one ODE neuron (each layer
recurrent or not: a recurrent layer's neurons of a sample run in step,
:mod:`symneuron.runtime.event_recurrent`) on a batch of input spike times and is
differentiable by EventProp: exactly for a linear neuron (a LIF with
a current synapse, a linear adaptive threshold...: any neuron whose
:class:`~symneuron.derivation.events.EventSpec` has a closed-form flow), by RK4 steps
with crossings on each step's Hermite interpolant for a nonlinear one (QIF, EIF, AdEx;
spike times and gradients accurate to O(dt⁴)). It is the float64 reference's function
(:func:`symneuron.reference.events.event_network`) with the batch run in parallel by
generated kernels (:mod:`symneuron.codegen.events`: C on the CPU, CUDA on a GPU, as the
inputs are), in float32 or float64; the reference is its oracle (docs/eventprop.md).
The readouts :func:`max_voltage` and :func:`mean_voltage` are the reference's
(:mod:`symneuron.reference.readouts`) likewise, for a linear neuron of two states.

Representation: spike times as tensors padded with +inf ([batch, n, K], K the most
spikes of any neuron in the batch), as the reference returns them. A loss is then
ordinary torch code on times (the first spike is ``times[..., 0]``), spike counts are
the finite entries, and nothing overflows: the kernels count past the slots they were
given and run again with enough. A per-step representation with a fixed number of
slots would cap the spikes per step and need an error on overflow, for no gain on the
CPU, where a neuron's events are a list anyway.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Sequence

import numpy as np
import torch

from .binding_events import EventLayerFunction, LayerCall, MeanFunction, PeakFunction
from .definition import Definition
from .derivation.events import derive_events, system_text
from .ode import ODESystem
from .reference.events import EventLayer, GrazingSpikeWarning, recurrent_layers, uses_rk4
from .reference.readouts import MaxVoltage, first_spike_cross_entropy
from .runtime.events import EventKernels, Run, event_kernels, settle, slots_key

__all__ = [
    "EventLayer",
    "GrazingSpikeWarning",
    "MaxVoltage",
    "event_network",
    "first_spike_cross_entropy",
    "max_voltage",
    "mean_voltage",
]


def _checked(layers: Sequence[EventLayer], input_times: torch.Tensor, t_end: float) -> _Delays:
    """Feedforward layers, shapes that chain, finite non-negative delays (the input times
    ≥ 0 or +inf are checked after the forward, with the layers' outcomes); returns what
    is known of the layers' delays (:class:`_Delays`)."""
    if not (math.isfinite(t_end) and t_end > 0):
        raise ValueError(f"t_end must be a positive finite time, got {t_end}.")
    n_in = input_times.shape[-2]
    for index, layer in enumerate(layers):
        _check_shapes(index, layer, n_in, input_times.device)
        n_in = layer.weight.shape[0]
    return _Delays(layers)


#: what is known of each delay tensor at one version of it (by id, while it lives: a
#: weak reference to it, its version, one value along every row), so a training loop's
#: unchanged delays need no read-back before the forward
_DELAYS: dict[int, tuple[weakref.ref[torch.Tensor], int, bool]] = {}


class _Delays:
    """Each layer's delays: finite and ≥ 0 (else an error), and whether they hold one
    value along every row (``uniform``: the layer's arrivals then come in its samples'
    spike order, :func:`~symneuron.runtime.events.arrival_order`). A delay tensor seen
    before at its current version is taken as it was then, and checked again after the
    forward, its rows' least and greatest delay read back with the layers' outcomes (a
    change that kept its version, through ``.data``, then runs the network again); the
    others are read back now, in one host sync."""

    def __init__(self, layers: Sequence[EventLayer]) -> None:
        self.delays = [layer.delay for layer in layers]
        #: each row's least and greatest delay, on the device (None: no delays)
        self.ranges = [torch.aminmax(d, dim=1) if d.numel() else None for d in self.delays]
        self.uniform = [_remembered(d) for d in self.delays]
        #: the layers taken as they were: checked after the forward
        self.later = [i for i, known in enumerate(self.uniform) if known is not None]
        missing = [i for i, known in enumerate(self.uniform) if known is None]
        if missing:  # (no read-back, no host sync, where every delay is remembered)
            self._learn(missing, self._flat(missing).cpu().numpy())

    def _flat(self, layers: list[int]) -> torch.Tensor:
        parts = [t for i in layers for t in self.ranges[i] or ()]
        if parts:  # (cast after the cat: one launch, where a cast of each took one each)
            return torch.cat(parts).detach().to(torch.float64)
        # none: an empty tensor where the others are, for the one read-back with them
        device = self.delays[0].device if self.delays else None
        return torch.zeros(0, dtype=torch.float64, device=device)

    def to_check(self) -> torch.Tensor:
        """The rows' least and greatest delay of the layers taken as they were."""
        return self._flat(self.later)

    def _learn(self, layers: list[int], values: np.ndarray) -> bool:
        """Each of ``layers``' facts from its rows' least and greatest delay in ``values``
        (an error where one is negative or not finite), remembered; whether every
        uniform flag stayed as it was."""
        start, same = 0, True
        for i in layers:
            rows = self.delays[i].shape[0] if self.ranges[i] is not None else 0
            low, high = values[start : start + rows], values[start + rows : start + 2 * rows]
            start += 2 * rows
            if not (np.all(low >= 0) and np.all(high < np.inf)):  # NaN fails too
                raise ValueError(f"layer {i}: delays must be finite and ≥ 0.")
            uniform = bool(np.array_equal(low, high))
            same = same and self.uniform[i] in (None, uniform)
            self.uniform[i] = uniform
            _remember(self.delays[i], uniform)
        return same

    def held(self, values: np.ndarray) -> bool:
        """Whether the layers taken as they were still are (their checks' ``values``,
        :meth:`to_check`); where not, their facts are learned anew (an error where a
        delay is negative or not finite)."""
        return self._learn(self.later, values)


def _version(tensor: torch.Tensor) -> int | None:
    """``tensor``'s version counter (bumped by every in-place change), None where it
    keeps none (an inference tensor)."""
    try:
        return int(tensor._version)
    except RuntimeError:
        return None


def _remembered(delay: torch.Tensor) -> bool | None:
    """Whether ``delay`` holds one value along every row, as remembered at its current
    version; None where it was not seen at it."""
    entry = _DELAYS.get(id(delay))
    if entry is None or entry[0]() is not delay or entry[1] != _version(delay):
        return None
    return entry[2]


def _remember(delay: torch.Tensor, uniform: bool) -> None:
    version = _version(delay)
    if version is not None:
        key = id(delay)
        _DELAYS[key] = (weakref.ref(delay, functools.partial(_forget, key)), version, uniform)


def _forget(key: int, _ref: object) -> None:
    """A delay tensor is gone: what was known of it goes too."""
    _DELAYS.pop(key, None)


def _check_shapes(index: int, layer: EventLayer, n_in: int, device: torch.device) -> None:
    """A layer whose shapes chain from ``n_in`` inputs, on ``device``."""
    if layer.weight.dim() != 2 or layer.weight.shape[1] != n_in:
        raise ValueError(
            f"layer {index}: weight of shape {tuple(layer.weight.shape)}, expected "
            f"[n_out, {n_in}] (n_in: the previous layer's neurons)."
        )
    if layer.delay.shape != layer.weight.shape:
        raise ValueError(f"layer {index}: delay and weight shapes differ.")
    loop = [t for t in (layer.recurrent_weight, layer.recurrent_delay) if t is not None]
    others = {t.device for t in (layer.weight, layer.delay, *loop, *layer.params.values())}
    if others != {device}:
        raise ValueError(
            f"layer {index}: its tensors are on {sorted(map(str, others))}, the input "
            f"times on {device}; the kernels run where the inputs are."
        )


def event_network(
    neuron: Definition,
    layers: Sequence[EventLayer],
    input_times: torch.Tensor,
    *,
    t_end: float,
    system: ODESystem | None = None,
    target: str | None = None,
    grazing: float = 1e-3,
    capacity: int = 4,
    integrator: str | None = None,
) -> tuple[torch.Tensor, ...]:
    """Each layer's spike times [batch, n_l, K_l] (+inf padded, ascending) of a
    feedforward network of ``neuron`` (an ODE neuron, :meth:`~symneuron.Neuron.from_ode`;
    a layer may be recurrent, :class:`EventLayer`: its recurrent delays at least dt)
    run up to ``t_end`` in steps of its ``dt``, differentiable by EventProp in each
    layer's weights, delays and given params and in ``input_times`` ([batch, n_in, K],
    +inf padded; [n_in, K] for one sample, which gives [n_l, K_l]).

    The dtype is the input times' (float32 or float64); the layers' tensors are cast to
    it. The device is the input times' too (the layers' tensors must be on it): every
    (sample, neuron) pair of a layer runs in parallel, in a compiled C kernel (OpenMP)
    for CPU tensors, in a CUDA kernel (one thread per pair) for CUDA tensors.
    ``system`` defaults to ``neuron.ode``; ``target`` names the state spikes jump
    (default: through X). ``capacity``: the spike slots a neuron gets in a layer's
    first run (more only cost a second run). A spike with ġ⁻ < ``grazing`` is reported
    by a :class:`GrazingSpikeWarning` and its gradient kept exact, never clipped
    (``grazing=-inf``: none looked for, which saves a host sync per layer).

    ``integrator`` is how a layer moves between events, as in the reference:
    ``"exact"``, the closed-form flow of a linear model (its default: exact spike times
    and gradient), or ``"rk4"``, RK4 steps with crossings on each step's cubic Hermite
    interpolant and the adjoint integrated back by RK4 (the default for a nonlinear
    model; the float64 kernels follow the reference's RK4 path step for step).

    Examples
    --------
    >>> import sympy as sp, torch, symneuron as sn
    >>> from symneuron.eventprop import EventLayer, event_network
    >>> tau_m, tau_s, I = sp.symbols("tau_m tau_s I", positive=True)
    >>> lif = sn.Neuron.from_ode((-sn.V + I) / tau_m, dt=1.0, method="exact",
    ...     params={tau_m: 10.0, tau_s: 5.0}, states={I: sn.ODEState(-I / tau_s + sn.X)})
    >>> w = torch.full((1, 1), 5.0, dtype=torch.float64, requires_grad=True)
    >>> layer = EventLayer(w, torch.zeros(1, 1, dtype=torch.float64))
    >>> inputs = torch.tensor([[[1.0]], [[2.0]]], dtype=torch.float64)  # two samples
    >>> (out,) = event_network(lif, [layer], inputs, t_end=20.0)
    >>> out.shape
    torch.Size([2, 1, 1])
    >>> out.sum().backward()  # more weight, earlier spikes
    >>> bool(w.grad < 0)
    True
    """
    single = input_times.dim() == 2
    times = input_times[None] if single else input_times
    if times.dim() != 3:
        raise ValueError(f"input_times must be [batch, n_in, K] or [n_in, K], got {times.shape}.")
    delays = _checked(layers, times, t_end)
    kernels, names, dt = _kernels_for(neuron, layers, times, system, target, integrator)
    recurrent_layers(layers, dt)  # (an error where a recurrent delay is under a step)
    steps = (float(t_end), dt)
    while True:  # again only where a layer had too few slots, or its delays changed
        calls = [
            LayerCall(kernels, steps, named, capacity, grazing, index, bool(uniform))
            for index, (named, uniform) in enumerate(zip(names, delays.uniform, strict=True))
        ]
        outputs, runs = _layers_once(calls, layers, times)
        # the input times and remembered delays are checked here, with the outcomes
        earliest = times.amin().reshape(1) if times.numel() else times.new_zeros(1)
        mosts, (low, checks) = settle(kernels, runs, [earliest, delays.to_check()])
        if not low[0] >= 0:  # NaN fails too
            raise ValueError("Input spike times must be ≥ 0 (+inf for an empty slot), not NaN.")
        if delays.held(checks) and all(most is not None for most in mosts):
            break
    trimmed = [_trim(out, most) for out, most in zip(outputs, mosts, strict=True)]
    return tuple(out[0] if single else out for out in trimmed)


def max_voltage(
    neuron: Definition,
    readout: EventLayer,
    input_times: torch.Tensor,
    *,
    t_end: float,
    system: ODESystem | None = None,
    target: str | None = None,
) -> MaxVoltage:
    """y_j = max over [0, t_end] of V_j of a readout layer of ``neuron`` fed the spike
    times ``input_times`` ([batch, n_in, K], +inf padded: an :func:`event_network`
    layer's output; [n_in, K] for one sample), differentiable by EventProp in the
    readout's weights, delays and given params and in ``input_times``: values and their
    times, each [batch, n_out] ([n_out] for one sample).

    The compiled kernels' form of :func:`symneuron.reference.readouts.max_voltage` (its
    oracle; the same maximum and gradient): every (sample, readout neuron) pair in
    parallel, in C on the CPU and in CUDA on a GPU, in the input times' dtype (float32 or
    float64). The readout runs ``neuron``'s dynamics and synapse only, never its
    threshold or reset. The gradient kicks λ_V by ∂L/∂y_j at the maximum's time; where
    the maximum sits on an arrival (V rising into an inhibitory input), y moves with that
    arrival's time, and ∂L/∂y_j·V̇⁻ joins its delay's gradient and its source's spike
    time. For a linear neuron of two states (a LIF with a current synapse), whose V̇ has
    at most one zero between arrivals.

    Examples
    --------
    >>> import sympy as sp, torch, symneuron as sn
    >>> from symneuron.eventprop import EventLayer, max_voltage
    >>> tau_m, tau_s, I = sp.symbols("tau_m tau_s I", positive=True)
    >>> lif = sn.Neuron.from_ode((-sn.V + I) / tau_m, dt=1.0, method="exact",
    ...     params={tau_m: 10.0, tau_s: 5.0}, states={I: sn.ODEState(-I / tau_s + sn.X)})
    >>> w = torch.tensor([[2.0], [1.0]], dtype=torch.float64, requires_grad=True)
    >>> readout = EventLayer(w, torch.zeros(2, 1, dtype=torch.float64))
    >>> inputs = torch.tensor([[[1.0]], [[3.0]]], dtype=torch.float64)  # two samples
    >>> y = max_voltage(lif, readout, inputs, t_end=30.0).values
    >>> y.shape
    torch.Size([2, 2])
    >>> torch.nn.functional.cross_entropy(y, torch.tensor([0, 0])).backward()
    >>> bool(w.grad[0, 0] < 0 < w.grad[1, 0])  # label 0: readout 0 up, readout 1 down
    True
    """
    values, when = _readout(PeakFunction, neuron, readout, input_times, t_end, system, target)
    return MaxVoltage(values, when)


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
    reset), differentiable by EventProp: [batch, n_out] ([n_out] for one sample).

    The compiled kernels' form of :func:`symneuron.reference.readouts.mean_voltage` (its
    oracle): the loss is a continuous source −∂L/∂y_j·κ(t)/T in dλ_V/dt, no jump; the
    forward's and the adjoint's integrals are 8-point Gauss–Legendre on pieces of at most
    ``dt`` between arrivals, as the reference takes them. For a linear neuron of two
    states, as :func:`max_voltage`.

    >>> import sympy as sp, torch, symneuron as sn
    >>> from symneuron.eventprop import EventLayer, mean_voltage
    >>> tau_m, tau_s, I = sp.symbols("tau_m tau_s I", positive=True)
    >>> lif = sn.Neuron.from_ode((-sn.V + I) / tau_m, dt=1.0, method="exact",
    ...     params={tau_m: 10.0, tau_s: 5.0}, states={I: sn.ODEState(-I / tau_s + sn.X)})
    >>> w = torch.ones(1, 1, dtype=torch.float64)
    >>> y = mean_voltage(lif, EventLayer(w, torch.zeros(1, 1, dtype=torch.float64)),
    ...     torch.tensor([[0.0]], dtype=torch.float64), t_end=1000.0)
    >>> round(float(y) * 1000.0, 6)  # ∫V dt = ∫I dt = w·τ_s over all time
    5.0
    """
    args = (neuron, readout, input_times, t_end, system, target, tau_weight)
    (values,) = _readout(MeanFunction, *args)
    return values


def _readout(
    function: type[torch.autograd.Function],
    neuron: Definition,
    readout: EventLayer,
    input_times: torch.Tensor,
    t_end: float,
    system: ODESystem | None,
    target: str | None,
    tau_weight: float | None = None,
) -> tuple[torch.Tensor, ...]:
    """A readout layer's outputs by ``function`` (an autograd function of the call, the
    input times, weight, delay and given params; ``tau_weight`` goes in the call), each
    [batch, n_out] or [n_out]: the layer and inputs checked, the delays' remembered facts
    and the input times checked after the kernels ran (in one read-back)."""
    single = input_times.dim() == 2
    times = input_times[None] if single else input_times
    if times.dim() != 3:
        raise ValueError(f"input_times must be [batch, n_in, K] or [n_in, K], got {times.shape}.")
    if readout.recurrent_weight is not None or readout.recurrent_delay is not None:
        raise ValueError(
            "A readout layer does not spike: it takes no recurrent_weight or recurrent_delay."
        )
    delays = _checked([readout], times, t_end)
    kernels, (names,), dt = _kernels_for(neuron, [readout], times, system, target, None)
    if kernels.rk4 or len(kernels.spec.states) != 2:
        kind = "nonlinear" if kernels.rk4 else f"of {len(kernels.spec.states)} states"
        raise NotImplementedError(
            f"Readouts take a linear neuron of two states (V's maximum between two arrivals "
            f"is where V̇ turns, once at most); {neuron.name} is {kind}, and the reference "
            "refuses it too. Read such a layer out by its spikes: an event_network layer "
            "and first_spike_cross_entropy."
        )
    while True:  # again only where the delays changed through .data since last seen
        uniform = bool(delays.uniform[0])
        steps = (float(t_end), dt)
        call = LayerCall(kernels, steps, names, 1, -math.inf, 0, uniform, tau_weight)
        cast = [t.to(times.dtype) for t in (readout.weight, readout.delay)]
        given = [readout.params[n].to(times.dtype) for n in names]
        outputs = function.apply(call, times, *cast, *given)
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else outputs
        earliest = times.amin().reshape(1) if times.numel() else times.new_zeros(1)
        _, (low, checks) = settle(kernels, [], [earliest, delays.to_check()])
        if not low[0] >= 0:  # NaN fails too
            raise ValueError("Input spike times must be ≥ 0 (+inf for an empty slot), not NaN.")
        if delays.held(checks):
            break
    return tuple(out[0] for out in outputs) if single else tuple(outputs)


def _kernels_for(
    neuron: Definition,
    layers: Sequence[EventLayer],
    times: torch.Tensor,
    system: ODESystem | None,
    target: str | None,
    integrator: str | None,
) -> tuple[EventKernels, list[tuple[str, ...]], float]:
    """The kernels of ``neuron``'s derived spec for ``times``' dtype and device, each
    layer's given params' names (sorted; an error naming any the spec lacks) and dt."""
    system = system if system is not None else getattr(neuron, "ode", None)
    spec = derive_events(neuron, system, target=target)
    assert system is not None  # derive_events refuses a neuron without one
    rk4 = uses_rk4(spec, neuron.name, integrator)
    text = system_text(system)
    kernels = event_kernels(neuron, spec, text, target, times.dtype, times.device, rk4)
    names = [tuple(sorted(layer.params)) for layer in layers]
    for index, named in enumerate(names):
        unknown = set(named) - set(spec.params)
        if unknown:
            raise ValueError(f"layer {index}: unknown params {sorted(unknown)}.")
    return kernels, names, system.dt


def _layers_once(
    calls: list[LayerCall], layers: Sequence[EventLayer], times: torch.Tensor
) -> tuple[list[torch.Tensor], list[Run]]:
    """Each layer's untrimmed spike times, one after another with no host sync, and what
    :func:`~symneuron.runtime.events.settle` reads of each run."""
    outputs: list[torch.Tensor] = []
    runs: list[Run] = []
    for call, layer in zip(calls, layers, strict=True):
        cast = [t.to(times.dtype) for t in (layer.weight, layer.delay)]
        loop = [
            None if t is None else t.to(times.dtype)
            for t in (layer.recurrent_weight, layer.recurrent_delay)
        ]
        given = [layer.params[n].to(times.dtype) for n in call.names]
        previous = outputs[-1] if outputs else times
        out, outcome = EventLayerFunction.apply(call, previous, *cast, *loop, *given)
        runs.append((slots_key(previous.shape, out.shape[1]), out.shape[2], outcome))
        outputs.append(out)
    return outputs, runs


def _trim(times: torch.Tensor, most: int | None) -> torch.Tensor:
    """A layer's spike times with max(1, ``most``) slots (the most of any neuron)."""
    keep = max(1, most or 0)
    return times[:, :, :keep].contiguous() if keep < times.shape[2] else times
