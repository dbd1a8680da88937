"""Generated source: golden files for LIF, and every CUDA variant compiles with NVRTC.

Regenerate the golden files after an intended change with
``SYMNEURON_UPDATE_GOLDEN=1 python -m pytest tests/test_codegen.py`` and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sympy as sp

import symneuron as sn
from symneuron.codegen.printer import KernelPrinter

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("SYMNEURON_UPDATE_GOLDEN") == "1"
x = sp.Symbol("x", real=True)


@pytest.mark.parametrize(
    ("backend", "dtype", "reset"),
    [("cuda", "float32", 0.0), ("cuda", "bfloat16", None), ("cpu", "float64", 0.0)],
)
def test_lif_source_matches_golden(backend: str, dtype: str, reset: float | None) -> None:
    neuron = sn.models.LIF(v_reset=reset, learnable=["tau"], surrogate=sn.surrogate.ATan())
    source = neuron.source(backend, dtype)
    path = GOLDEN / f"lif_{backend}_{dtype}_{'hard' if reset is not None else 'soft'}.txt"
    if UPDATE:
        path.write_text(source)
    assert path.exists(), f"missing golden file {path}; run with SYMNEURON_UPDATE_GOLDEN=1"
    assert source == path.read_text(), f"generated source changed; review and regenerate {path}"


@pytest.mark.parametrize(
    ("compute", "expr", "expected"),
    [
        ("float", sp.exp(-x / 2) * x**2, "(x*x)*expf(-1.0F/2.0F*x)"),
        ("double", sp.exp(-x / 2) * x**2, "(x*x)*exp(-1.0/2.0*x)"),
        ("float", 1 / x**3, "(1/(x*x*x))"),
        ("float", sp.pi * x, "3.14159265F*x"),
        ("double", sp.Piecewise((0, x < -1), (x, True)), "((x < -1) ? (0) : (x))"),
        ("double", x ** sp.Rational(1, 2), "sqrt(x)"),
    ],
)
def test_printer_golden_strings(compute: str, expr: sp.Expr, expected: str) -> None:
    assert KernelPrinter(compute).doprint(expr) == expected


#: The one variant the quick run (``-m "not slow"``) compiles: each takes seconds.
QUICK_VARIANT = "LIF-hard-attached"


#: The models compiled in every reset x detach_reset variant (one without extra states,
#: one whose states reset at a spike); the others compile in ``QUICK_VARIANT``'s, since
#: the variants print the reset the same way for every model (NVRTC takes seconds each).
ALL_VARIANTS = ("LIF", "Izhikevich")


def _variants() -> list[pytest.param]:
    """Every model in the hard-attached variant and :data:`ALL_VARIANTS` in every reset x
    detach_reset one, all but ``QUICK_VARIANT`` marked ``slow``."""
    out = []
    for name in [*sn.models.DISCRETE, *sn.models.STATEFUL]:
        resets = ("hard", "soft") if name in ALL_VARIANTS else ("hard",)
        for reset in resets:
            for detach in (False, True) if name in ALL_VARIANTS else (False,):
                kw: dict[str, object] = {"detach_reset": detach}
                if reset == "soft":
                    kw["v_reset"] = None
                label = f"{name}-{reset}-{'detached' if detach else 'attached'}"
                marks = [] if label == QUICK_VARIANT else [pytest.mark.slow]
                out.append(pytest.param(name, kw, marks=marks, id=label))
    return out


@pytest.mark.parametrize(("name", "kw"), _variants())
def test_every_cuda_variant_compiles_with_nvrtc(name: str, kw: dict[str, object]) -> None:
    nvrtc = pytest.importorskip("symneuron.runtime.nvrtc")
    if not nvrtc.nvrtc_available():
        if os.environ.get("CI"):
            pytest.fail("CI must compile every CUDA variant: install 'symneuron[cuda]' (NVRTC)")
        pytest.skip("NVRTC not installed (pip install 'symneuron[cuda]')")
    neuron = {**sn.models.DISCRETE, **sn.models.STATEFUL}[name](**kw)
    for dtype in ("float32", "float64", "float16", "bfloat16"):
        ptx = nvrtc.compile_to_ptx(neuron.source("cuda", dtype), name=f"{name}_{dtype}.cu")
        # 4 forward + 3 backward variants, each with one neuron per thread and with K lanes
        assert ptx.count(".entry") == 14, f"{name} {dtype}: expected 2 x (4 forward + 3 backward)"


def test_c_source_rejects_half_types() -> None:
    with pytest.raises(TypeError, match="cpu backend supports"):
        sn.models.LIF().source("cpu", "float16")


@pytest.mark.parametrize(
    ("model", "divisors"),
    [("IF", []), ("LIF", ["p0_tau"]), ("Izhikevich", ["p0_tau", "p4_tau_w"])],
)
def test_division_by_a_param_is_a_product_with_its_reciprocal(
    model: str, divisors: list[str]
) -> None:
    """Each lane computes 1/p once for the params an expression divides by; no step divides
    by a param (the quotient rounds twice: documented in docs/architecture.md)."""
    from symneuron import derivation
    from symneuron.codegen import render_source
    from symneuron.codegen.steps import _divisors

    spec = derivation.derive(getattr(sn.models, model)())
    assert [str(p) for p in _divisors(spec)] == divisors
    for backend, dtype in [("cuda", "bfloat16"), ("cpu", "float64")]:
        lines = render_source(spec, backend, dtype).splitlines()
        source = "\n".join(line for line in lines if not line.lstrip().startswith("//"))
        for p in divisors:
            assert f"{p}_rcp_l[j] = " in source
            assert f"/{p}" not in source.replace(f"/{p}_l[j]", "")


@pytest.mark.parametrize("backend", ["cuda", "cpu"])
@pytest.mark.parametrize("name", ["LIF", "ALIF"])
def test_recurrent_source_matches_golden(name: str, backend: str) -> None:
    """The recurrent kernels (the neuron's passes with the connection's stage), float32.
    One source serves every delay: the delay is a kernel argument (the ring's D + 1
    slots), so this golden file is the kernels of delay 1 and of delay 2 alike
    (:func:`test_one_recurrent_kernel_serves_every_delay`)."""
    neuron = getattr(sn.models, name)(learnable=["tau"], surrogate=sn.surrogate.ATan())
    source = neuron.source(backend, "float32", recurrent=True)
    _golden(f"recurrent_{name.lower()}_{backend}_float32.txt", source)


@pytest.mark.parametrize("backend", ["cuda", "cpu"], ids=lambda b: f"{b}-source")
def test_noisy_source_matches_golden(backend: str) -> None:
    source = sn.models.NoisyLIF(learnable=["sigma"]).source(backend, "float32")
    _golden(f"noisy_lif_{backend}_float32.txt", source)


def _golden(name: str, source: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(source)
    assert path.exists(), f"missing golden file {path}; run with SYMNEURON_UPDATE_GOLDEN=1"
    assert source == path.read_text(), f"generated source changed; review and regenerate {path}"


def test_one_recurrent_kernel_serves_every_delay() -> None:
    """Layers of delay 1 and 2 launch the same compiled kernels (no variant per delay)."""
    import torch

    from symneuron.runtime.kernels import program

    neuron = sn.models.ALIF(learnable=["tau"])
    prog = program(neuron, "cpu")
    x = torch.rand(5, 2, 6, requires_grad=True)
    sn.RecurrentNeuronLayer(neuron, 6, backend="cpu", delay=1)(x).sum().backward()
    launchers = dict(prog._launchers)
    sn.RecurrentNeuronLayer(neuron, 6, backend="cpu", delay=2)(x).sum().backward()
    assert prog._launchers == launchers and len(launchers) >= 2
