"""What a user prints is the model's mathematics, not the integrator's stages (issue 34
item 9): ``neuron.charge``, each state's shown update, ``derivatives()``, ``symneuron
show`` and its LaTeX, for every neuron built with ``method="exp_euler"``.

Oracle: the stages the kernels evaluate, substituted into the step
(``inline_stages``), evaluated at random points; the partials against SymPy's
derivative of that expansion.
"""

from __future__ import annotations

import random
import re
from typing import Any

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


def _value(expr: sp.Expr, point: dict[sp.Symbol, float], digits: int = 30) -> float:
    """``expr`` at ``point``, evaluated in ``digits`` digits: the point's values put in as
    Floats of that precision, then ``evalf`` (``evalf(subs=point)`` substitutes into every
    Piecewise again, seconds per call on the conductance models)."""
    return float(expr.xreplace({z: sp.Float(v, digits) for z, v in point.items()}).evalf(digits))


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
    pairs = [(neuron.charge, neuron.inline_stages(neuron.step_charge))]
    pairs += [
        (neuron.view(st.update), neuron.inline_stages(st.update)) for st in neuron.states.values()
    ]
    for shown, _ in pairs:
        assert not {s.name for s in shown.free_symbols} & _stage_names(neuron)
    for seed in range(3):
        point = _point(neuron, seed)
        for shown, inlined in pairs:
            got, want = _value(shown, point), _value(inlined, point)
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("name", CASES)
def test_derivatives_are_partials_of_the_mathematics(name: str) -> None:
    neuron = sn.models.ZOO[name]()
    found = neuron.derivatives()
    assert all(key.startswith("dH/d") or "~/d" in key for key in found)
    staged = neuron.inline_stages(neuron.step_charge)
    point = _point(neuron, 7)
    for z in [sn.V, sn.X, *neuron.state_symbols.values()]:
        want = _value(sp.diff(staged, z), point)
        got = _value(found[f"dH/d{z}"], point)
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


# -- every method: a LIF with a current synapse (two states, V and I) ------------------

TAU_M, TAU_S = sp.Symbol("tau_m", positive=True), sp.Symbol("tau_s", positive=True)


def _synapse_lif(method: str) -> sn.Neuron:
    current = sp.Symbol("I", real=True)
    return sn.Neuron.from_ode(
        (current - sn.V) / TAU_M,
        dt=0.5,
        method=method,
        states={"I": sn.ODEState(ode=(sn.X - current) / TAU_S)},
        params={TAU_M: 4.0, TAU_S: 2.0},
        learnable=[TAU_M, TAU_S],
    )


def _staged_value(neuron: sn.Neuron, expr: sp.Expr, point: dict[sp.Symbol, Any]) -> sp.Float:
    """``expr`` as the kernels evaluate it: each stage a number in turn, then ``expr``
    (40 digits)."""
    values: dict[sp.Symbol, sp.Expr] = {z: sp.Float(v, 40) for z, v in point.items()}
    for symbol, stage in neuron.stages:
        values[symbol] = stage.evalf(40, subs=values)
    return expr.evalf(40, subs=values)


def _printed(neuron: sn.Neuron) -> str:
    """Every view a user prints: charge, updates, partials, repr, show and its LaTeX."""
    views = [neuron.charge, *(neuron.view(st.update) for st in neuron.states.values())]
    parts = [str(v) for v in views] + [repr(neuron)]
    parts += [f"{k} = {v}" for k, v in neuron.derivatives().items()]
    parts += [sp.latex(v) for v in views]
    parts += [f"{a} = {b}" for latex in (False, True) for a, b in describe(neuron, latex=latex)]
    return "\n".join(parts)


def _has_stage(neuron: sn.Neuron, text: str) -> list[str]:
    names = {n for s in _stage_names(neuron) for n in (s, sp.latex(sp.Symbol(s)))}
    return [n for n in names if re.search(rf"(?<![\w\\{{]){re.escape(n)}(?![\w}}])", text)]


@pytest.mark.parametrize("method", sn.ode.METHODS)
def test_no_view_shows_a_stage(method: str) -> None:
    neuron = _synapse_lif(method)
    assert method == "euler" or neuron.stages  # the kernels keep them
    assert not _has_stage(neuron, _printed(neuron))


@pytest.mark.parametrize("method", sn.ode.METHODS)
def test_views_equal_the_staged_step(method: str) -> None:
    neuron = _synapse_lif(method)
    pairs = [(neuron.charge, neuron.step_charge)]
    pairs += [(neuron.view(st.update), st.update) for st in neuron.states.values()]
    for seed in range(3):
        point = _point(neuron, seed)
        for shown, staged in pairs:
            want = float(_staged_value(neuron, staged, point))
            assert float(shown.evalf(40, subs=point)) == pytest.approx(want, rel=1e-12, abs=1e-14)


@pytest.mark.parametrize("method", sn.ode.METHODS)
def test_derivatives_are_partials_of_the_staged_step(method: str) -> None:
    """Each shown partial against a central difference of the staged step (40 digits)."""
    neuron = _synapse_lif(method)
    found = neuron.derivatives()
    state = neuron.state_symbols["I"]
    outputs = {"H": neuron.step_charge, "I~": neuron.states["I"].update}
    point = {z: sp.Float(v, 40) for z, v in _point(neuron, 11).items()}
    step = sp.Float("1e-15", 40)
    for out, staged in outputs.items():
        for z in [sn.V, sn.X, state, *neuron.symbols.values()]:
            up, down = {**point, z: point[z] + step}, {**point, z: point[z] - step}
            rise = _staged_value(neuron, staged, up) - _staged_value(neuron, staged, down)
            fd = float(rise / (2 * step))
            got = found.get(f"d{out}/d{z}")
            got_value = 0.0 if got is None else float(got.evalf(40, subs=point))
            assert got_value == pytest.approx(fd, rel=1e-7, abs=1e-9), (out, z)


def test_a_step_too_large_to_substitute_shows_its_right_hand_sides() -> None:
    """Morris–Lecar's rk4 step substituted is past VIEW_NODES: the view writes dV/dt and
    dw/dt as f_V(V, w, X) and f_w(V, w, X); with them put back it is the staged step."""
    neuron = sn.models.MorrisLecar()
    assert sn.ode.expanded_size(neuron.stages, neuron.step_charge) > sn.neuron.VIEW_NODES
    assert not _has_stage(neuron, _printed(neuron))
    point = _point(neuron, 3)
    w = neuron.state_symbols["w"]
    rhs = {"f_V": neuron.ode.dv, "f_w": neuron.ode.states["w"].ode}
    params = {z: v for z, v in point.items() if z not in (sn.V, w, sn.X)}
    functions = {name: sp.lambdify((sn.V, w, sn.X), f.subs(params)) for name, f in rhs.items()}
    shown = sp.lambdify((sn.V, w, sn.X), neuron.charge, [functions, "math"])
    want = float(_staged_value(neuron, neuron.step_charge, point))
    assert shown(point[sn.V], point[w], point[sn.X]) == pytest.approx(want, rel=1e-12)
    step_row = dict(describe(neuron))["step"]
    assert "f_V = dV/dt" in step_row and "f_w = dw/dt" in step_row
