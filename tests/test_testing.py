"""``symneuron.testing.assert_neuron_ok``: passes on the zoo, fails on a broken neuron.

The broken cases are made by monkeypatching a derivative (the finite-difference
oracle must catch it) or a compiled kernel's output (the float64 reference must
catch it), so each test can fail.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sympy as sp
import torch

import symneuron as sn
from symneuron.runtime import cpu, kernels
from symneuron.testing import assert_neuron_ok, available_backends

HAS_CC = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")

#: Zoo models whose sn.check fails today, and why (strict: remove once they pass).
#: Zoo models sn.check is known to fail on, with the reason (empty: none).
KNOWN_FAILURES: dict[str, str] = {}


def test_available_backends() -> None:
    here = available_backends()
    assert here[-1] == "torch"
    assert ("cpu" in here) == cpu.available()
    if not torch.cuda.is_available():
        assert "cuda" not in here


@pytest.mark.parametrize(
    "make",
    [
        lambda: sn.models.LIF(learnable=["tau"]),
        lambda: sn.models.Izhikevich(a=0.3, b=0.2),
        lambda: sn.models.ALIF(v_reset=0.0, learnable=["rho"]),
    ],
    ids=["LIF-learnable", "Izhikevich", "ALIF-hard"],
)
def test_passes_on_zoo_neurons(make: Callable[[], sn.Neuron]) -> None:
    reports = assert_neuron_ok(make())
    pairs = {(r.backend, r.dtype) for r in reports}
    expected = {(b, d) for b in available_backends() for d in ("float64", "float32")}
    if "cuda" in available_backends():
        expected |= {("cuda", "float16"), ("cuda", "bfloat16")}
    assert pairs == expected
    assert all(r.passed for r in reports)
    names = {result.name for result in reports[0].results}
    assert {"dH/dV vs finite diff", "grad x_seq vs reference"} <= names


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[n]))
        if n in KNOWN_FAILURES
        else n
        for n in sn.models.ZOO
        # FitzHugh-Nagumo's rk4 step takes ~18 s to check on 2 cores; test_zoo.py checks its
        # kernels against the reference and Hodgkin-Huxley's sn.check
        if n not in ("FitzHughNagumo", "HodgkinHuxley")
    ],
)
def test_passes_on_every_zoo_model(name: str) -> None:
    backend = "cpu" if cpu.available() else "torch"
    assert_neuron_ok(sn.models.ZOO[name](), backends=[backend], dtypes=["float64"])


def test_fails_on_a_wrong_derivative(monkeypatch: pytest.MonkeyPatch) -> None:
    derivatives = sn.Neuron.derivatives

    def wrong(self: sn.Neuron) -> dict[str, sp.Expr]:
        out = derivatives(self)
        out["dH/dtau"] = 1.01 * out["dH/dtau"]
        return out

    monkeypatch.setattr(sn.Neuron, "derivatives", wrong)
    with pytest.raises(AssertionError) as failure:
        assert_neuron_ok(sn.models.LIF(learnable=["tau"]), backends=["torch"])
    message = str(failure.value)
    assert message.startswith("LIF: 2 of 2 checks failed (passed: none)")
    assert "FAIL dH/dtau vs finite diff" in message
    assert "ok   dH/dV vs finite diff" in message


@HAS_CC
def test_fails_on_a_wrong_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backward kernel whose dL/dX is 1% off: the cpu checks fail, the torch ones pass."""
    backward = kernels.Program.backward

    def off_by_one_percent(self: kernels.Program, *args: Any, **kw: Any) -> Any:
        out = backward(self, *args, **kw)
        return out._replace(grad_x_seq=out.grad_x_seq * 1.01)

    monkeypatch.setattr(kernels.Program, "backward", off_by_one_percent)
    with pytest.raises(AssertionError) as failure:
        assert_neuron_ok(sn.models.LIF(), backends=["cpu", "torch"])
    message = str(failure.value)
    assert "2 of 4 checks failed (passed: torch/float64, torch/float32)" in message
    assert "check(LIF, backend=cpu, dtype=float64): FAIL" in message
    assert "FAIL grad x_seq vs reference" in message
    assert "ok   spike_seq vs reference" in message


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"backends": ["gpu"]}, ValueError, "unknown backend 'gpu'"),
        ({"dtypes": ["float8"]}, ValueError, "unknown dtype 'float8'"),
        ({"backends": ["torch"], "dtypes": ["bfloat16"]}, ValueError, "need the cuda backend"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        assert_neuron_ok(sn.models.LIF(), **kwargs)


@pytest.mark.skipif("cuda" in available_backends(), reason="checks the error without CUDA")
def test_unavailable_backend_is_named() -> None:
    with pytest.raises(ValueError, match=r"backend 'cuda' is not available here"):
        assert_neuron_ok(sn.models.LIF(), backends=["cuda"])


def test_not_a_neuron() -> None:
    with pytest.raises(TypeError, match="needs a symneuron.Neuron, got function"):
        assert_neuron_ok(sn.models.LIF)  # type: ignore[arg-type]


def test_half_dtypes_are_skipped_off_cuda() -> None:
    reports = assert_neuron_ok(sn.models.IF(), backends=["torch"], dtypes=["float32", "float16"])
    assert [(r.backend, r.dtype) for r in reports] == [("torch", "float32")]
