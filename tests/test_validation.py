"""Bad inputs fail early with a ValueError/TypeError whose message names the problem."""

from __future__ import annotations

import pytest
import sympy as sp
import torch
from conftest import generator, seed_of

import symneuron as sn

V, X = sn.V, sn.X
a, b = sp.symbols("a b", real=True)


def rand(*shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=generator(seed_of("validation", shape)))


def x_seq(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = generator(seed_of("x_seq", shape))
    return (0.5 + torch.randn(*shape, generator=gen)).to(dtype)


# -- the charge -------------------------------------------------------------


@pytest.mark.parametrize(
    "charge, params, match",
    [
        (V + X + a, {}, r"unknown symbols \['a'\]"),
        (V + X + a * b, {a: 1.0}, r"unknown symbols \['b'\]"),
        (2 * X + a, {a: 1.0}, "does not depend on V"),
        (0.5 * V + a, {a: 1.0}, "does not depend on the input X"),
        (V + sp.I * X, {}, "complex or not real"),
        (V + X * sp.sqrt(-2), {}, "complex or not real"),
        (V + X + sp.log(-1), {}, "complex or not real"),
        (V + X + sp.arg(V), {}, "complex or not real"),
        (V + X + sp.Heaviside(V), {}, "contains Heaviside"),
        (V + X + sp.DiracDelta(V - a), {a: 0.5}, "contains DiracDelta"),
        (V + X + sp.Derivative(sp.exp(V), V), {}, "contains Derivative"),
        (V + X + sp.Integral(V, V), {}, "contains Integral"),
        (V + X + sp.Function("g")(V), {}, r"undefined functions \['g'\]"),
        (V + sp.oo * X, {}, "not finite"),
    ],
    ids=[
        "unknown",
        "unknown-b",
        "no-V",
        "no-X",
        "I",
        "sqrt(-2)",
        "log(-1)",
        "arg",
        "Heaviside",
        "DiracDelta",
        "Derivative",
        "Integral",
        "undefined-g",
        "oo",
    ],
)
def test_bad_charge(charge: sp.Expr, params: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sn.Neuron(charge, params=params)


def test_charge_must_be_sympy() -> None:
    with pytest.raises(TypeError, match="charge must be a SymPy expression"):
        sn.Neuron("V + X")  # type: ignore[arg-type]


# Charges whose derivative is not a finite function: sign -> DiracDelta, Max -> Heaviside,
# floor -> an unevaluated Derivative.
NON_SMOOTH = {
    "sign": (V + X + sp.sign(V), "dH/dV contains DiracDelta"),
    "Max": (V + X + sp.Max(V, 0), "dH/dV contains Heaviside"),
    "floor": (V + X + sp.floor(V), "dH/dV contains Derivative"),
    "sign-X": (V + X + sp.sign(X - 0.5), "dH/dX contains DiracDelta"),
}


@pytest.mark.parametrize("case", list(NON_SMOOTH))
def test_non_finite_derivative_rejected_at_construction(case: str) -> None:
    """neuron.py: "All validation happens at construction, so every later stage
    (derivation, code generation, compilation) can trust its input"."""
    charge, match = NON_SMOOTH[case]
    with pytest.raises(ValueError, match=match):
        sn.Neuron(charge)


def test_non_finite_learnable_derivative_rejected() -> None:
    with pytest.raises(ValueError, match="dH/da contains DiracDelta"):
        sn.Neuron(V + X + sp.sign(a) * V, params={a: 0.5}, learnable=[a])


def test_smooth_but_kinked_charge_is_accepted() -> None:
    """|V| has the finite derivative sign(V): accepted, unlike sign(V) itself."""
    neuron = sn.Neuron(V + X - 0.1 * sp.Abs(V))
    assert neuron.derivatives()["dH/dV"].has(sp.sign)


# -- params, learnable, reset, surrogate --------------------------------------


def test_learnable_not_in_params() -> None:
    with pytest.raises(ValueError, match="Learnable parameter 'b' is not in params"):
        sn.Neuron(V + X * a, params={a: 1.0}, learnable=["b"])


def test_learnable_not_in_charge() -> None:
    with pytest.raises(ValueError, match="'b' does not appear in the charge"):
        sn.Neuron(V + X * a, params={a: 1.0, b: 2.0}, learnable=[b])


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_default(value: float) -> None:
    with pytest.raises(ValueError, match="Default of parameter 'a' must be finite"):
        sn.Neuron(V + X * a, params={a: value})


@pytest.mark.parametrize("field", ["v_threshold", "v_reset"])
def test_non_finite_threshold_or_reset(field: str) -> None:
    with pytest.raises(ValueError, match=f"{field} must be finite"):
        sn.Neuron(V + X, **{field: float("nan")})


def test_reserved_and_duplicate_param_names() -> None:
    with pytest.raises(ValueError, match="'S' is reserved"):
        sn.Neuron(V + X, params={"S": 1.0})
    with pytest.raises(ValueError, match="'a' is given twice"):
        sn.Neuron(V + X * a, params={a: 1.0, "a": 2.0})
    with pytest.raises(TypeError, match="params must be a mapping"):
        sn.Neuron(V + X, params=[1.0])  # type: ignore[arg-type]


@pytest.mark.parametrize("surrogate", [torch.sigmoid, "ATan", sp.atan(V)])
def test_surrogate_must_be_a_surrogate(surrogate: object) -> None:
    with pytest.raises(TypeError, match="surrogate must be a symneuron.surrogate.Surrogate"):
        sn.Neuron(V + X, surrogate=surrogate)  # type: ignore[arg-type]


def test_detach_reset_and_name() -> None:
    with pytest.raises(TypeError, match="detach_reset must be a bool"):
        sn.Neuron(V + X, detach_reset=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name must be an identifier"):
        sn.Neuron(V + X, name="my neuron")


# -- simulate -----------------------------------------------------------------

LIF = sn.models.LIF()


def test_x_seq_one_dim() -> None:
    with pytest.raises(ValueError, match=r"at least 2 dims, got shape \(5,\)"):
        sn.simulate(LIF, x_seq(5))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64])
def test_non_float_x_seq(dtype: torch.dtype) -> None:
    x = torch.ones(3, 5, dtype=dtype)
    with pytest.raises(TypeError, match=f"floating-point tensor, got {dtype}"):
        sn.simulate(LIF, x)


def test_x_seq_not_a_tensor() -> None:
    with pytest.raises(TypeError, match="x_seq must be a torch.Tensor"):
        sn.simulate(LIF, [[1.0, 2.0]])  # type: ignore[arg-type]


def test_neuron_not_a_neuron() -> None:
    with pytest.raises(TypeError, match="neuron must be a symneuron.Neuron"):
        sn.simulate("LIF", x_seq(3, 5))  # type: ignore[arg-type]


def test_v_init_on_other_device() -> None:
    v_init = torch.empty(5, device="meta")
    with pytest.raises(ValueError, match="v_init is on meta but x_seq is on cpu"):
        sn.simulate(LIF, x_seq(3, 5), v_init)
    with pytest.raises(ValueError, match="v_init is on cpu but x_seq is on meta"):
        sn.simulate(LIF, torch.empty(3, 5, device="meta"), rand(5))


def test_x_seq_on_other_device_than_backend() -> None:
    with pytest.raises(ValueError, match="backend='cpu' needs CPU tensors"):
        sn.simulate(LIF, torch.empty(3, 5, device="meta"), backend="cpu")


def test_param_on_other_device() -> None:
    with pytest.raises(ValueError, match="param 'tau' is on meta but x_seq is on cpu"):
        sn.simulate(LIF, x_seq(3, 5), params={"tau": torch.empty(5, device="meta")})


@pytest.mark.parametrize("shape", [(4,), (2, 5), (3, 1, 5), (5, 1)])
def test_param_does_not_broadcast(shape: tuple[int, ...]) -> None:
    tau = 2.0 + rand(*shape)
    match = rf"param 'tau' of shape \({shape[0]},.*does not broadcast"
    with pytest.raises(ValueError, match=match):
        sn.simulate(LIF, x_seq(3, 5), params={"tau": tau})


def test_v_init_does_not_broadcast() -> None:
    with pytest.raises(ValueError, match=r"v_init of shape \(4,\) does not broadcast"):
        sn.simulate(LIF, x_seq(3, 2, 5), rand(4))


def test_integer_param_tensor() -> None:
    with pytest.raises(TypeError, match="param 'tau' must be a floating-point tensor"):
        sn.simulate(LIF, x_seq(3, 5), params={"tau": torch.full((5,), 2, dtype=torch.int64)})


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_param_value(value: float) -> None:
    with pytest.raises(ValueError, match="param 'tau' must be finite"):
        sn.simulate(LIF, x_seq(3, 5), params={"tau": value})


def test_unknown_param() -> None:
    with pytest.raises(ValueError, match=r"Unknown parameter 'taus'; the neuron has \['tau'\]"):
        sn.simulate(LIF, x_seq(3, 5), params={"taus": 2.0})


def test_param_requires_grad_but_not_learnable() -> None:
    tau = (2.0 + rand(5)).requires_grad_(True)
    with pytest.raises(ValueError, match="param 'tau' requires grad but is not learnable"):
        sn.simulate(LIF, x_seq(3, 5), params={"tau": tau})


def test_unknown_backend() -> None:
    with pytest.raises(ValueError, match="backend must be one of .*got 'gpu'"):
        sn.simulate(LIF, x_seq(3, 5), backend="gpu")


def test_cuda_backend_on_cpu_tensors() -> None:
    with pytest.raises(ValueError, match="backend='cuda' needs CUDA tensors"):
        sn.simulate(LIF, x_seq(3, 5), backend="cuda")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", ["cpu"])  # "auto" runs the reference: test_issue25_binding
def test_half_on_cpu_backend(backend: str, dtype: torch.dtype) -> None:
    with pytest.raises(TypeError, match=f"backend='cpu' supports .*not {dtype}"):
        sn.simulate(LIF, x_seq(3, 5, dtype=dtype), backend=backend)


# -- NeuronLayer ----------------------------------------------------------------


@pytest.mark.parametrize("step_mode", ["x", "multi", "S"])
def test_layer_bad_step_mode(step_mode: str) -> None:
    with pytest.raises(ValueError, match=f"step_mode must be 'm' .* or 's' .*got '{step_mode}'"):
        sn.NeuronLayer(LIF, step_mode=step_mode)


def test_layer_bad_backend_and_neuron() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        sn.NeuronLayer(LIF, backend="gpu")
    with pytest.raises(TypeError, match="neuron must be a symneuron.Neuron"):
        sn.NeuronLayer(torch.nn.ReLU())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Unknown parameter 'taus'"):
        sn.NeuronLayer(LIF, params={"taus": 2.0})


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_layer_non_finite_param(value: float) -> None:
    """sn.simulate rejects params={'tau': nan}; NeuronLayer turns the float into a tensor
    buffer unchecked, so the layer silently produces NaN potentials."""
    with pytest.raises(ValueError, match="'tau' must be finite"):
        sn.NeuronLayer(LIF, params={"tau": value})


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_v_init_float(value: float) -> None:
    """params={'tau': nan} is rejected; a float v_init=nan should be too (not NaN outputs)."""
    with pytest.raises(ValueError, match="v_init must be finite"):
        sn.simulate(LIF, x_seq(3, 5), value)
