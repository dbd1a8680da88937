"""``exp_euler`` through a zero or small linear coefficient (issue 25, item 2).

dV/dt = −g·V + X with X held at x over each step of dt = 1 has the exact solution
V(t) = −x·expm1(−g·t)/g (V(0) = 0), and x·t at g = 0. The step that ``exp_euler``
builds must be finite at g = 0 at run time and must not cancel for small g: V and
∂L/∂g (L = Σ_t V_t) are compared with these closed forms, written here in float64
and mpmath, independently of ``symneuron.ode``.
"""

from __future__ import annotations

import math

import mpmath
import pytest
import sympy as sp
import torch

import symneuron as sn

g = sp.Symbol("g", real=True)
STEPS, DRIVE = 100, 0.01
COEFFICIENTS = [0.0, 1e-8, 1e-6, 1e-4, 1e-2, 1.0]
#: relative tolerance on V and on ∂L/∂g: a few ulps per step over 100 steps
RTOL = {torch.float32: 2e-5, torch.float64: 1e-12}


def _leaky() -> sn.Neuron:
    """dV/dt = −g·V + X, g learnable; the threshold is never reached."""
    return sn.Neuron.from_ode(
        -g * sn.V + sn.X, dt=1.0, params={g: 0.5}, learnable=[g], v_threshold=1e6
    )


def exact_v(coefficient: float) -> torch.Tensor:
    """V_t for t = 1..STEPS, float64."""
    times = range(1, STEPS + 1)
    if coefficient == 0.0:
        return torch.tensor([DRIVE * t for t in times], dtype=torch.float64)
    return torch.tensor(
        [-DRIVE * math.expm1(-coefficient * t) / coefficient for t in times], dtype=torch.float64
    )


def exact_grad(coefficient: float) -> float:
    """∂(Σ_t V_t)/∂g: x·Σ_t [t·e^{−gt}/g − (1 − e^{−gt})/g²], −x·Σ_t t²/2 at g = 0."""
    if coefficient == 0.0:
        return -DRIVE * sum(t * t / 2 for t in range(1, STEPS + 1))
    with mpmath.workdps(50):
        c = mpmath.mpf(coefficient)
        total = mpmath.fsum(
            t * mpmath.exp(-c * t) / c - (1 - mpmath.exp(-c * t)) / c**2
            for t in range(1, STEPS + 1)
        )
        return float(DRIVE * total)


def _run(backend: str, dtype: torch.dtype, coefficient: float, device: str = "cpu"):
    neuron = _leaky()
    x = torch.full((STEPS, 1), DRIVE, dtype=dtype, device=device)
    rate = torch.tensor(coefficient, dtype=dtype, device=device, requires_grad=True)
    _, v = sn.simulate(neuron, x, v_init=0.0, params={"g": rate}, backend=backend)
    v.sum().backward()
    assert rate.grad is not None
    return v[:, 0].detach().cpu().double(), float(rate.grad)


def _assert_exact(backend: str, dtype: torch.dtype, coefficient: float, device: str = "cpu"):
    v, grad = _run(backend, dtype, coefficient, device)
    assert torch.isfinite(v).all(), f"V is not finite: {v[:3]}"
    torch.testing.assert_close(v, exact_v(coefficient), rtol=RTOL[dtype], atol=0)
    assert grad == pytest.approx(exact_grad(coefficient), rel=RTOL[dtype] * 5)


@pytest.mark.parametrize("coefficient", COEFFICIENTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_exp_euler_is_exact_through_a_zero_and_small_coefficient(
    backend: str, dtype: torch.dtype, coefficient: float
) -> None:
    _assert_exact(backend, dtype, coefficient)


def test_the_issue_figures() -> None:
    """The issue's numbers: after 100 steps of X = 0.01, V = 0.999995 at g = 1e-7 and
    0.995017 at g = 1e-4 (float32 gave 1.5625 and 0.995224)."""
    for coefficient, expected in ((1e-7, 0.999995), (1e-4, 0.995017)):
        v, _ = _run("cpu", torch.float32, coefficient)
        assert float(v[-1]) == pytest.approx(expected, rel=2e-6)


def test_phi1_is_continuous_with_its_derivative_across_the_series_band() -> None:
    """φ₁(z) = (e^z − 1)/z and φ₁'(z) from both sides of the band's edge, vs mpmath."""
    from symneuron.ode import PHI1_BAND, phi1

    z = sp.Symbol("z", real=True)
    expr = phi1(z)
    slope = sp.diff(expr, z)
    for point in (0.0, 1e-12, -1e-7, 0.05, -0.0999999, 0.1, -0.1000001, 0.7, -3.0):
        with mpmath.workdps(40):
            c = mpmath.mpf(point)
            want = 1 if point == 0 else mpmath.expm1(c) / c
            want_slope = (
                mpmath.mpf(1) / 2 if point == 0 else mpmath.diff(lambda s: mpmath.expm1(s) / s, c)
            )
        assert float(expr.subs(z, point)) == pytest.approx(float(want), rel=1e-15)
        assert float(slope.subs(z, point)) == pytest.approx(float(want_slope), rel=1e-12)
    assert 0 < PHI1_BAND < 1


def test_a_numeric_coefficient_is_evaluated_exactly() -> None:
    """dV/dt = −1e−9·V + X: the step's φ₁ is a number, exact to float64."""
    neuron = sn.Neuron.from_ode(-1e-9 * sn.V + sn.X, dt=1.0)
    assert not neuron.charge.has(sp.Piecewise)
    x = torch.full((STEPS, 1), DRIVE, dtype=torch.float64)
    _, v = sn.simulate(neuron, x, v_init=0.0, backend="cpu")
    expected = -DRIVE * math.expm1(-1e-9 * STEPS) / 1e-9
    assert float(v[-1, 0]) == pytest.approx(expected, rel=1e-13)


@pytest.mark.cuda
@pytest.mark.parametrize("coefficient", COEFFICIENTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_exp_euler_is_exact_through_a_zero_coefficient_cuda(
    dtype: torch.dtype, coefficient: float
) -> None:
    _assert_exact("cuda", dtype, coefficient, device="cuda")


@pytest.mark.slow  # NVRTC, several sources: ~6 s
def test_cuda_sources_of_the_exact_step_compile_with_nvrtc() -> None:
    """expm1 and the guarded series in every CUDA dtype (no GPU needed)."""
    nvrtc = pytest.importorskip("symneuron.runtime.nvrtc")
    if not nvrtc.nvrtc_available():
        pytest.skip("NVRTC not installed (pip install 'symneuron[cuda]')")
    neuron = _leaky()
    assert "expm1f(" in neuron.source("cpu", "float32")
    for dtype in ("float32", "float64", "float16", "bfloat16"):
        ptx = nvrtc.compile_to_ptx(neuron.source("cuda", dtype), name=f"phi1_{dtype}.cu")
        assert ptx.count(".entry") == 14, dtype
