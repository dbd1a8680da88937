"""SymPy C99 printers for the kernel dialects.

One subclass of SymPy's :class:`~sympy.printing.c.C99CodePrinter`, configured by
the compute type through SymPy's own ``type_aliases`` (``expf`` and ``2.0F`` for
float, ``exp`` and ``2.0`` for double). Overrides only what kernels need:
inline single-line ``Piecewise``, small integer powers as products,
numeric constants instead of ``M_PI``-style macros (NVRTC has no math.h), and
integer arguments of math functions printed as literals of the compute type: CUDA
overloads ``sqrt``, ``pow``, ... for ``float`` and ``double``, so ``sqrt(2)`` in a
double kernel is ambiguous to NVRTC, where ``sqrt(2.0)`` is not.
"""

from __future__ import annotations

import sympy as sp
from sympy.codegen.ast import float32, float64, real
from sympy.printing.c import C99CodePrinter
from sympy.printing.precedence import precedence

from ..validate import check_total_piecewise

__all__ = ["KernelPrinter"]

_ALIASES = {"float": float32, "double": float64}

#: SymPy's C99 math functions (``exp``, ``atan2``, ``floor``, ...), each printed by
#: ``C99CodePrinter._print_math_func``, which SymPy binds by name; the subclass rebinds
#: them to its own, which types integer arguments
_MATH_FUNCS = [
    name
    for name in dir(C99CodePrinter)
    if name.startswith("_print_")
    and name != "_print_math_func"
    and getattr(C99CodePrinter, name) is C99CodePrinter._print_math_func
]


def _typed(arg: sp.Basic) -> sp.Basic:
    """An integer argument as a float literal, which prints in the compute type."""
    if not isinstance(arg, sp.Integer):
        return arg
    return sp.Float(arg, max(17, len(str(arg))))


class KernelPrinter(C99CodePrinter):
    """Prints one expression as C99/CUDA in ``float`` or ``double`` arithmetic."""

    printmethod = "_symneuron_code"

    def __init__(self, compute: str) -> None:
        if compute not in _ALIASES:
            raise ValueError(f"compute type must be one of {sorted(_ALIASES)}, got {compute!r}")
        super().__init__({"type_aliases": {real: _ALIASES[compute]}, "math_macros": {}})
        self.compute = compute

    def _print_math_func(self, expr: sp.Expr, nest: bool = False, known: str | None = None) -> str:
        args = [_typed(arg) for arg in expr.args]
        if args != list(expr.args):
            expr = expr.func(*args, evaluate=False)
        return str(super()._print_math_func(expr, nest=nest, known=known))

    def _print_Pow(self, expr: sp.Pow) -> str:
        base, exp = expr.args
        if exp.is_Integer and 1 <= abs(int(exp)) <= 4:
            factor = self.parenthesize(_typed(base), precedence(expr))
            product = "*".join([factor] * abs(int(exp)))
            if int(exp) > 0:
                return f"({product})" if int(exp) > 1 else product
            return f"({self._print(sp.Integer(1))}/({product}))"
        typed = sp.Pow(_typed(base), _typed(exp), evaluate=False)
        return str(super()._print_Pow(typed))

    def _print_Piecewise(self, expr: sp.Piecewise) -> str:
        check_total_piecewise(expr)
        text = self._print(expr.args[-1].expr)
        for branch in reversed(expr.args[:-1]):
            cond = self._print(branch.cond)
            text = f"(({cond}) ? ({self._print(branch.expr)}) : ({text}))"
        return text

    def _print_NumberSymbol(self, expr: sp.NumberSymbol) -> str:
        return str(self._print(sp.Float(expr.evalf(20), 20)))

    _print_Pi = _print_NumberSymbol
    _print_Exp1 = _print_NumberSymbol
    _print_EulerGamma = _print_NumberSymbol
    _print_GoldenRatio = _print_NumberSymbol
    _print_Catalan = _print_NumberSymbol

    def _print_sign(self, expr: sp.sign) -> str:
        arg = self._print(expr.args[0])
        one = self._print(sp.Float(1.0))
        return f"(({arg}) > 0 ? {one} : (({arg}) < 0 ? -{one} : 0))"


for _name in _MATH_FUNCS:
    setattr(KernelPrinter, _name, KernelPrinter._print_math_func)
