"""Errors that name the fix, found by trying symneuron as a new user would."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
import torch

import symneuron as sn


def test_misspelt_learnable_lists_the_real_names_and_suggests_one() -> None:
    with pytest.raises(
        ValueError,
        match=r"'taus' is not in params \(this neuron has \['tau'\]\)"
        r"\. Did you mean 'tau'\?",
    ):
        sn.models.LIF(learnable=["taus"])


def test_new_batch_size_without_reset_says_reset() -> None:
    layer = sn.NeuronLayer(sn.models.LIF(), backend="torch")
    layer(torch.rand(4, 8, 3))
    with pytest.raises(ValueError, match=r"call layer\.reset\(\) before each new sequence"):
        layer(torch.rand(4, 5, 3))
    layer.reset()
    assert layer(torch.rand(4, 5, 3)).shape == (4, 5, 3)


def test_numpy_input_suggests_torch_from_numpy() -> None:
    x = np.zeros((4, 3), dtype=np.float32)
    with pytest.raises(TypeError, match=r"got ndarray; convert it with torch\.from_numpy"):
        sn.simulate(sn.models.LIF(), x)  # type: ignore[arg-type]


def test_check_of_a_neuron_that_never_fires_fails_and_says_so() -> None:
    k = sp.Symbol("k")
    silent = sn.Neuron(0.5 * sn.V + k * sn.X, params={k: 1e-6}, v_threshold=10.0)
    report = sn.check(silent, backend="torch", seed=0)
    assert not report.passed
    assert [r.name for r in report.failures()] == [
        "reference never fires, x scaled up to 16384x: no spike was checked"
    ]


def test_check_scales_the_input_to_the_models_units() -> None:
    report = sn.check(sn.models.AdEx2005(), backend="torch", seed=0)  # X in pA
    assert report.passed, str(report)
    assert any(r.name.startswith("reference fires (x scaled") for r in report.results)


def test_learnable_not_a_list_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"learnable must be a list of parameter names"):
        sn.models.LIF(learnable=3)


def test_a_name_that_is_not_a_string_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"name must be a str \(used in kernel names\), got 5"):
        sn.Neuron(sn.V + sn.X, name=5)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["no", "False", 1, 0, None, torch.tensor(True)], ids=repr)
@pytest.mark.parametrize("name", ["store_v_seq", "check_finite"])
def test_flags_must_be_bools_not_truthy_values(name: str, value: object) -> None:
    """A string such as "no" is truthy: taken as given it would silently mean True."""
    x = torch.rand(3, 4)
    with pytest.raises(TypeError, match=rf"{name} must be True or False, got "):
        sn.simulate(sn.models.LIF(), x, backend="torch", **{name: value})
    with pytest.raises(TypeError, match=rf"{name} must be True or False, got "):
        sn.NeuronLayer(sn.models.LIF(), **{name: value})


def test_numpy_bools_are_bools() -> None:
    out = sn.simulate(sn.models.LIF(), torch.rand(3, 4), backend="torch", store_v_seq=np.False_)
    assert out[1].shape == (1, 4)
    assert sn.NeuronLayer(sn.models.LIF(), store_v_seq=np.True_).store_v_seq is True


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("x", TypeError, r"Parameter 'tau' must be a real number, got 'x'"),
        (float("nan"), ValueError, r"Parameter 'tau' must be finite, got nan"),
        (
            torch.tensor([2, 3]),
            TypeError,
            r"Parameter 'tau' must be a floating-point tensor, "
            r"got torch\.int64; use \.float\(\)",
        ),
    ],
    ids=["string", "nan", "int-tensor"],
)
def test_layer_param_errors_name_the_param(value: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        sn.NeuronLayer(sn.models.LIF(), params={"tau": value})


def test_single_step_layer_given_a_scalar_does_not_suggest_single_step() -> None:
    layer = sn.NeuronLayer(sn.models.LIF(), step_mode="s", backend="torch")
    with pytest.raises(ValueError, match=r"step_mode='s'\) takes one step's input") as info:
        layer(torch.tensor(0.5))
    assert "NeuronLayer(step_mode='s')" not in str(info.value)
    assert layer(torch.tensor([0.5])).shape == (1,)


# -- issue 34 item 11: errors that say what to do ------------------------------------

tau = sp.Symbol("tau", positive=True)


def test_xi_in_a_discrete_charge_says_use_noise_or_the_ode() -> None:
    with pytest.raises(ValueError, match=r"use sn\.noise there.*Neuron\.from_ode"):
        sn.Neuron(sn.V + (sn.X - sn.V) / tau + sn.xi, params={tau: 2.0})


@pytest.mark.parametrize("draw", [sn.noise, sn.xi], ids=["noise", "xi"])
def test_noise_in_a_threshold_says_put_it_in_the_charge(draw: sp.Symbol) -> None:
    with pytest.raises(
        ValueError, match=r"cannot draw noise\. Put the noise into the charge"
    ) as info:
        sn.Neuron(sn.V + (sn.X - sn.V) / tau, params={tau: 2.0}, v_threshold=1 + 0.1 * draw)
    assert "give each a default in params" not in str(info.value)


def test_from_ode_whose_v_cancels_shows_the_step_and_dt() -> None:
    with pytest.raises(
        ValueError,
        match=r"With dt = 2\.0, the euler step .* is H = 1\.0\*X, in "
        r"which V cancels",
    ):
        sn.Neuron.from_ode((sn.X - sn.V) / 2, dt=2.0, method="euler")
    assert sn.Neuron.from_ode((sn.X - sn.V) / 2, dt=1.0, method="euler").charge.has(sn.V)


@pytest.mark.parametrize("constant", [sp.oo, -sp.oo, sp.zoo, sp.nan], ids=str)
def test_an_infinite_charge_is_reported_as_not_finite(constant: sp.Expr) -> None:
    with pytest.raises(ValueError, match=r"The charge is not finite") as info:
        sn.Neuron(sn.V + sn.X + constant)
    assert "does not depend on V" not in str(info.value)


@pytest.mark.parametrize(
    ("given", "hint"),
    [
        ("LIF", r"sn\.models\.LIF\(\)"),
        (sn.models.LIF, r"call it .*sn\.models\.LIF\(\)"),
        ("NoisyLIF", r"sn\.models\.NoisyLIF\(\)"),
        (3, r"sn\.Neuron\(\.\.\.\)"),
    ],
    ids=["name", "constructor", "noisy-name", "int"],
)
def test_check_of_a_model_name_says_build_it(given: object, hint: str) -> None:
    with pytest.raises(TypeError, match=rf"neuron must be a symneuron\.Neuron.*{hint}"):
        sn.check(given)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("where", ["param", "v_init", "state"])
def test_sparse_tensors_are_refused_with_to_dense(backend: str, where: str) -> None:
    neuron = sn.models.ALIF()
    x = torch.rand(4, 3)
    sparse = torch.full((3,), 0.5).to_sparse()
    kw: dict[str, object] = {
        "param": {"params": {name: sparse for name in list(neuron.params)[:1]}},
        "v_init": {"v_init": sparse},
        "state": {"states": {name: sparse for name in neuron.states}},
    }[where]
    with pytest.raises(
        TypeError,
        match=r"must be a dense tensor, got layout torch\.sparse_coo; "
        r"convert it with \.to_dense\(\)",
    ):
        sn.simulate(neuron, x, backend=backend, **kw)  # type: ignore[arg-type]


def test_nested_charge_past_the_depth_limit_is_a_clear_error() -> None:
    from symneuron.validate import MAX_DEPTH, expression_depth

    deep = sn.V
    for _ in range(300):
        deep = sp.tanh(deep)
    with pytest.raises(ValueError, match=r"nested 302 levels deep, more than the 100"):
        sn.Neuron(deep + sn.X)
    ok = sn.V
    while expression_depth(ok + sn.X) < MAX_DEPTH:
        ok = sp.tanh(ok)
    neuron = sn.Neuron(ok + sn.X)  # at the limit: derived, printed and run
    assert expression_depth(neuron.charge) == MAX_DEPTH
    assert "tanh" in neuron.source("cpu", "float64")
    x = 2 * torch.rand(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    spikes, v_seq = sn.simulate(neuron, x, backend="torch")
    v = torch.zeros(3, dtype=torch.float64)  # the oracle: the same chain in torch
    for t in range(4):
        h = v
        for _ in range(MAX_DEPTH - 2):
            h = torch.tanh(h)
        h = h + x[t]
        s = (h >= 1.0).double()
        v = h * (1 - s)
        assert torch.equal(spikes[t], s)
        torch.testing.assert_close(v_seq[t], v, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize(
    ("kw", "what"),
    [({"params": {"tau": 1e39}}, "param 'tau'"), ({"v_init": 1e39}, "v_init")],
    ids=["param", "v_init"],
)
def test_a_value_beyond_float32_says_so(backend: str, kw: dict[str, object], what: str) -> None:
    x = torch.rand(3, 2)
    with pytest.raises(ValueError, match=rf"{what} = 1e\+39 is beyond the range of float32"):
        sn.simulate(sn.models.LIF(), x, backend=backend, **kw)  # type: ignore[arg-type]
    sn.simulate(sn.models.LIF(), x.double(), backend=backend, **kw)  # type: ignore[arg-type]


def test_error_table_rows_match_the_messages() -> None:
    """The user guide's error table quotes the messages these raise."""
    from pathlib import Path

    guide = (Path(__file__).parents[1] / "docs" / "user_guide.md").read_text()
    cases = [
        (lambda: sn.Neuron(0.5 * sn.V + 1.0), "The neuron does not depend on the input X"),
        (lambda: sn.Neuron(sn.X + 1.0), "The charge does not depend on V; H = f(V, X, params)"),
        (
            lambda: sn.simulate(sn.models.LIF(), torch.rand(3, 2), params={"tau": 1e39}),
            "param 'tau' = 1e+39 is beyond the range of float32 (±3.4e+38), which this run "
            "computes in",
        ),
    ]
    for make, message in cases:
        with pytest.raises(ValueError) as info:
            make()
        assert str(info.value).startswith(message)
        assert f"`ValueError: {message}" in guide, message


@pytest.mark.parametrize("given", ["LIF", sn.models.LIF])
def test_layers_and_simulate_name_the_model_to_build(given: object) -> None:
    """The layers and simulate refuse a model's name or uncalled constructor as sn.check
    does, naming the call that builds it."""
    for build in (
        lambda: sn.NeuronLayer(given),  # type: ignore[arg-type]
        lambda: sn.RecurrentNeuronLayer(given, 4),  # type: ignore[arg-type]
        lambda: sn.simulate(given, torch.rand(3, 2)),  # type: ignore[arg-type]
    ):
        with pytest.raises(TypeError, match=r"sn\.models\.LIF\(\)"):
            build()


def test_sparse_tensors_entering_a_layer_are_refused() -> None:
    sparse = torch.tensor(2.0).to_sparse()
    with pytest.raises(TypeError, match=r"Parameter 'tau' must be a dense tensor.*to_dense"):
        sn.NeuronLayer(sn.models.LIF(), params={"tau": sparse})
    with pytest.raises(TypeError, match=r"mask must be a dense tensor"):
        sn.RecurrentNeuronLayer(sn.models.LIF(), 3, mask=torch.ones(3, 3).to_sparse())
