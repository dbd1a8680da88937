"""EventProp's compiled kernels bound to torch autograd, one layer per function.

:class:`EventLayerFunction` maps a layer's input spike times [B, n_in, K_in], its
weights and delays [N, n_in] and its given params ([N] each) to its spike times
[B, N, K] (+inf padded) with the compiled forward (:mod:`symneuron.runtime.events`),
and its backward runs the compiled adjoint. Layers compose through autograd: the
gradient a layer receives for its spike times is dL/dt_k with every later layer's
share in it (−Σ Q of their arrivals), so its spikes' couplings are B = −dL/dt_k, and
the gradient it returns for its input times is −Σ Q of their arrivals (0 where a slot
is empty). :class:`PeakFunction` is a readout layer's maximum of V, by the same kernels'
readout pair.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import torch

from .reference.events import GrazingSpikeWarning
from .runtime import event_readouts, event_recurrent
from .runtime.events import EventKernels, Gradients, LayerInputs, Spikes, arrival_order

__all__ = ["LayerCall", "EventLayerFunction", "MeanFunction", "PeakFunction", "report_grazing"]


class LayerCall(NamedTuple):
    """What a layer's function needs besides its tensors: the kernels, (t_end, dt), the
    names of the params given (in the order they follow the delays), the first run's
    spike slots, the grazing tolerance, the layer's index ``layer`` (for reports),
    whether its delays hold one value along every row (``uniform``: its arrivals then
    come in its samples' spike order) and, for a mean readout, τ of its weighting
    e^{−t/τ} (``tau_weight``; None: κ = 1)."""

    kernels: EventKernels
    times: tuple[float, float]
    names: tuple[str, ...]
    capacity: int
    grazing: float
    layer: int
    uniform: bool
    tau_weight: float | None = None


def report_grazing(spikes: Spikes, tolerance: float, index: int) -> None:
    """A :class:`~symneuron.reference.events.GrazingSpikeWarning` for each spike at which
    g rises slower than ``tolerance`` (ġ⁻ < tolerance): its gradient scales with 1/ġ⁻
    and is kept, never clipped. ``tolerance`` = −inf looks at none (no host sync)."""
    if tolerance == -math.inf:
        return
    finite = torch.isfinite(spikes.times)
    slow = finite & (spikes.rate < tolerance)
    for b, j, k in slow.nonzero().tolist():
        time, rate = float(spikes.times[b, j, k]), float(spikes.rate[b, j, k])
        warnings.warn(
            GrazingSpikeWarning(
                f"layer {index}, sample {b}, neuron {j}: a spike at t = {time!r} grazes the "
                f"threshold, ġ⁻ = {rate:.3g} < {tolerance:g}; its gradient scales with "
                "1/ġ⁻ and is not clipped."
            ),
            stacklevel=3,
        )


def _inputs(
    ctx: Any,
    call: LayerCall,
    pre: torch.Tensor,
    weight: torch.Tensor,
    delay: torch.Tensor,
    given: tuple[torch.Tensor, ...],
    given_at: int = 4,
) -> LayerInputs:
    """A layer's kernel inputs, laid out as its kernels read them (once, for both
    passes): every param (the given ones, the rest at their defaults) and its samples'
    arrival order where its delays are uniform; kept on ``ctx`` with the call, the
    given params' shapes and where they start among the function's inputs
    (``given_at``), what every backward here reads."""
    tensors = [t.detach().contiguous() for t in (pre, weight, delay)]
    n = weight.shape[0]
    params = call.kernels.params(dict(zip(call.names, given, strict=True)), n, tensors[1])
    order, ordered = arrival_order(tensors[0], call.uniform)
    inputs = LayerInputs(tensors[0], tensors[1], tensors[2], params, order, ordered)
    ctx.call, ctx.inputs = call, call.kernels.laid_out(inputs)
    ctx.shapes, ctx.given_at = [p.shape for p in given], given_at
    return ctx.inputs


class EventLayerFunction(torch.autograd.Function):
    """One layer's spike times, differentiable by EventProp, untrimmed, with its rows'
    outcome (counts and statuses) unread: the network reads every layer's at once
    (:func:`~symneuron.runtime.events.settle`) and runs again where a neuron had too few
    slots. A recurrent layer has its ``rec_weight`` and ``rec_delay`` [N, N] (target,
    source; None for a feedforward one) and runs the recurrent kernels
    (:mod:`symneuron.runtime.event_recurrent`)."""

    @staticmethod
    def forward(
        ctx: Any,
        call: LayerCall,
        pre: torch.Tensor,
        weight: torch.Tensor,
        delay: torch.Tensor,
        rec_weight: torch.Tensor | None,
        rec_delay: torch.Tensor | None,
        *given: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = _inputs(ctx, call, pre, weight, delay, given, given_at=6)
        ctx.loop = None
        if rec_weight is None or rec_delay is None:
            spikes = call.kernels.forward(inputs, call.times, call.capacity, check=False)
        else:
            loop = event_recurrent.Loop(
                rec_weight.detach().contiguous(), rec_delay.detach().contiguous()
            )
            ctx.loop = loop.laid_out(call.kernels)
            spikes = event_recurrent.loop_forward(
                call.kernels, inputs, ctx.loop, call.times, call.capacity
            )
        report_grazing(spikes, call.grazing, call.layer)
        ctx.spikes = spikes
        ctx.mark_non_differentiable(spikes.outcome)
        ctx.set_materialize_grads(False)  # (no zeros launched for the outcome's gradient)
        return spikes.times, spikes.outcome

    @staticmethod
    def backward(ctx: Any, grad_times: torch.Tensor | None, _outcome: None) -> tuple[Any, ...]:
        call: LayerCall = ctx.call
        integrals = _integrals(ctx)
        # (the times are the one differentiable output: a backward run has their gradient)
        assert grad_times is not None
        grad_times = grad_times.to(ctx.inputs.pre.dtype)
        if ctx.loop is None:
            grads = call.kernels.backward(
                ctx.inputs, call.times, ctx.spikes, grad_times, integrals, _sums(ctx)
            )
        else:
            wanted = (*_sums(ctx), ctx.needs_input_grad[5])
            grads = event_recurrent.loop_backward(
                call.kernels,
                ctx.inputs,
                ctx.loop,
                call.times,
                ctx.spikes,
                grad_times,
                integrals,
                wanted,
            )
        if call.kernels.rk4:  # (a host sync: the RK4 path's only, whatever is learned)
            _check_replay(grads.params)
        return _returned(ctx, grads)


# A function's inputs are (call, pre, weight, delay, *given params): what its backward
# is asked for, read off ``ctx.needs_input_grad``.


def _integrals(ctx: Any) -> bool:
    """Whether a given param whose gradient is wanted has ∂f/∂θ ≠ 0 (its gradient then
    needs ∫λ·∂f/∂θ dt)."""
    call: LayerCall = ctx.call
    return any(
        need and not call.kernels.spec.rhs_partials[name].is_zero_matrix
        for name, need in zip(call.names, ctx.needs_input_grad[ctx.given_at :], strict=True)
    )


def _sums(ctx: Any) -> tuple[bool, bool]:
    """Whether the delays' gradient and Σ Q per input spike are wanted."""
    return ctx.needs_input_grad[3], ctx.needs_input_grad[1]


def _returned(ctx: Any, grads: Gradients) -> tuple[Any, ...]:
    """The backward's return: −Σ Q per input spike (0 for an empty slot or one past t_end:
    no arrival adds to it), dL/dW, dL/dD, a layer's dL/dW_rec and dL/dD_rec (None for a
    feedforward one), and each wanted given param's gradient summed to its shape."""
    call: LayerCall = ctx.call
    grad_pre = None if grads.source_b is None else grads.source_b.neg_()
    needs = ctx.needs_input_grad[ctx.given_at :]
    given = [
        grads.params[call.kernels.names.index(name)].sum_to_size(shape) if need else None
        for name, need, shape in zip(call.names, needs, ctx.shapes, strict=True)
    ]
    loop = [] if ctx.given_at == 4 else list(grads.recurrent or (None, None))
    return (None, grad_pre, grads.weight, grads.delay, *loop, *given)


class PeakFunction(torch.autograd.Function):
    """A readout layer's maximum of V over [0, t_end] per (sample, neuron), and its time
    (not differentiable), from input spike times, weights, delays and given params as
    :class:`EventLayerFunction` takes them; its backward runs the adjoint from each
    maximum back with λ_V = dL/dy there."""

    @staticmethod
    def forward(
        ctx: Any,
        call: LayerCall,
        pre: torch.Tensor,
        weight: torch.Tensor,
        delay: torch.Tensor,
        *given: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = _inputs(ctx, call, pre, weight, delay, given)
        peak = event_readouts.peak(call.kernels, inputs, call.times)
        ctx.peak = peak
        ctx.mark_non_differentiable(peak.when)
        return peak.value, peak.when

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor, _when: Any) -> tuple[Any, ...]:
        call: LayerCall = ctx.call
        grad_y = grad_y.to(ctx.inputs.pre.dtype)
        grads = event_readouts.peak_backward(
            call.kernels, ctx.inputs, call.times, ctx.peak, grad_y, _integrals(ctx), _sums(ctx)
        )
        return _returned(ctx, grads)


class MeanFunction(torch.autograd.Function):
    """A readout layer's mean of V, (1/t_end)∫κ(t)V dt with κ = 1 or e^{−t/τ} (τ the
    call's ``tau_weight``), per (sample, neuron), from the inputs
    :class:`EventLayerFunction` takes; its backward runs each row's adjoint with the loss
    as a continuous source."""

    @staticmethod
    def forward(
        ctx: Any,
        call: LayerCall,
        pre: torch.Tensor,
        weight: torch.Tensor,
        delay: torch.Tensor,
        *given: torch.Tensor,
    ) -> torch.Tensor:
        inputs = _inputs(ctx, call, pre, weight, delay, given)
        return event_readouts.mean(call.kernels, inputs, call.times, call.tau_weight)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[Any, ...]:
        call: LayerCall = ctx.call
        grad_y = grad_y.to(ctx.inputs.pre.dtype)
        grads = event_readouts.mean_backward(
            call.kernels,
            ctx.inputs,
            call.times,
            call.tau_weight,
            grad_y,
            _integrals(ctx),
            _sums(ctx),
        )
        return _returned(ctx, grads)


def _check_replay(grad_params: torch.Tensor) -> None:
    """The RK4 backward replays each (sample, neuron)'s forward; a replay that spiked
    otherwise than the forward (possible only where the GPU compiler contracted the two
    kernels' arithmetic differently at a spike that grazes the threshold) takes none of
    that neuron's gradient and marks dL/dθ with NaN, which is raised here whatever the
    layer learns (its weights' gradient would lack the neuron's share)."""
    if not bool(torch.isfinite(grad_params).all()):
        raise RuntimeError(
            "symneuron: the RK4 EventProp backward's replay of a neuron spiked otherwise "
            "than its forward (a spike that grazes the threshold), so the layer's gradient "
            "would not be the forward's. Run the layer in float64, on the CPU, or with a "
            "smaller dt. (A non-finite gradient of the spike times from the loss shows the "
            "same way.)"
        )
