"""EventProp's readouts in the compiled kernels: a readout layer's maximum or weighted mean
of V, and their adjoints.

A readout is a layer of the neuron run without its threshold and reset, fed a layer's
spike times; its output is a function of its V. These launch the readout kernels of a
neuron's :class:`~symneuron.runtime.events.EventKernels` (``sn_events_peak``,
``sn_events_mean`` and their backwards, :mod:`symneuron.codegen.events`) on a layer's
inputs (:class:`~symneuron.runtime.events.LayerInputs`), each (sample, readout neuron)
row in parallel, and return what the binding needs (:mod:`symneuron.binding_events`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch

from .events import EventKernels, Gradients, LayerInputs

__all__ = ["Peak", "peak", "peak_backward", "mean", "mean_backward"]


class Peak(NamedTuple):
    """A readout's maximum of V per (sample, neuron), each [B, N]: its ``value``, its time
    ``when``, and where it sits on an arrival, the arrival's source slot ``src`` (else −1)
    and V's ``rate`` just before it."""

    value: torch.Tensor
    when: torch.Tensor
    rate: torch.Tensor
    src: torch.Tensor


def _n_steps(values: Mapping[str, object]) -> int:
    steps = values["n_steps"]
    assert isinstance(steps, int)
    return steps


def _forward(
    kernels: EventKernels,
    name: str,
    inputs: LayerInputs,
    times: tuple[float, float],
    given: Mapping[str, torch.Tensor | float],
) -> None:
    """Launch readout kernel ``name`` with ``given`` (its outputs and extra values)."""
    inputs = kernels.laid_out(inputs)
    values = inputs.values(times)
    values.update({"k_out": 1, **given})
    slab = kernels.scratch(inputs, 0, _n_steps(values), False)["forward"]
    kernels.run(name, False, values, slab, inputs.pre)


def peak(kernels: EventKernels, inputs: LayerInputs, times: tuple[float, float]) -> Peak:
    """A readout layer's maximum of V over [0, ``times[0]``] (its neurons run without
    threshold and reset), per (sample, neuron)."""
    pre = inputs.pre
    shape = (pre.shape[0], inputs.n_out)
    found = Peak(
        pre.new_empty(shape),
        pre.new_empty(shape),
        pre.new_zeros(shape),
        torch.empty(shape, dtype=torch.int64, device=pre.device),
    )
    _forward(kernels, "peak", inputs, times, found._asdict())
    return found


def peak_backward(
    kernels: EventKernels,
    inputs: LayerInputs,
    times: tuple[float, float],
    found: Peak,
    grad_y: torch.Tensor,
    integrals: bool = False,
    wanted: tuple[bool, bool] = (True, True),
) -> Gradients:
    """A max readout's gradients given dL/dy of each maximum (``grad_y`` [B, N]), as
    :meth:`~symneuron.runtime.events.EventKernels.backward` returns a layer's."""
    inputs = kernels.laid_out(inputs)
    values = inputs.values(times)
    values.update(
        {
            "k_out": 0,
            "grad_y": grad_y.contiguous(),
            "when": found.when,
            "src": found.src,
            "rate": found.rate,
        }
    )
    return kernels.gradients("peak_backward", inputs, values, integrals, wanted)


def mean(
    kernels: EventKernels, inputs: LayerInputs, times: tuple[float, float], tau: float | None
) -> torch.Tensor:
    """A readout layer's mean of V, (1/t_end)∫κ(t)V dt over [0, ``times[0]``] with κ = 1
    (``tau`` None) or e^{−t/τ}, per (sample, neuron): [B, N]."""
    value = inputs.pre.new_empty((inputs.pre.shape[0], inputs.n_out))
    _forward(kernels, "mean", inputs, times, {"tau_weight": _weight(tau), "value": value})
    return value


def mean_backward(
    kernels: EventKernels,
    inputs: LayerInputs,
    times: tuple[float, float],
    tau: float | None,
    grad_y: torch.Tensor,
    integrals: bool = False,
    wanted: tuple[bool, bool] = (True, True),
) -> Gradients:
    """A mean readout's gradients given dL/dy (``grad_y`` [B, N]), the loss a continuous
    source in each row's adjoint, as a layer's backward returns them."""
    inputs = kernels.laid_out(inputs)
    values = inputs.values(times)
    values.update({"k_out": 0, "tau_weight": _weight(tau), "grad_y": grad_y.contiguous()})
    return kernels.gradients("mean_backward", inputs, values, integrals, wanted, pieces=True)


def _weight(tau: float | None) -> float:
    """The kernels' ``tau_weight``: τ of κ = e^{−t/τ}, 0 for κ = 1."""
    if tau is None:
        return 0.0
    if not (tau > 0 and tau < float("inf")):
        raise ValueError(f"tau_weight must be a positive finite time (or None), got {tau}.")
    return float(tau)
