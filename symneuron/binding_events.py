"""EventProp's compiled kernels bound to torch autograd, one layer per function.

:class:`EventLayerFunction` maps a layer's input spike times [B, n_in, K_in], its
weights and delays [N, n_in] and its given params ([N] each) to its spike times
[B, N, K] (+inf padded) with the compiled forward (:mod:`symneuron.runtime.events`),
and its backward runs the compiled adjoint. Layers compose through autograd: the
gradient a layer receives for its spike times is dL/dt_k with every later layer's
share in it (−Σ Q of their arrivals), so its spikes' couplings are B = −dL/dt_k, and
the gradient it returns for its input times is −Σ Q of their arrivals (0 where a slot
is empty).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import torch

from .reference.events import GrazingSpikeWarning
from .runtime.events import EventKernels, LayerInputs, Spikes, arrival_order

__all__ = ["LayerCall", "EventLayerFunction", "report_grazing"]


class LayerCall(NamedTuple):
    """What a layer's function needs besides its tensors: the kernels, (t_end, dt), the
    names of the params given (in the order they follow the delays), the first run's
    spike slots, the grazing tolerance, the layer's index ``layer`` (for reports) and
    whether its delays hold one value along every row (``uniform``: its arrivals then
    come in its samples' spike order)."""

    kernels: EventKernels
    times: tuple[float, float]
    names: tuple[str, ...]
    capacity: int
    grazing: float
    layer: int
    uniform: bool


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


class EventLayerFunction(torch.autograd.Function):
    """One feedforward layer's spike times, differentiable by EventProp, untrimmed, with
    its rows' outcome (counts and statuses) unread: the network reads every layer's at
    once (:func:`~symneuron.runtime.events.settle`) and runs again where a neuron had
    too few slots."""

    @staticmethod
    def forward(
        ctx: Any,
        call: LayerCall,
        pre: torch.Tensor,
        weight: torch.Tensor,
        delay: torch.Tensor,
        *given: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = weight.shape[0]
        tensors = [t.detach().contiguous() for t in (pre, weight, delay)]
        params = call.kernels.params(dict(zip(call.names, given, strict=True)), n, tensors[1])
        order, ordered = arrival_order(tensors[0], call.uniform)
        inputs = LayerInputs(tensors[0], tensors[1], tensors[2], params, order, ordered)
        inputs = call.kernels.laid_out(inputs)  # once, for both passes
        spikes = call.kernels.forward(inputs, call.times, call.capacity, check=False)
        report_grazing(spikes, call.grazing, call.layer)
        ctx.call, ctx.inputs, ctx.spikes = call, inputs, spikes
        ctx.shapes = [p.shape for p in given]
        ctx.mark_non_differentiable(spikes.outcome)
        return spikes.times, spikes.outcome

    @staticmethod
    def backward(ctx: Any, grad_times: torch.Tensor, _outcome: Any) -> tuple[Any, ...]:
        call: LayerCall = ctx.call
        kernels = call.kernels
        wanted = ctx.needs_input_grad[4:]
        integrals = any(
            need and not kernels.spec.rhs_partials[name].is_zero_matrix
            for name, need in zip(call.names, wanted, strict=True)
        )
        pre = ctx.inputs.pre
        need_pre, need_delay = ctx.needs_input_grad[1], ctx.needs_input_grad[3]
        grads = kernels.backward(
            ctx.inputs,
            call.times,
            ctx.spikes,
            grad_times.to(pre.dtype),
            integrals,
            (need_delay, need_pre),
        )
        if kernels.rk4 and integrals:
            _check_replay(grads.params)
        # −Σ Q per input spike (0 for an empty slot or one past t_end: no arrival adds to it)
        grad_pre = None if grads.source_b is None else grads.source_b.neg_()
        given = [
            grads.params[kernels.names.index(name)].sum_to_size(shape) if need else None
            for name, need, shape in zip(call.names, wanted, ctx.shapes, strict=True)
        ]
        return (None, grad_pre, grads.weight, grads.delay, *given)


def _check_replay(grad_params: torch.Tensor) -> None:
    """The RK4 backward replays each (sample, neuron)'s forward; a replay that spiked
    otherwise than the forward (possible only where the GPU compiler contracted the two
    kernels' arithmetic differently at a spike that grazes the threshold) marks dL/dθ
    with NaN, which is raised here rather than returned."""
    if not bool(torch.isfinite(grad_params).all()):
        raise RuntimeError(
            "symneuron: the RK4 EventProp backward's replay of a neuron spiked otherwise "
            "than its forward (a spike that grazes the threshold), so its dL/dθ would not "
            "be the forward's gradient. Run the layer in float64, on the CPU, or with a "
            "smaller dt; or leave the time constants out of the learned parameters. (A "
            "non-finite gradient of the spike times from the loss shows the same way.)"
        )
