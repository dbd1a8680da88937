"""SymPy C99 printers for the kernel dialects.

One subclass of SymPy's :class:`~sympy.printing.c.C99CodePrinter`, configured by
the compute type through SymPy's own ``type_aliases`` (``expf`` and ``2.0F`` for
float, ``exp`` and ``2.0`` for double). Overrides only what kernels need:
inline single-line ``Piecewise``, small integer powers as products, and
numeric constants instead of ``M_PI``-style macros (NVRTC has no math.h).
"""

from __future__ import annotations

import sympy as sp
from sympy.codegen.ast import float32, float64, real
from sympy.printing.c import C99CodePrinter
from sympy.printing.precedence import precedence

__all__ = ["KernelPrinter"]

_ALIASES = {"float": float32, "double": float64}


class KernelPrinter(C99CodePrinter):
    """Prints one expression as C99/CUDA in ``float`` or ``double`` arithmetic."""

    printmethod = "_symneuron_code"

    def __init__(self, compute: str) -> None:
        if compute not in _ALIASES:
            raise ValueError(f"compute type must be one of {sorted(_ALIASES)}, got {compute!r}")
        super().__init__({"type_aliases": {real: _ALIASES[compute]}, "math_macros": {}})
        self.compute = compute

    def _print_Pow(self, expr: sp.Pow) -> str:
        base, exp = expr.args
        if exp.is_Integer and 1 <= abs(int(exp)) <= 4:
            factor = self.parenthesize(base, precedence(expr))
            product = "*".join([factor] * abs(int(exp)))
            if int(exp) > 0:
                return f"({product})" if int(exp) > 1 else product
            return f"({self._print(sp.Integer(1))}/({product}))"
        return str(super()._print_Pow(expr))

    def _print_Piecewise(self, expr: sp.Piecewise) -> str:
        if expr.args[-1].cond != sp.true:
            raise ValueError(f"Piecewise needs a final (expr, True) branch to be total: {expr}")
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
