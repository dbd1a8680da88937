"""Numeric literals handed to math functions print in the kernel's compute type.

CUDA overloads ``sqrt``, ``pow``, ``fmax``, ... for ``float`` and ``double``, so an
integer argument (``sqrt(2)``) is ambiguous to NVRTC in a double kernel. Every
function the printer knows is printed here with integer and rational arguments, and
compiled with NVRTC in the compute type of each of the four CUDA dtypes; the slow
test compiles every zoo and noisy model, and an Ornstein-Uhlenbeck neuron written
``sigma*sqrt(2/tau)*xi``, in all four.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import sympy as sp
from conftest import nvrtc_or_skip
from sympy.codegen import cfunctions

import symneuron as sn
from symneuron.codegen import render_source
from symneuron.codegen.printer import KernelPrinter
from symneuron.dtypes import DTYPES
from symneuron.signature import BACKWARD, FORWARD

x = sp.Symbol("x", real=True)
CUDA_DTYPES = ("float32", "float64", "float16", "bfloat16")
#: the printer's own functions, beside SymPy's known C99 ones
EXTRA_FUNCTIONS: dict[str, Callable[..., sp.Expr]] = {
    "Pow": sp.Pow,
    "Mod": sp.Mod,
    "sign": sp.sign,
}
#: an integer literal as the whole of a call's argument: ``f(2``, ``, 2)``, ``, -2,``
_BARE_INTEGER_ARG = re.compile(r"(?:\w\(|, )-?\d+(?=[,)])")


def _function(name: str) -> Callable[..., sp.Expr]:
    if name in EXTRA_FUNCTIONS:
        return EXTRA_FUNCTIONS[name]
    if name == "sqrt":
        return sp.sqrt
    found = getattr(sp, name, None) or getattr(cfunctions, name)
    return found  # type: ignore[no-any-return]


#: functions of more than one argument (Max and Min take any number; two here)
ARITY = {"atan2": 2, "hypot": 2, "fma": 3, "Max": 2, "Min": 2, "Mod": 2, "Pow": 2}


def _call(name: str, args: list[sp.Expr]) -> sp.Expr:
    func = _function(name)
    if name == "sqrt":
        return sp.Pow(args[0], sp.Rational(1, 2), evaluate=False)
    return func(*args, evaluate=False)


def function_names() -> list[str]:
    """Every function the kernel printer prints: SymPy's C99 table and the printer's own."""
    return sorted({*KernelPrinter("float").known_functions, *EXTRA_FUNCTIONS})


def literal_cases(name: str) -> list[sp.Expr]:
    """``name`` called with integer, negative integer and rational arguments, each
    argument in turn a literal while the others are ``x``."""
    arity = ARITY.get(name, 1)
    out = []
    for literal in (sp.Integer(2), sp.Integer(-3), sp.Rational(1, 3)):
        for i in range(arity):
            args = [literal if j == i else x for j in range(arity)]
            out.append(_call(name, args))
        out.append(_call(name, [literal] * arity))
    return out


@pytest.mark.parametrize("compute", ["float", "double"])
@pytest.mark.parametrize("name", function_names())
def test_no_integer_literal_is_a_math_function_argument(compute: str, name: str) -> None:
    printer = KernelPrinter(compute)
    for expr in literal_cases(name):
        text = printer.doprint(expr)
        assert not _BARE_INTEGER_ARG.search(text), f"{expr} printed {text!r} in {compute}"


@pytest.mark.parametrize(
    ("compute", "expr", "expected"),
    [
        ("double", sp.sqrt(2) * x, "sqrt(2.0)*x"),
        ("float", sp.sqrt(2) * x, "sqrtf(2.0F)*x"),
        ("double", sp.Max(x, 1), "fmax(1.0, x)"),
        ("float", sp.Pow(2, x), "powf(2.0F, x)"),
        ("double", sp.atan2(-3, x), "atan2(-3.0, x)"),
    ],
)
def test_typed_literal_golden_strings(compute: str, expr: sp.Expr, expected: str) -> None:
    assert KernelPrinter(compute).doprint(expr) == expected


@pytest.mark.parametrize("dtype", CUDA_DTYPES)
def test_every_function_with_literal_arguments_compiles_with_nvrtc(dtype: str) -> None:
    nvrtc = nvrtc_or_skip()
    compute = DTYPES["cuda"][dtype].compute
    printer = KernelPrinter(compute)
    lines = [
        f"    out[{i}] = {printer.doprint(expr)};"
        for i, expr in enumerate(e for name in function_names() for e in literal_cases(name))
    ]
    source = "\n".join(
        [
            f'extern "C" __global__ void literals({compute}* out, {compute} x) {{',
            *lines,
            "}",
        ]
    )
    ptx = nvrtc.compile_to_ptx(source, name=f"literals_{dtype}.cu")
    assert ".entry literals" in ptx


def ornstein_uhlenbeck() -> sn.Neuron:
    """The canonical OU form, ``sqrt(2/tau)`` in its noise term."""
    tau = sp.Symbol("tau", positive=True)
    sigma = sp.Symbol("sigma", positive=True)
    dv = (-sn.V + sn.X) / tau + sigma * sp.sqrt(2 / tau) * sn.xi
    params = {tau: 10.0, sigma: 0.5}
    return sn.Neuron.from_ode(dv, dt=1.0, method="euler", params=params, name="OU")


def test_ornstein_uhlenbeck_compiles_in_float64() -> None:
    nvrtc = nvrtc_or_skip()
    source = ornstein_uhlenbeck().source("cuda", "float64")
    assert ".entry" in nvrtc.compile_to_ptx(source, name="ou_float64.cu")


MODELS: dict[str, Callable[[], sn.Neuron]] = {
    **sn.models.ZOO,
    **sn.models.NOISY,
    "OU": ornstein_uhlenbeck,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_compiles_in_every_dtype(name: str) -> None:
    nvrtc = nvrtc_or_skip()
    neuron = MODELS[name]()
    spec = neuron.spec()
    # one training forward and one backward (1 lane): every expression of the model is in
    # them, its other variants differ in loads and stores only (test_codegen compiles those)
    variants = (FORWARD.variant(store_h=True, v_mode="seq"), BACKWARD.variant(grad_v_mode="seq"))
    for dtype in CUDA_DTYPES:
        for variant in variants:
            source = render_source(spec, "cuda", dtype, variant)
            ptx = nvrtc.compile_to_ptx(source, name=f"{name}_{dtype}_{variant.base}.cu")
            assert ".entry" in ptx, f"{name} {dtype} {variant.base}: no kernel in the PTX"
