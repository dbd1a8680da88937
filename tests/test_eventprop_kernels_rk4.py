"""The compiled EventProp kernels' RK4 path (nonlinear neurons: QIF, EIF, AdEx) on the CPU.

Oracle: the float64 reference's RK4 path (symneuron/reference/event_rk4.py, torch
functions of the same derived spec, checked there to converge at order 4), which the
float64 kernels follow step for step: same sub-steps, same crossing search on each
step's Hermite interpolant, same adjoint steps; the float64 kernels for the float32 ones.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import symneuron as sn
from symneuron.codegen.event_functions import event_functions
from symneuron.codegen.events import render_events
from symneuron.derivation.events import system_text
from symneuron.eventprop import EventLayer, event_network
from symneuron.reference.events import event_network as reference_network
from symneuron.runtime import events as runtime_events
from tests.eventprop_models import adex, eif, qif
from tests.test_eventprop_cuda import Run, _assert_close, _run
from tests.test_eventprop_kernels import LIF_PARAMS, _batch
from tests.test_eventprop_reference import F64, T_END, _lif

MODELS = {"QIF": qif, "EIF": eif, "AdEx": adex}


def nonlinear_batch(neuron: sn.Neuron, size: int = 2) -> tuple[list[torch.Tensor], tuple[str, ...]]:
    """The kernels tests' 5 → 8 → 3 batch (inputs, per layer W, D, ϑ, τ_m, τ_s) with ϑ at
    the neuron's default and every other param of the neuron given too (its default
    times 1 + U(0, 0.1) per neuron), and the params' names in that order."""
    flat = _batch(size=size)
    extra = tuple(n for n in neuron.events().params if n not in LIF_PARAMS)
    g = torch.Generator().manual_seed(5)
    out = [flat[0]]
    for i in range(1, len(flat), 2 + len(LIF_PARAMS)):
        weight, delay, _, tau_m, tau_s = flat[i : i + 5]
        n = weight.shape[0]
        out += [weight, delay, torch.full((n,), neuron.params["theta"], dtype=F64), tau_m, tau_s]
        out += [neuron.params[e] * (1 + 0.1 * torch.rand(n, generator=g, dtype=F64)) for e in extra]
    return out, LIF_PARAMS + extra


def _spikes(run: Run) -> int:
    return sum(int(torch.isfinite(t).sum()) for t in run[0])


@pytest.mark.parametrize("name", list(MODELS))
def test_nonlinear_kernels_agree_with_the_reference(name: str) -> None:
    """5 → 8 → 3, batch of 2, dt = 0.5: spike times within 1e-12 ms and the gradient of
    every tensor (input times; W, D and every param of both layers) within 1e-12 of its
    largest entry (measured: times 0 (QIF, EIF: bit for bit), 3.6e-14 ms (AdEx);
    gradients 3.2e-16, 9.0e-16, 6.1e-15)."""
    neuron = MODELS[name]()
    flat, names = nonlinear_batch(neuron)
    ours = _run(neuron, flat, names, "cpu")
    theirs = _run(neuron, flat, names, "cpu", network=reference_network)
    assert _spikes(theirs) >= 40
    _assert_close(ours, theirs, 1e-12)


def test_several_spikes_in_one_step() -> None:
    """QIF in steps of 5 ms: a hidden neuron spikes twice inside one step (each crossing
    cuts the RK4 step, the reset runs a new one over the rest); still the reference's
    (measured: times 0 ms, gradients 4.8e-16)."""
    neuron = qif(5.0)
    flat, names = nonlinear_batch(neuron)
    ours = _run(neuron, flat, names, "cpu")
    theirs = _run(neuron, flat, names, "cpu", network=reference_network)
    hidden = theirs[0][0]
    per_step = [((hidden >= s) & (hidden < s + 5.0)).sum(-1) for s in range(0, 30, 5)]
    assert max(int(c.max()) for c in per_step) >= 2
    _assert_close(ours, theirs, 1e-12)


@pytest.mark.parametrize("name", list(MODELS))
def test_float32_nonlinear_kernels_follow_the_float64_ones(name: str) -> None:
    """The linear float32 test's tolerance: the same spike counts, times within 1e-4 ms,
    each gradient within 1e-4 of its largest entry (measured at dt = 0.5: times 3.2e-5,
    2.7e-5, 3.6e-5 ms; gradients 3.0e-6, 6.0e-6, 1.0e-5)."""
    neuron = MODELS[name]()
    flat, names = nonlinear_batch(neuron)
    _assert_close(
        _run(neuron, flat, names, "cpu", torch.float32), _run(neuron, flat, names, "cpu"), 1e-4
    )


def test_a_crossing_that_comes_back_down_inside_a_step_is_found() -> None:
    """The reference's case (tests/test_eventprop_nonlinear.py): one input of w = 4.2 at
    t = 0.25 into the LIF, whose V peaks at 1.05 inside the step [5, 10] of dt = 5 and is
    below ϑ = 1 at both its ends. Run by the RK4 path (``integrator="rk4"``), the kernels
    find its one spike, at the reference's time, with the reference's gradients."""
    lif = _lif()
    assert lif.ode is not None
    system = dataclasses.replace(lif.ode, dt=5.0)
    weight = torch.full((1, 1), 4.2, dtype=F64)
    flat = [torch.tensor([[[0.25]]], dtype=F64), weight, torch.zeros(1, 1, dtype=F64)]
    runs = [
        _run(lif, flat, (), "cpu", network=network, system=system, integrator="rk4")
        for network in (event_network, reference_network)
    ]
    assert int(torch.isfinite(runs[1][0][0]).sum()) == 1 and 5 < float(runs[1][0][0][0, 0, 0]) < 10
    _assert_close(*runs, 1e-12)


def test_the_rk4_path_is_chosen_for_a_spec_without_a_closed_form_flow() -> None:
    """The dispatcher: a nonlinear spec gets the RK4 path (f and −Jᵀλ printed, no flow),
    a linear one the closed-form flow unless ``integrator="rk4"`` asks; ``"exact"`` for a
    nonlinear neuron is refused with the reason."""
    neuron, lif = qif(), _lif()
    source = render_events(neuron, neuron.events(), "float64")
    printed = source.functions.source
    assert "#define SN_RK4 1" in source.text
    assert "void sn_rhs(" in printed and "void sn_flow(" not in printed
    linear = render_events(lif, lif.events(), "float64")
    printed = linear.functions.source
    assert "#define SN_RK4 0" in linear.text
    assert "void sn_flow(" in printed and "void sn_rhs(" not in printed
    assert event_functions(lif, lif.events(), "double", rk4=True).rk4
    with pytest.raises(ValueError, match="nonlinear.*rk4=True"):
        event_functions(neuron, neuron.events(), "double", rk4=False)
    kernels = runtime_events.event_kernels(
        neuron, neuron.events(), system_text(neuron.ode), None, F64
    )
    assert kernels.rk4 and kernels.source(False).functions.rk4
    layer = EventLayer(torch.ones(1, 1, dtype=F64), torch.zeros(1, 1, dtype=F64))
    inputs = torch.ones(1, 1, 1, dtype=F64)
    with pytest.raises(ValueError, match="nonlinear.*integrator='rk4'"):
        event_network(neuron, [layer], inputs, t_end=T_END, integrator="exact")
    with pytest.raises(ValueError, match="integrator is one of"):
        event_network(lif, [layer], inputs, t_end=T_END, integrator="euler")


def test_a_replay_marked_in_the_kernels_is_raised_when_only_weights_are_learned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replay that spiked otherwise takes none of its neuron's gradient, so the mark is
    read whatever the layer learns: here its weights alone (no time-constant integrals),
    the kernels' dL/dθ marked as a mismatched replay marks it."""
    real = runtime_events.EventKernels.gradients

    def marked(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        grads = real(self, *args, **kwargs)
        grads.params.view(-1)[0] = float("nan")
        return grads

    monkeypatch.setattr(runtime_events.EventKernels, "gradients", marked)
    flat, names = nonlinear_batch(qif())
    weight = flat[1].clone().requires_grad_()
    layer = EventLayer(weight, flat[2], dict(zip(names, flat[3 : 3 + len(names)], strict=True)))
    (out,) = event_network(qif(), [layer], flat[0], t_end=T_END)
    with pytest.raises(RuntimeError, match="replay of a neuron spiked otherwise"):
        torch.where(torch.isfinite(out), out, 0.0).sum().backward()


def test_a_replay_that_spiked_otherwise_is_raised() -> None:
    """The kernels mark dL/dθ with NaN where a pair's replay spiked otherwise than its
    forward; the layer's backward raises instead of returning it."""
    from symneuron import binding_events

    binding_events._check_replay(torch.zeros(2, 3, dtype=torch.float64))  # finite: passes
    marked = torch.zeros(2, 3, dtype=torch.float64)
    marked[1, 2] = float("nan")
    with pytest.raises(RuntimeError, match="replay of a neuron spiked otherwise"):
        binding_events._check_replay(marked)
