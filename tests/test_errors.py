"""Errors that name the fix, found by trying symneuron as a new user would."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
import torch

import symneuron as sn


def test_misspelt_learnable_lists_the_real_names_and_suggests_one() -> None:
    with pytest.raises(ValueError, match=r"'taus' is not in params \(this neuron has \['tau'\]\)"
                       r"\. Did you mean 'tau'\?"):  # fmt: skip
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
        (torch.tensor([2, 3]), TypeError, r"Parameter 'tau' must be a floating-point tensor, "
                                          r"got torch\.int64; use \.float\(\)"),
    ],
    ids=["string", "nan", "int-tensor"],
)  # fmt: skip
def test_layer_param_errors_name_the_param(value: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        sn.NeuronLayer(sn.models.LIF(), params={"tau": value})


def test_single_step_layer_given_a_scalar_does_not_suggest_single_step() -> None:
    layer = sn.NeuronLayer(sn.models.LIF(), step_mode="s", backend="torch")
    with pytest.raises(ValueError, match=r"step_mode='s'\) takes one step's input") as info:
        layer(torch.tensor(0.5))
    assert "NeuronLayer(step_mode='s')" not in str(info.value)
    assert layer(torch.tensor([0.5])).shape == (1,)
