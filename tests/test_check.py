"""``sn.check`` passes on correct neurons and fails on a deliberately wrong derivative."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import sympy as sp
import torch

import symneuron as sn
import symneuron.derivation
from symneuron.check import CheckResult

_fresh = itertools.count()


def fresh_name(base: str) -> str:
    """A name no other test uses: the op registry shares kernels between equal definitions."""
    return f"{base}_{next(_fresh)}_{id(object())}"


def entry(report: sn.CheckReport, name: str) -> CheckResult:
    matches = [r for r in report.results if r.name == name]
    assert len(matches) == 1, f"no single entry {name!r} in\n{report}"
    return matches[0]


def expected_entries(neuron: sn.Neuron) -> list[str]:
    partials = ["dH/dV", "dH/dX", *[f"dH/d{n}" for n in neuron.learnable]]
    grads = ["x_seq", "v_init", *neuron.learnable]
    return (
        [f"{p} vs finite diff" for p in partials]
        + ["surrogate' vs finite diff", "reference fires (x scaled 1x)"]
        + ["spike_seq vs reference", "v_seq vs reference"]
        + [f"grad {g} vs reference" for g in grads]
    )


@pytest.mark.parametrize("reset", [0.0, None], ids=["hard", "soft"])
@pytest.mark.parametrize("model", list(sn.models.DISCRETE))
def test_zoo_passes(model: str, reset: float | None) -> None:
    neuron = sn.models.DISCRETE[model](v_reset=reset)
    report = sn.check(neuron, backend="cpu", dtype=torch.float64, T=6, shape=(3, 8), seed=11)
    assert report.passed, str(report)
    assert bool(report)
    assert [r.name for r in report.results] == expected_entries(neuron)
    text = str(report)
    assert text.splitlines()[0].endswith("PASS")
    for name in expected_entries(neuron):
        assert name in text
    assert "FAIL" not in text


def test_zoo_float32_passes() -> None:
    neuron = sn.models.PLIF(v_reset=None, learnable=["w"])
    report = sn.check(neuron, backend="cpu", dtype=torch.float32, T=6, shape=(3, 8), seed=3)
    assert report.passed, str(report)
    assert report.dtype == "float32"
    assert entry(report, "grad w vs reference").tolerance == pytest.approx(2e-4)


def test_lif_learnable_tau_passes() -> None:
    report = sn.check(
        sn.models.LIF(learnable=["tau"], detach_reset=True),
        backend="cpu",
        T=6,
        shape=(3, 8),
        seed=5,
    )
    assert report.passed, str(report)
    assert "grad tau vs reference" in str(report)


def test_wrong_charge_derivative_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    true_partials = symneuron.derivation.partials

    def off_by_one_percent(neuron: sn.Neuron) -> dict[str, sp.Expr]:
        found = true_partials(neuron)
        return {**found, "dH/dV": found["dH/dV"] * sp.Float(1.01)}

    monkeypatch.setattr(symneuron.derivation, "partials", off_by_one_percent)
    # the patch is invisible to the definition's key: keep its sources out of the disk cache
    monkeypatch.setenv("SYMNEURON_CACHE", str(tmp_path))
    neuron = sn.models.LIF(learnable=["tau"], name=fresh_name("WrongLIF"))
    report = sn.check(neuron, backend="cpu", T=6, shape=(3, 8), seed=7)
    assert not report.passed
    assert not bool(report)
    failed = {r.name for r in report.failures()}
    assert "dH/dV vs finite diff" in failed
    assert {"grad x_seq vs reference", "grad v_init vs reference"} <= failed
    # Only the backward is wrong: the right partials and the forward still pass.
    assert {
        "dH/dX vs finite diff",
        "dH/dtau vs finite diff",
        "surrogate' vs finite diff",
        "spike_seq vs reference",
        "v_seq vs reference",
    }.isdisjoint(failed)
    text = str(report)
    assert text.splitlines()[0].endswith("FAIL")
    assert any(line.lstrip().startswith("FAIL dH/dV vs finite diff") for line in text.splitlines())
    assert entry(report, "dH/dV vs finite diff").error > 1e-3


def test_wrong_surrogate_derivative_fails() -> None:
    surrogate = sn.surrogate.Sigmoid(alpha=3.0)
    object.__setattr__(surrogate, "_derivative", surrogate.derivative() * sp.Float(1.05))
    neuron = sn.models.QIF(surrogate=surrogate, name=fresh_name("WrongSG"))
    report = sn.check(neuron, backend="cpu", T=6, shape=(3, 8), seed=9)
    failed = {r.name for r in report.failures()}
    assert "surrogate' vs finite diff" in failed
    assert "grad x_seq vs reference" in failed
    assert {"dH/dV vs finite diff", "spike_seq vs reference"}.isdisjoint(failed)


def test_user_defined_tanh_leak_passes() -> None:
    tau, k = sp.symbols("tau k", positive=True)
    tanh_lif = sn.Neuron(
        sn.V + (sn.X - k * sp.tanh(sn.V)) / tau,
        params={tau: 2.0, k: 0.8},
        learnable=[tau, k],
        v_reset=None,
        surrogate=sn.surrogate.SoftSign(alpha=2.0),
        name="TanhLIF",
    )
    for dtype in (torch.float64, torch.float32):
        report = sn.check(tanh_lif, backend="cpu", dtype=dtype, T=6, shape=(3, 8), seed=13)
        assert report.passed, str(report)
        assert [r.name for r in report.results] == expected_entries(tanh_lif)


@pytest.mark.parametrize("surrogate", ["ATan", "Erf"])
def test_surrogates_with_constants_pass(surrogate: str) -> None:
    """σ' of ATan (π²) and Erf (√π) holds numeric powers and roots; the reference printer
    turns them into torch.pow(3.14..., 2) / torch.sqrt(3.14...), which torch rejects."""
    neuron = sn.models.LIF(surrogate=getattr(sn.surrogate, surrogate)())
    report = sn.check(neuron, backend="cpu", T=6, shape=(3, 8), seed=17)
    assert report.passed, str(report)


# -- arguments, NaN and infinities (issue 25, items 11 and 14) -------------------------


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"T": 0}, "T (the number of steps"),
        ({"points": 0}, "points"),
        ({"shape": ()}, "shape is one step's shape"),
        ({"shape": (4, 0)}, "each size of shape"),
        ({"tolerance": -1}, "tolerance"),
        ({"tolerance": float("nan")}, "tolerance"),
    ],
)
def test_arguments_check_cannot_run_with_are_refused(
    arguments: dict[str, object], named: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(named)) as caught:
        sn.check(sn.models.LIF(), backend="cpu", seed=0, **arguments)  # type: ignore[arg-type]
    assert "x_seq" not in str(caught.value)


def test_table_columns_line_up_with_the_reference_row() -> None:
    report = sn.check(sn.models.PLIF(), backend="cpu", T=6, shape=(3, 8), seed=0)
    rows = str(report).splitlines()[1:]
    assert any("reference fires" in row for row in rows)
    assert len({row.index(" error ") for row in rows}) == 1, "\n".join(rows)


def test_nan_reference_names_the_parameters() -> None:
    a = sp.Symbol("a")  # no assumption: a = 0 is a legal value that divides by zero
    neuron = sn.Neuron(sn.V + (sn.X - sn.V) / a, params={a: 0.0}, name=fresh_name("Div"))
    report = sn.check(neuron, backend="cpu", T=4, shape=(3,), seed=0)
    failed = [r.name for r in report.failures()]
    assert any("reference V is NaN" in name and "a=0.0" in name for name in failed), report


def test_16_bit_rounding_keeps_infinities_and_the_gradient() -> None:
    from symneuron.check import _rel_error
    from symneuron.reference import _round_through

    inf = float("inf")
    h = torch.tensor([inf, -inf, 7e4, -7e4, 1.0001], dtype=torch.float64, requires_grad=True)
    rounded = _round_through(h, torch.float16)
    assert rounded.tolist() == [inf, -inf, inf, -inf, 1.0]  # float16's max is 65504
    rounded.sum().backward()
    assert h.grad is not None and h.grad.tolist() == [1.0] * 5
    kernel = rounded.detach().half().double()  # what a float16 kernel stores
    assert _rel_error(kernel, rounded.detach()) == 0.0
    assert _rel_error(kernel.flip(0), rounded.detach()) == inf


def test_cli_names_a_parameter_the_model_refuses(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from symneuron.cli import main

    def refusing(**kwargs: object) -> sn.Neuron:
        raise ValueError(f"parameter tau must be positive (its symbol's assumption), got {kwargs}")

    monkeypatch.setitem(sn.models.ZOO, "LIF", refusing)
    assert main(["check", "LIF(tau=0.0)"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("symneuron check: error: LIF(tau=0.0): parameter tau must be positive")
    assert "Traceback" not in err


def test_cli_check_names_the_parameters_of_a_nan_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from symneuron.cli import main

    (tmp_path / "mine.py").write_text(
        "import sympy as sp, symneuron as sn\n"
        "a = sp.Symbol('a')\n"
        "neuron = sn.Neuron(sn.V + (sn.X - sn.V) / a, params={a: 0.0}, name='DivByA')\n"
    )
    assert main(["check", f"{tmp_path / 'mine.py'}:neuron", "--backend", "torch"]) == 1
    assert "reference V is NaN from step 0; parameters a=0.0" in capsys.readouterr().out
