"""What a user prints is the model's mathematics, not the integrator's stages (issue 34
item 9): ``neuron.charge``, each state's shown update, ``derivatives()``, ``symneuron
show`` and its LaTeX, for every neuron built with ``method="exp_euler"``.

Oracle: the stages the kernels evaluate, substituted into the step
(``inline_stages``), evaluated at random points; the partials against SymPy's
derivative of that expansion.
"""

from __future__ import annotations

import random

import pytest
import sympy as sp

import symneuron as sn
from symneuron.cli import describe

EXP_EULER = sorted(
    name
    for name, make in sn.models.ZOO.items()
    if getattr(make(), "ode", None) is not None and make().ode.method == "exp_euler"
)


#: the conductance models, whose views take seconds to expand: in the slow set
_HEAVY = {"HodgkinHuxley", "Pospischil2008"}
CASES = [
    pytest.param(name, marks=pytest.mark.slow) if name in _HEAVY else name for name in EXP_EULER
]


def _stage_names(neuron: sn.Neuron) -> set[str]:
    return {s.name for s, _ in neuron.stages}


def _point(neuron: sn.Neuron, seed: int) -> dict[sp.Symbol, float]:
    """V, X, the states and the params at random values near the defaults."""
    draw = random.Random(seed)
    point = {sn.V: draw.uniform(-1.0, 1.0), sn.X: draw.uniform(-1.0, 1.0)}
    point |= {s: draw.uniform(0.1, 0.9) for s in neuron.state_symbols.values()}
    point |= {neuron.symbols[n]: v * draw.uniform(0.9, 1.1) for n, v in neuron.params.items()}
    return point


def test_readme_exp_euler_charge() -> None:
    tau = sp.Symbol("tau")
    lif = sn.Neuron.from_ode(
        (sn.X - sn.V) / tau, dt=1.0, method="exp_euler", params={tau: 2.0}, learnable=[tau]
    )
    assert str(lif.charge) == "X + (V - X)*exp(-1.0/tau)"
    assert set(lif.derivatives()) == {"dH/dV", "dH/dX", "dH/dtau"}
    assert lif.step_charge.free_symbols & set(dict(lif.stages))  # the kernels keep them


def test_exp_euler_zoo_is_not_empty() -> None:
    assert {"HodgkinHuxley", "IafCondExp", "IafPscExp", "ResonateAndFire"} <= set(EXP_EULER)


@pytest.mark.parametrize("name", CASES)
def test_views_are_the_staged_step(name: str) -> None:
    neuron = sn.models.ZOO[name]()
    pairs = [(neuron.charge, neuron.step_charge)]
    pairs += [(neuron.view(st.update), st.update) for st in neuron.states.values()]
    for seed in range(3):
        point = _point(neuron, seed)
        for shown, staged in pairs:
            assert not {s.name for s in shown.free_symbols} & _stage_names(neuron)
            want = float(neuron.inline_stages(staged).evalf(30, subs=point))
            got = float(shown.evalf(30, subs=point))
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("name", CASES)
def test_derivatives_are_partials_of_the_mathematics(name: str) -> None:
    neuron = sn.models.ZOO[name]()
    found = neuron.derivatives()
    assert all(key.startswith("dH/d") or "~/d" in key for key in found)
    staged = neuron.inline_stages(neuron.step_charge)
    point = _point(neuron, 7)
    for z in [sn.V, sn.X, *neuron.state_symbols.values()]:
        want = float(sp.diff(staged, z).evalf(30, subs=point))
        got = float(found[f"dH/d{z}"].evalf(30, subs=point))
        assert got == pytest.approx(want, rel=1e-7, abs=1e-9), z


@pytest.mark.parametrize("latex", [False, True], ids=["text", "latex"])
@pytest.mark.parametrize("name", CASES)
def test_show_has_no_stage_symbols(name: str, latex: bool) -> None:
    neuron = sn.models.ZOO[name]()
    text = "\n".join(f"{a} = {b}" for a, b in describe(neuron, latex=latex))
    for stage in _stage_names(neuron):
        shown = sp.latex(sp.Symbol(stage)) if latex else stage
        assert shown not in text, stage


def test_escape_firing_without_reset_level_is_soft() -> None:
    neuron = sn.models.EscapeLIF(v_reset=None)
    assert neuron.soft_reset
    assert "soft" in repr(neuron) and "hard(" not in repr(neuron)
