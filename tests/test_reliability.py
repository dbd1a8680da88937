"""Reliability: missing or broken compilers, one NaN behaviour on every backend, an opt-in
finiteness check, constants and assumptions in definitions, empty inputs, bad arguments
and deep copies. (The kernel cache's damage, concurrency and bounds: test_cache.py.)"""

from __future__ import annotations

import copy
import importlib
import warnings
from collections.abc import Iterator

import pytest
import sympy as sp
import torch
from conftest import generator

import symneuron as sn
from symneuron.memo import BoundedTable
from symneuron.reference import spike
from symneuron.runtime import cpu
from symneuron.validate import NonFiniteError

simulate_module = importlib.import_module("symneuron.simulate")
needs_cc = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")
BACKENDS = [
    pytest.param("cpu", marks=needs_cc),
    "torch",
    pytest.param("cuda", marks=pytest.mark.cuda),
]
NAN, INF = float("nan"), float("inf")


def _device(backend: str) -> str:
    return "cuda" if backend == "cuda" else "cpu"


# -- no compiler, or a broken one ----------------------------------------------------


@pytest.fixture
def compiler_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Change $CC / $PATH for one test: the compiler is looked up again before and after."""
    cpu._command.cache_clear()
    cpu._probe.cache_clear()
    monkeypatch.setattr(simulate_module, "_WARNED", BoundedTable(16))
    yield monkeypatch
    monkeypatch.undo()
    cpu._command.cache_clear()
    cpu._probe.cache_clear()


@needs_cc
@pytest.mark.parametrize("how", ["none on PATH", "CC=false"])
def test_missing_or_broken_compiler(how: str, compiler_env: pytest.MonkeyPatch, tmp_path) -> None:
    if how == "none on PATH":
        compiler_env.delenv("CC", raising=False)
        compiler_env.setenv("PATH", str(tmp_path))
    else:
        compiler_env.setenv("CC", "false")
    compiler_env.setenv("SYMNEURON_CACHE", str(tmp_path / "cold"))  # nothing cached
    neuron = sn.Neuron(sn.V * 0.7 + sn.X, name="NoCompiler")
    x = torch.rand(5, 3, generator=generator(1), dtype=torch.float64) * 2
    with pytest.raises(RuntimeError, match=r"C compiler.*(gcc or clang).*CC.*backend='torch'"):
        sn.simulate(neuron, x, backend="cpu")
    if how == "CC=false":
        with pytest.raises(RuntimeError, match="exit status 1, no output"):
            sn.simulate(neuron, x, backend="cpu")
    with pytest.warns(RuntimeWarning, match="backend='auto' runs the .*torch reference") as got:
        auto = sn.simulate(neuron, x)
    assert len(got) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        sn.simulate(neuron, x)
    for a, b in zip(auto, sn.simulate(neuron, x, backend="torch"), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@needs_cc
def test_cached_library_loads_without_a_compiler(compiler_env: pytest.MonkeyPatch) -> None:
    neuron = sn.Neuron(sn.V * 0.6 + sn.X, name="CachedNoCompiler")
    x = torch.rand(5, 3, generator=generator(2), dtype=torch.float64) * 2
    warm = sn.simulate(neuron, x, backend="cpu")
    sn.runtime.kernels._PROGRAMS.clear()
    cpu._LIBRARIES.clear()
    compiler_env.setenv("CC", "false")
    cpu._command.cache_clear()
    cpu._probe.cache_clear()
    for a, b in zip(sn.simulate(neuron, x, backend="cpu"), warm, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# -- one NaN behaviour -----------------------------------------------------------------


def test_reference_spike_is_exactly_zero_or_one() -> None:
    u = torch.tensor([NAN, INF, -INF, 0.0, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    s = spike(u, sn.surrogate.Sigmoid(alpha=4.0))
    assert s.tolist() == [0, 1, 0, 1, 0, 1]
    s.sum().backward()
    assert u.grad is not None and u.grad[0].isnan() and u.grad[1:3].eq(0).all()


def _nan_inputs() -> torch.Tensor:
    x = torch.rand(7, 6, generator=generator(3), dtype=torch.float64) * 2
    x[2, 1], x[3, 3], x[1, 4], x[5, 0] = NAN, INF, -INF, 1e308
    return x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reset", [0.0, None])
def test_nan_and_inf_give_the_same_results_on_every_backend(backend: str, reset) -> None:
    neuron = sn.models.LIF(learnable=["tau"], v_reset=reset)

    def run(name: str) -> list[torch.Tensor]:
        x = _nan_inputs().to(_device(name)).requires_grad_()
        tau = torch.tensor(2.0, dtype=torch.float64, device=x.device, requires_grad=True)
        s, v = sn.simulate(neuron, x, params={"tau": tau}, backend=name)
        (s * 1.5 + v).sum().backward()
        return [t.cpu() for t in (s.detach(), v.detach(), x.grad, tau.grad)]  # type: ignore[union-attr]

    got, want = run(backend), run("torch")
    assert bool(((got[0] == 0) | (got[0] == 1)).all())  # spikes stay 0/1 through NaN
    assert got[0][2, 1] == 0 and got[0][3, 3] == 1 and got[1][2:, 1].isnan().all()
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, equal_nan=True)


@needs_cc
def test_hard_reset_writes_positive_zero_as_the_reference() -> None:
    neuron = sn.Neuron(sn.V + sn.X / 2 + 1 / sn.V, name="OverV")
    x = torch.full((3, 4), 1.0, dtype=torch.float64)
    cpu_v = sn.simulate(neuron, x, v_init=0.5, backend="cpu")[1]
    ref_v = sn.simulate(neuron, x, v_init=0.5, backend="torch")[1]
    assert not torch.signbit(ref_v[0]).any() and (ref_v[0] == 0).all()  # fired, reset to +0
    assert not torch.signbit(cpu_v[0]).any()
    torch.testing.assert_close(cpu_v, ref_v, equal_nan=True)


# -- check_finite ----------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("store", [True, False])
def test_check_finite_names_the_first_step_and_neuron(backend: str, store: bool) -> None:
    eif = sn.models.DISCRETE["EIF"](v_reset=None)
    x = torch.full((30, 2, 3), 0.5, dtype=torch.float64, device=_device(backend))
    x[:, 1, 2] = 4.0  # one neuron runs away
    v_ref = sn.simulate(eif, x.cpu(), backend="torch")[1]
    bad = (~torch.isfinite(v_ref)).reshape(30, -1).nonzero()
    assert len(bad) and bad[0].tolist()[1] == 5  # the oracle: flat index 5 = (1, 2)
    with pytest.raises(
        NonFiniteError, match=rf"V became .* at step {int(bad[0, 0])} in neuron \(1, 2\)"
    ) as err:
        sn.simulate(eif, x, backend=backend, check_finite=True, store_v_seq=store)
    assert err.value.step == int(bad[0, 0]) and err.value.index == (1, 2)
    calm = x.clone()
    calm[:, 1, 2] = 0.5
    checked = sn.simulate(eif, calm, backend=backend, check_finite=True, store_v_seq=store)
    plain = sn.simulate(eif, calm, backend=backend, store_v_seq=store)
    assert checked[1].shape == plain[1].shape == (30 if store else 1, 2, 3)
    for a, b in zip(checked, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_layer_check_finite_flag() -> None:
    layer = sn.NeuronLayer(
        sn.models.DISCRETE["QIF"](v_reset=None), backend="torch", check_finite=True
    )
    layer(torch.full((3, 4), 0.5))
    with pytest.raises(NonFiniteError, match="at step"):
        layer(torch.full((40, 4), 30.0))


# -- definitions: constants, Max/Min, cancelling V, assumptions -------------------------


def test_constants_beyond_the_dtype() -> None:
    with pytest.raises(ValueError, match="beyond float64's range"):
        sn.Neuron(sn.V + sn.X + sp.Float("1e300") * sp.Float("1e300"))
    big = sn.Neuron(sn.V / 2 + sn.X + sp.Float("1e39") * sp.exp(-(sn.V**2) - 100), name="Big")
    with pytest.warns(RuntimeWarning, match=r"1\.00000e\+39.*float32"):
        sn.simulate(big, torch.rand(3, 2), backend="torch")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sn.simulate(big, torch.rand(3, 2, dtype=torch.float64), backend="torch")


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_and_min_with_numbers(backend: str) -> None:
    b = sp.Symbol("b")
    neuron = sn.Neuron(sn.V / 2 + sn.X / 2 + sp.Max(2, b) - sp.Min(b, 3), params={b: 1.0})
    x = torch.rand(1, 5, generator=generator(4), dtype=torch.float64).to(_device(backend))
    v0 = torch.linspace(-4, 1, 5, dtype=torch.float64, device=x.device)
    for value, numbers in [(1.5, 2 - 1.5), (2.5, 2.5 - 2.5), (4.0, 4 - 3)]:
        h = v0 / 2 + x[0] / 2 + numbers  # the oracle, by hand
        got = sn.simulate(neuron, x, v_init=v0, params={"b": value}, backend=backend)[1][0]
        torch.testing.assert_close(got, torch.where(h >= 1, torch.zeros_like(h), h))
    assert sn.check(neuron, backend="torch" if backend == "torch" else "cpu").passed


def test_charge_whose_v_cancels_is_rejected() -> None:
    with pytest.raises(ValueError, match="V cancels"):
        sn.Neuron(sp.Symbol("V") / (2 * sn.V) + sn.X)


def test_assumptions_on_v_warn() -> None:
    positive_v = sp.Symbol("V", positive=True)
    with pytest.warns(UserWarning, match=r"assumptions \{'V': \['positive'\]\}"):
        sn.Neuron(sp.Abs(positive_v) - 0.5 + sn.X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a positive param is a legitimate domain
        sn.Neuron(sn.V * sp.exp(-1 / sp.Symbol("tau", positive=True)) + sn.X, params={"tau": 2.0})


# -- arguments and state ---------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(0, 2, 3), (3, 0, 4), (3, 0)])
@pytest.mark.parametrize("store", [True, False])
def test_empty_inputs_give_empty_outputs(backend: str, shape: tuple[int, ...], store: bool) -> None:
    x = torch.rand(shape, dtype=torch.float64, device=_device(backend), requires_grad=True)
    v0 = torch.full(shape[1:], 0.25, dtype=torch.float64, device=x.device, requires_grad=True)
    s, v, states = sn.simulate(sn.models.AdLIF(), x, v_init=v0, backend=backend, store_v_seq=store)
    rows = shape[0] if store else 1
    assert s.shape == shape and v.shape == (rows, *shape[1:])
    assert all(w.shape == v.shape for w in states.values())
    if not store and shape[0] == 0:
        assert torch.equal(v[0], v0.detach())  # no step: V is the initial V
    (s.sum() + v.sum()).backward()
    assert x.grad is not None and x.grad.shape == shape


@pytest.mark.parametrize("make", ["simulate", "layer", "neuron"])
def test_params_as_a_list_is_a_type_error(make: str) -> None:
    pairs = [("tau", 3.0)]
    with pytest.raises(TypeError, match="params must be a mapping"):
        if make == "simulate":
            sn.simulate(sn.models.LIF(), torch.rand(2, 3), params=pairs)  # type: ignore[arg-type]
        elif make == "layer":
            sn.NeuronLayer(sn.models.LIF(), params=pairs)  # type: ignore[arg-type]
        else:
            sn.Neuron(sn.V + sn.X, params=pairs)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", BACKENDS)
def test_deepcopy_after_a_forward_with_grad(backend: str) -> None:
    layer = sn.NeuronLayer(sn.models.AdLIF(), backend=backend)
    layer.to(_device(backend))
    x = torch.rand(5, 4, generator=generator(5), device="cpu").to(_device(backend)) * 2
    layer(x).sum().backward()
    layer(x)  # the stored V and states are inside an autograd graph now
    twin = copy.deepcopy(layer)
    assert twin.v is not None and layer.v is not None and twin.v.grad_fn is None
    assert torch.equal(twin.v, layer.v.detach()) and twin.alpha is not layer.alpha
    assert set(twin.states) == set(layer.states)
    torch.testing.assert_close(twin(x), layer(x).detach(), rtol=0, atol=0)
