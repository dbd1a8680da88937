"""A recurrent layer's EventProp kernels: its forward and backward with the layer's own
spikes arriving at its neurons through recurrent weights and delays (each at least one
step).

The kernels (``sn_events_loop_forward`` and ``_backward``, :mod:`symneuron.codegen.events`'
``"recurrent"`` source) run a sample's neurons in step, a step of dt at a time: in CUDA a
block a sample, in C a thread a sample. They take a feedforward layer's inputs
(:class:`~.events.LayerInputs`) and :class:`Loop`, and return what a feedforward layer's
kernels return (:class:`~.events.Spikes`, :class:`~.events.Gradients` with its
``recurrent`` gradients). Slots work as a feedforward layer's: the
forward counts past the slots it had and the caller runs it again with more
(:func:`~.events.settle`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..codegen.events import loop_bytes
from . import events
from .events import EventKernels, Gradients, LayerInputs, SampleLaunch, Spikes, Values

__all__ = ["Loop", "loop_forward", "loop_backward"]


class Loop(NamedTuple):
    """A recurrent layer's ``weight`` and ``delay`` [N, N] (target, source), contiguous in
    the layer's dtype on its device; ``transposed``: [source, target] copies instead (as
    the CUDA kernels read them, :meth:`laid_out`)."""

    weight: torch.Tensor
    delay: torch.Tensor
    transposed: bool = False

    def laid_out(self, kernels: EventKernels) -> Loop:
        """The loop as ``kernels`` read it (their feedforward weights' layout)."""
        if not kernels.transpose or self.transposed:
            return self
        return Loop(self.weight.t().contiguous(), self.delay.t().contiguous(), True)


def _values(
    kernels: EventKernels,
    inputs: LayerInputs,
    loop: Loop,
    times: tuple[float, float],
    k_out: int,
    direction: str,
    integrals: bool = False,
    loop_slots: int = 0,
    queue_slots: int = 0,
) -> tuple[Values, int]:
    """The launch values of a pass, with its scratch's layout
    (:func:`~symneuron.codegen.events.loop_bytes`), and a sample's bytes."""
    n, (_, n_in, k_in) = inputs.n_out, inputs.pre.shape
    if n * max(1, k_out) >= 1 << 31:
        raise ValueError(f"{n} neurons × {k_out} spike slots: too many for the kernels' indices.")
    values = inputs.values(times)
    source = kernels.source(integrals, "recurrent")
    steps = int(values["n_steps"] or 0)
    sorting = inputs.order is None
    sizes = loop_bytes(
        source, kernels.dtype, n, n_in * k_in, k_out, steps, sorting, loop_slots, queue_slots
    )[direction]
    slab = sizes.pop("slab_bytes")
    values.update(sizes)
    values.update({"k_out": k_out, "rec_weight": loop.weight, "rec_delay": loop.delay})
    return values, slab


def loop_forward(
    kernels: EventKernels,
    inputs: LayerInputs,
    loop: Loop,
    times: tuple[float, float],
    capacity: int = 4,
) -> Spikes:
    """The layer's spikes up to ``times[0]`` in steps of ``times[1]``, untrimmed, their
    outcome unread (:meth:`~.events.EventKernels.forward` with ``check`` False)."""
    inputs, loop = kernels.laid_out(inputs), loop.laid_out(kernels)
    batch, n = inputs.pre.shape[0], inputs.n_out
    shape = kernels.shape_of(inputs)
    slots = max(1, capacity, kernels.slots.get(shape, 0))
    queue = kernels.queues.get(shape, events.QUEUE_SLOTS)
    values, slab = _values(kernels, inputs, loop, times, slots, "forward", queue_slots=queue)
    outcome = torch.empty((2, batch, n), dtype=torch.int64, device=inputs.pre.device)
    values["counts"], values["status"] = outcome[0], outcome[1]
    values["times"] = inputs.pre.new_empty((batch, n, slots))
    values["store"] = inputs.pre.new_empty((batch, n, slots, kernels.store))
    values["rate"] = inputs.pre.new_empty((batch, n, slots))
    kernels.run("loop_forward", False, values, slab, inputs.pre, samples=True)
    times_, store, rate = (values[k] for k in ("times", "store", "rate"))
    assert isinstance(times_, torch.Tensor) and isinstance(store, torch.Tensor)
    assert isinstance(rate, torch.Tensor)
    return Spikes(times_, store, rate, outcome[0], outcome)


def loop_backward(
    kernels: EventKernels,
    inputs: LayerInputs,
    loop: Loop,
    times: tuple[float, float],
    spikes: Spikes,
    grad_times: torch.Tensor,
    integrals: bool = False,
    wanted: tuple[bool, bool, bool] = (True, True, True),
) -> Gradients:
    """The layer's gradients given dL/dt_k of each of its spikes (``grad_times``
    [B, N, K]); ``wanted``: whether the delays', Σ Q per input spike and the recurrent
    delays' gradients are (each None where not)."""
    inputs, loop = kernels.laid_out(inputs), loop.laid_out(kernels)
    k_out = spikes.times.shape[2]
    # the most spikes with a slot in a sample: room for every recurrent arrival at a row
    most = int(spikes.counts.clamp(max=k_out).sum(1).amax()) if spikes.counts.numel() else 0
    values, slab = _values(kernels, inputs, loop, times, k_out, "backward", integrals, most)
    values.update(
        {
            "times": spikes.times,
            "store": spikes.store,
            "counts": spikes.counts,
            "grad_t": grad_times.contiguous(),
        }
    )
    launch = SampleLaunch(slab, wanted[2])
    return kernels.gradients("loop_backward", inputs, values, integrals, wanted[:2], samples=launch)
