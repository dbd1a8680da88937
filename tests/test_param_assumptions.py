"""Parameter values must not contradict their symbol's SymPy assumptions (issue 25, item 3).

SymPy simplifies with the assumptions as the expression is built (``sin(pi*k)`` is 0 for
an integer k, ``sqrt(tau**2)`` is tau for a positive tau), so a value that contradicts
them would run a model other than the one written. Oracle: the assumptions' definitions.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
import torch

import symneuron as sn
from symneuron.assumptions import check_assumption
from symneuron.validate import finite_float

V, X = sn.V, sn.X


def test_an_integer_symbol_with_a_fractional_value_is_refused() -> None:
    """The issue's case: sin(pi*k) has already been dropped."""
    k = sp.Symbol("k", integer=True)
    with pytest.raises(ValueError, match=r"Parameter 'k' is declared integer.*0\.5"):
        sn.Neuron(V / 2 + X + sp.sin(sp.pi * k) * V, params={k: 0.5})
    assert sn.Neuron(V / 2 + X + sp.sin(sp.pi * k) * V, params={k: 2.0}).params["k"] == 2.0


@pytest.mark.parametrize("key", ["symbol", "name"])
def test_a_positive_symbol_with_a_negative_default_is_refused(key: str) -> None:
    """sqrt(tau**2) became tau: with tau = -2 the model would not be the one written. The
    assumption is read from the expression even when params names the parameter by str."""
    tau = sp.Symbol("tau", positive=True)
    charge = V + (X - V) / sp.sqrt(tau**2)
    params = {tau if key == "symbol" else "tau": -2.0}
    with pytest.raises(ValueError, match=r"'tau' is declared positive.*-2\.0.*real=True"):
        sn.Neuron(charge, params=params)


def test_the_assumptions_are_kept_per_parameter() -> None:
    k, a = sp.Symbol("k", integer=True, nonnegative=True), sp.Symbol("a", real=True)
    neuron = sn.Neuron(V + a * X + k * V / 10, params={k: 1.0, a: 0.5})
    assert dict(neuron.param_assumptions) == {"k": ("nonnegative", "integer")}


def test_an_ode_neuron_keeps_its_parameters_assumptions() -> None:
    tau = sp.Symbol("tau", positive=True)
    with pytest.raises(ValueError, match="'tau' is declared positive"):
        sn.Neuron.from_ode((X - V) / tau, dt=1.0, params={"tau": -1.0})
    assert sn.Neuron.from_ode((X - V) / tau, dt=1.0, params={"tau": 3.0}).param_assumptions == {
        "tau": ("positive",)
    }


@pytest.mark.parametrize("tau", [0.0, -1.0])
def test_zoo_time_constants_must_be_positive(tau: float) -> None:
    with pytest.raises(ValueError, match=rf"'tau' is declared positive.*{tau}"):
        sn.models.LIF(tau=tau)
    with pytest.raises(ValueError, match="'tau_syn' is declared positive"):
        sn.models.CuLIF(tau_syn=tau)
    with pytest.raises(ValueError, match="'C_m' is declared positive"):
        sn.models.IafPscExp(C_m=tau)


def test_every_zoo_default_satisfies_its_assumptions() -> None:
    for name, build in sn.models.ZOO.items():
        neuron = build()
        for pname, assumptions in neuron.param_assumptions.items():
            check_assumption(pname, assumptions, neuron.params[pname])  # raises if not
        if name in ("LIF", "CuLIF", "ALIF", "AdEx"):
            assert "positive" in neuron.param_assumptions["tau"], name


@pytest.mark.parametrize(
    ("assumption", "good", "bad"),
    [
        ("positive", [1e-300, 2.0], [0.0, -0.0, -1.0]),
        ("negative", [-1e-300], [0.0, 1.0]),
        ("nonnegative", [0.0, 3.0], [-1e-300]),
        ("nonpositive", [0.0, -3.0], [1e-300]),
        ("zero", [0.0, -0.0], [1e-300]),
        ("nonzero", [1e-300, -2.0], [0.0]),
        ("integer", [3.0, -4.0, 0.0], [3.5, 1e-9]),
        ("noninteger", [3.5], [3.0]),
        ("even", [4.0, 0.0, -2.0], [3.0, 2.5]),
        ("odd", [3.0, -1.0], [4.0, 2.5]),
        ("prime", [2.0, 7.0, 2147483647.0], [1.0, 9.0, -7.0, 2.5]),
        ("composite", [4.0, 9.0], [1.0, 7.0, 4.5]),
    ],
)
def test_check_assumption_against_each_definition(
    assumption: str, good: list[float], bad: list[float]
) -> None:
    for value in good:
        check_assumption("k", (assumption,), value)
    for value in bad:
        with pytest.raises(ValueError, match=rf"'k' is declared {assumption}.* {value}"):
            check_assumption("k", (assumption,), value)


def test_assumptions_given_false_are_checked_too() -> None:
    """positive=False on a real symbol means nonpositive; integer=False, not an integer."""
    p = sp.Symbol("p", real=True, positive=False)
    with pytest.raises(ValueError, match="'p' is declared nonpositive"):
        sn.Neuron(V + X + p * V, params={p: 1.0})
    q = sp.Symbol("q", real=True, integer=False)
    with pytest.raises(ValueError, match="'q' is declared noninteger"):
        sn.Neuron(V + X + q * V, params={q: 1.0})


@pytest.mark.parametrize("flag", [True, False, np.bool_(True), torch.tensor(True)], ids=repr)
def test_a_bool_is_not_a_real_number(flag: object) -> None:
    """params={"tau": True} was taken as 1.0."""
    with pytest.raises(TypeError, match=r"param 'tau' must be a real number, not a bool"):
        finite_float(flag, "param 'tau'")
    with pytest.raises(TypeError, match="must be a real number, not a bool"):
        sn.models.LIF(tau=flag)  # type: ignore[arg-type]
    if not isinstance(flag, torch.Tensor):
        with pytest.raises(TypeError, match="must be a real number, not a bool"):
            sn.simulate(sn.models.LIF(), torch.rand(3, 2), params={"tau": flag}, backend="torch")


# -- tensors entering sn.simulate: the check a float gets (issue 34 item 3) ------------


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize(
    "tau", [torch.tensor(0.0), torch.tensor([2.0, 0.0, 3.0]), torch.tensor(-1.0)], ids=repr
)
def test_simulate_refuses_a_tensor_that_contradicts_the_assumption(
    backend: str, tau: torch.Tensor
) -> None:
    """LIF's tau is positive: a tensor 0 ran to NaN where the float 0 is refused."""
    bad = float(tau.reshape(-1)[(tau.reshape(-1) <= 0).nonzero()[0, 0]])
    with pytest.raises(ValueError, match=rf"'tau' is declared positive.*value is {bad}"):
        sn.simulate(sn.models.LIF(), torch.rand(5, 3), params={"tau": tau}, backend=backend)


def test_a_tensor_is_read_once_per_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same tensor unchanged is not read again (a device synchronisation on a GPU);
    changed in place, it is checked again and refused."""
    from symneuron import assumptions

    lif, tau, x = sn.models.LIF(), torch.full((3,), 2.0), torch.rand(5, 3)
    reads = []
    real = assumptions.check_assumption
    monkeypatch.setattr(
        assumptions, "check_assumption", lambda *a, **k: reads.append(a[0]) or real(*a, **k)
    )
    for _ in range(3):
        sn.simulate(lif, x, params={"tau": tau}, backend="cpu")
    assert reads == ["tau"]
    tau[1] = 0.0
    with pytest.raises(ValueError, match="'tau' is declared positive"):
        sn.simulate(lif, x, params={"tau": tau}, backend="cpu")


def test_a_tensor_is_not_read_while_compiling() -> None:
    """torch.compile(fullgraph=True) traces simulate with a tensor tau: nothing is read
    back (a check there would break the graph); the eager call checks it."""
    lif, tau = sn.models.LIF(), torch.full((3,), 2.0)

    def run(x: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        return sn.simulate(lif, x, params={"tau": tau}, backend="torch")[1]

    x = torch.rand(5, 3)
    compiled = torch.compile(run, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x, tau), run(x, tau))
