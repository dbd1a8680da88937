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
