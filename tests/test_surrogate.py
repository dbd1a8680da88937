"""Surrogates: SymPy's σ' vs finite differences of σ, vs SpikingJelly's formulas, end to end."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import sympy as sp
import torch
from conftest import assert_matches, compare, seed_of

import symneuron as sn
from symneuron.surrogate import u

# SpikingJelly's gradient formulas (activation_based/surrogate.py), written independently.


def _sigmoid(x: np.ndarray, alpha: float) -> np.ndarray:
    s = 1 / (1 + np.exp(-alpha * x))
    return alpha * s * (1 - s)


SJ_GRADIENT: dict[str, Callable[..., np.ndarray]] = {
    "Sigmoid": _sigmoid,
    "ATan": lambda x, alpha: (alpha / 2) / (1 + (math.pi / 2 * alpha * x) ** 2),
    "PiecewiseQuadratic": lambda x, alpha: np.where(
        np.abs(x) <= 1 / alpha, alpha - alpha**2 * np.abs(x), 0.0
    ),
    "SoftSign": lambda x, alpha: alpha / (2 * (1 + alpha * np.abs(x)) ** 2),
    "Erf": lambda x, alpha: alpha / math.sqrt(math.pi) * np.exp(-(alpha**2) * x**2),
    "PiecewiseLeakyReLU": lambda x, w, c: np.where(np.abs(x) < w, 1 / (2 * w), c),
    "QPseudoSpike": lambda x, alpha: (1 + 2 * np.abs(x) / (alpha - 1)) ** (-alpha),
    "SuperSpike": lambda x, alpha: alpha / (np.abs(x) + 1) ** 2,
}

# name -> keyword sets (SpikingJelly's defaults first).
ARGS = {
    "Sigmoid": [{"alpha": 4.0}, {"alpha": 1.5}],
    "ATan": [{"alpha": 2.0}, {"alpha": 0.7}],
    "PiecewiseQuadratic": [{"alpha": 1.0}, {"alpha": 2.5}],
    "SoftSign": [{"alpha": 2.0}, {"alpha": 0.5}],
    "Erf": [{"alpha": 2.0}, {"alpha": 0.8}],
    "PiecewiseLeakyReLU": [{"w": 1.0, "c": 0.01}, {"w": 0.4, "c": 0.1}],
    "QPseudoSpike": [{"alpha": 2.0}, {"alpha": 3.5}],
    "SuperSpike": [{"alpha": 1.0}, {"alpha": 2.0}],
}
assert set(ARGS) == set(sn.surrogate.__all__) - {"Surrogate"}, "a surrogate is untested"

CASES = [(name, kw) for name, kws in ARGS.items() for kw in kws]
IDS = [f"{name}-{'-'.join(f'{k}{v}' for k, v in kw.items())}" for name, kw in CASES]


def kinks(kw: dict[str, float]) -> list[float]:
    """Points where some σ' is not smooth (0 and the piecewise boundaries)."""
    return [0.0, *([1 / kw["alpha"]] if "alpha" in kw else []), *([kw["w"]] if "w" in kw else [])]


def grid(kw: dict[str, float]) -> np.ndarray:
    """Random points in (−3, 3), away from the kinks."""
    x = np.random.default_rng(seed_of(sorted(kw.items()))).uniform(-3, 3, 400)
    for k in kinks(kw):
        x = x[np.abs(np.abs(x) - k) > 1e-3]
    return x


def numpy_fn(expr: sp.Expr) -> Callable[[np.ndarray], np.ndarray]:
    special = {"erfc": np.vectorize(math.erfc), "erf": np.vectorize(math.erf)}
    fn = sp.lambdify(u, expr, modules=[special, "numpy"])
    return lambda x: np.broadcast_to(np.asarray(fn(x), dtype=np.float64), x.shape)


@pytest.mark.parametrize("name, kw", CASES, ids=IDS)
def test_derivative_matches_finite_difference(name: str, kw: dict[str, float]) -> None:
    surrogate = getattr(sn.surrogate, name)(**kw)
    x = grid(kw)
    primitive = numpy_fn(surrogate.primitive_in_u())
    step = 1e-6
    fd = (primitive(x + step) - primitive(x - step)) / (2 * step)
    derived = numpy_fn(surrogate.derivative())(x)
    np.testing.assert_allclose(derived, fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name, kw", CASES, ids=IDS)
def test_derivative_matches_spikingjelly_formula(name: str, kw: dict[str, float]) -> None:
    surrogate = getattr(sn.surrogate, name)(**kw)
    x = grid(kw)
    expected = SJ_GRADIENT[name](x, **kw)
    assert np.ptp(expected) > 0 or name == "PiecewiseLeakyReLU"
    derived = numpy_fn(surrogate.derivative())(x)
    np.testing.assert_allclose(derived, expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name, kw", CASES, ids=IDS)
def test_derivative_matches_spikingjelly_autograd(name: str, kw: dict[str, float]) -> None:
    sj = pytest.importorskip("spikingjelly.activation_based.surrogate")
    x = torch.from_numpy(grid(kw)).requires_grad_(True)
    getattr(sj, name)(**kw, spiking=True)(x).sum().backward()
    derived = numpy_fn(getattr(sn.surrogate, name)(**kw).derivative())(x.detach().numpy())
    np.testing.assert_allclose(derived, x.grad.numpy(), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("name, kw", CASES[::2], ids=IDS[::2])
def test_kernel_with_surrogate_matches_reference(name: str, kw: dict[str, float]) -> None:
    """The kernel uses SymPy's σ'; the reference differentiates σ with torch autograd."""
    neuron = sn.models.LIF(surrogate=getattr(sn.surrogate, name)(**kw), v_reset=None)
    c = compare(neuron, "cpu", torch.float64, seed=seed_of("sg", name))
    assert_matches(c, v_atol=1e-10, grad_rtol=1e-9)


def test_user_surrogate_end_to_end() -> None:
    x = sp.Symbol("x", real=True)
    fast_sigmoid = sn.surrogate.Surrogate(
        (3 * x / (1 + sp.Abs(3 * x)) + 1) / 2, x, name="FastSigmoid"
    )
    points = np.array([-2.0, -0.3, 0.2, 1.7])
    np.testing.assert_allclose(
        numpy_fn(fast_sigmoid.derivative())(points),
        3 / (2 * (1 + 3 * np.abs(points)) ** 2),
        rtol=1e-12,
    )
    neuron = sn.models.QIF(surrogate=fast_sigmoid, learnable=["tau"])
    report = sn.check(neuron, backend="cpu", T=6, shape=(3, 8), seed=21)
    assert report.passed, str(report)
    c = compare(neuron, "cpu", torch.float64, seed=seed_of("fast_sigmoid"))
    assert_matches(c, v_atol=1e-10, grad_rtol=1e-9)


def test_primitive_with_two_free_symbols() -> None:
    x, k = sp.symbols("x k", real=True)
    with pytest.raises(ValueError, match=r"may use only x, but it also uses \['k'\]"):
        sn.surrogate.Surrogate(sp.atan(k * x), x)


@pytest.mark.parametrize("primitive", ["sign", "Heaviside"])
def test_primitive_with_singular_derivative(primitive: str) -> None:
    x = sp.Symbol("x", real=True)
    with pytest.raises(ValueError, match="derivative contains DiracDelta"):
        sn.surrogate.Surrogate(getattr(sp, primitive)(x), x)


def test_surrogate_argument_types() -> None:
    x = sp.Symbol("x", real=True)
    with pytest.raises(TypeError, match="x must be a sympy.Symbol"):
        sn.surrogate.Surrogate(sp.atan(x), "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="primitive must be a SymPy expression"):
        sn.surrogate.Surrogate(math.atan, x)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make",
    [
        lambda: sn.surrogate.Sigmoid(alpha=0.0),
        lambda: sn.surrogate.ATan(alpha=-1.0),
        lambda: sn.surrogate.Erf(alpha=float("nan")),
        lambda: sn.surrogate.PiecewiseLeakyReLU(w=0.0),
        lambda: sn.surrogate.QPseudoSpike(alpha=1.0),
    ],
    ids=["sigmoid-0", "atan-neg", "erf-nan", "plrelu-w0", "qps-1"],
)
def test_bad_surrogate_parameters(make: Callable[[], sn.surrogate.Surrogate]) -> None:
    with pytest.raises(ValueError, match="(must be > 0|must be finite|needs alpha > 1)"):
        make()
