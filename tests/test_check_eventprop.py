"""``sn.check(neuron, gradient="eventprop")`` (symneuron/check_events.py): passes on
correct models, refuses what EventProp cannot differentiate with the derivation's reason,
and fails when a derived expression is deliberately broken (monkeypatched here), for a
linear model (against central differences) and a nonlinear one (the convergence in dt
alone would not catch it: a wrong formula converges too, to the wrong gradient)."""

from __future__ import annotations

import dataclasses

import pytest
import sympy as sp

import symneuron as sn
from symneuron.derivation.events import EventPropError, EventSpec
from symneuron.reference import event_model
from tests.eventprop_models import qif
from tests.test_eventprop_reference import _lif


def _broken(monkeypatch: pytest.MonkeyPatch, change: dict[str, object]) -> None:
    """The reference's derivation returns specs with ``change`` applied (a fresh neuron
    name keeps the memoised models of the correct spec out of it)."""
    derive = event_model.derive_events

    def broken(*args: object, **kw: object) -> EventSpec:
        spec = derive(*args, **kw)  # type: ignore[arg-type]
        return dataclasses.replace(spec, **{k: f(spec) for k, f in change.items()})  # type: ignore[operator]

    monkeypatch.setattr(event_model, "derive_events", broken)


def test_a_linear_model_passes_against_central_differences() -> None:
    report = sn.check(_lif(), gradient="eventprop", seed=0)
    assert report.passed, str(report)
    names = [r.name for r in report.results]
    assert names[0].startswith("network fires")
    for label in ("t_in", "W[0]", "D[1]", "tau_m[0]", "theta[1]"):
        row = next(r for r in report.results if r.name.startswith(f"dL/d{label} vs central"))
        assert row.tolerance == 1e-6 and row.error < 1e-7
    text = str(report).splitlines()
    assert text[0].endswith("backend=eventprop reference, dtype=float64): PASS")
    assert all(line.startswith("  ok   ") for line in text[1:])


def test_a_broken_jump_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """λ_V's jump at a spike 2 % too large: the gradients through spikes fail."""
    _broken(
        monkeypatch,
        {"jump": lambda spec: sp.Matrix([spec.jump[0] * 1.02, *spec.jump[1:]])},
    )
    report = sn.check(_lif().replace(name="LIFbrokenjump"), gradient="eventprop", seed=0)
    assert not report.passed
    failed = {r.name.split(" vs ")[0] for r in report.failures()}
    assert {"dL/dW[0]", "dL/dt_in"} <= failed, str(report)


def test_a_broken_target_term_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Q without its λ_I part: delays and the earlier layer's gradients fail."""

    def without_lambda_i(spec: EventSpec) -> sp.Expr:
        return spec.target_term.xreplace({spec.adjoints[1]: 0})

    _broken(monkeypatch, {"target_term": without_lambda_i})
    report = sn.check(_lif().replace(name="LIFbrokenQ"), gradient="eventprop", seed=0)
    failed = {r.name.split(" vs ")[0] for r in report.failures()}
    assert {"dL/dD[1]", "dL/dW[0]"} <= failed, str(report)


def test_refused_models_raise_the_derivations_reason() -> None:
    with pytest.raises(EventPropError, match="not built from differential equations"):
        sn.check(sn.models.LIF(), gradient="eventprop")
    tau = sp.Symbol("tau", positive=True)
    direct = sn.Neuron.from_ode((sn.X - sn.V) / tau, dt=1.0, params={tau: 10.0})
    with pytest.raises(EventPropError, match="jumps the threshold function"):
        sn.check(direct, gradient="eventprop")


def test_a_recurrent_hidden_layer_passes_with_its_recurrent_gradients() -> None:
    """recurrent=True: the hidden neurons receive each other's spikes (delays of at least
    one step); the recurrent weights' and delays' gradients are checked too."""
    report = sn.check(_lif(), gradient="eventprop", seed=0, recurrent=True)
    assert report.passed, str(report)
    for label in ("Wrec[0]", "Drec[0]", "W[0]", "D[1]"):
        row = next(r for r in report.results if r.name.startswith(f"dL/d{label} vs central"))
        assert row.tolerance == 1e-6 and row.error < 1e-7, str(report)


@pytest.mark.slow
def test_a_broken_target_term_is_caught_in_the_recurrent_delays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Q without its λ_I part: the recurrent delays' gradient (their arrivals' Q) fails."""

    def without_lambda_i(spec: EventSpec) -> sp.Expr:
        return spec.target_term.xreplace({spec.adjoints[1]: 0})

    _broken(monkeypatch, {"target_term": without_lambda_i})
    neuron = _lif().replace(name="LIFbrokenQrec")
    report = sn.check(neuron, gradient="eventprop", seed=0, recurrent=True)
    failed = {r.name.split(" vs ")[0] for r in report.failures()}
    assert "dL/dDrec[0]" in failed, str(report)


def test_eventprop_refuses_the_surrogate_checks_arguments() -> None:
    with pytest.raises(ValueError, match="backend, points belong to the surrogate check"):
        sn.check(_lif(), gradient="eventprop", backend="cpu", points=3, recurrent=True)
    with pytest.raises(ValueError, match="gradient is one of"):
        sn.check(_lif(), gradient="adjoint")
    with pytest.raises(ValueError, match="T"):
        sn.check(_lif(), gradient="eventprop", T=0)


@pytest.mark.slow
def test_a_nonlinear_model_passes_with_its_convergence_order() -> None:
    report = sn.check(qif(0.5), gradient="eventprop", seed=0)
    assert report.passed, str(report)
    order = next(r for r in report.results if r.name.startswith("order of convergence"))
    assert order.error < 0.5, str(report)
    fd = [r for r in report.results if " vs central diff (dt=0.125)" in r.name]
    assert len(fd) >= 8 and all(r.tolerance == 1e-3 for r in fd)


@pytest.mark.slow
def test_a_broken_nonlinear_jump_is_caught_though_it_converges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same 2 % on λ_V's jump for the QIF: the gradient still converges at order
    about 4 (to the wrong limit), and the central differences fail it."""
    _broken(
        monkeypatch,
        {"jump": lambda spec: sp.Matrix([spec.jump[0] * 1.02, *spec.jump[1:]])},
    )
    report = sn.check(qif(0.5).replace(name="QIFbrokenjump"), gradient="eventprop", seed=0)
    assert not report.passed
    order = next(r for r in report.results if r.name.startswith("order of convergence"))
    assert order.passed, str(report)
    assert any("central diff" in r.name for r in report.failures()), str(report)
