"""Surrogate spike functions as SymPy primitives.

The forward pass always fires with the Heaviside step Θ(u) (Θ(0) = 1). The
backward pass replaces dΘ/du with σ'(u), the derivative of a smooth
*primitive* σ(u). Each surrogate here is only its primitive; σ' is derived by
SymPy and never written by hand. Gradient formulas and defaults follow
SpikingJelly's ``activation_based.surrogate`` module, so trained results match.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import sympy as sp

__all__ = [
    "Surrogate",
    "Sigmoid",
    "ATan",
    "PiecewiseQuadratic",
    "SoftSign",
    "Erf",
    "PiecewiseLeakyReLU",
    "QPseudoSpike",
    "SuperSpike",
]

#: The symbol every built-in primitive is written in.
u = sp.Symbol("u", real=True)


@dataclass(frozen=True)
class Surrogate:
    """A surrogate gradient given by a SymPy primitive σ(x) in one symbol.

    Parameters
    ----------
    primitive : sympy.Expr
        σ(x): a smooth stand-in for the step function. Only its derivative is
        used (in the backward pass); the forward pass always uses Θ.
    x : sympy.Symbol
        The primitive's one free symbol.
    name : str, optional
        Used in reprs and generated-code comments.

    Examples
    --------
    >>> import sympy as sp
    >>> x = sp.Symbol("x")
    >>> fast_sigmoid = Surrogate(x / (1 + sp.Abs(x)), x, name="FastSigmoid")
    >>> fast_sigmoid.derivative()
    ...
    """

    primitive: sp.Expr
    x: sp.Symbol
    name: str = "Surrogate"
    _derivative: sp.Expr = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.x, sp.Symbol):
            raise TypeError(f"Surrogate x must be a sympy.Symbol, got {type(self.x).__name__}")
        if not isinstance(self.primitive, sp.Expr):
            raise TypeError(
                "Surrogate primitive must be a SymPy expression, "
                f"got {type(self.primitive).__name__}"
            )
        extra = self.primitive.free_symbols - {self.x}
        if extra:
            raise ValueError(
                f"Surrogate primitive may use only {self.x}, but it also uses "
                f"{sorted(map(str, extra))}; substitute numbers for them."
            )
        canonical = self.primitive.subs(self.x, u)
        derivative = sp.diff(canonical, u)
        _reject_singular(derivative, f"{self.name} surrogate derivative")
        object.__setattr__(self, "_derivative", derivative)

    def primitive_in_u(self) -> sp.Expr:
        """σ written in the canonical symbol :data:`u`."""
        return self.primitive.subs(self.x, u)

    def derivative(self) -> sp.Expr:
        """σ'(u), derived by SymPy, in the canonical symbol :data:`u`."""
        return self._derivative


def _reject_singular(expr: sp.Expr, what: str) -> None:
    bad = (sp.DiracDelta, sp.Heaviside, sp.Derivative, sp.Subs)
    for kind in bad:
        if expr.has(kind):
            raise ValueError(
                f"The {what} contains {kind.__name__}, which has no finite value at every "
                "point; write the function piecewise (sympy.Piecewise) instead."
            )
    if expr.has(sp.zoo, sp.oo, -sp.oo, sp.nan):
        raise ValueError(f"The {what} is not finite ({expr}); check the expression.")


def _float(value: float, name: str) -> sp.Float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"Surrogate parameter {name} must be finite, got {value}")
    return sp.Float(value)


def _positive(value: float, name: str) -> sp.Float:
    out = _float(value, name)
    if out <= 0:
        raise ValueError(f"Surrogate parameter {name} must be > 0, got {value}")
    return out


def Sigmoid(alpha: float = 4.0) -> Surrogate:
    """σ(x) = sigmoid(αx); σ'(x) = α·sigmoid(αx)·(1 − sigmoid(αx)).

    Written as (1 + tanh(αx/2))/2, the same function, so that σ' = α(1 − tanh²)/4
    stays finite for any x (the exp form overflows to inf/inf in float32).
    """
    a = _positive(alpha, "alpha")
    return Surrogate((1 + sp.tanh(a * u / 2)) / 2, u, name=f"Sigmoid(alpha={alpha})")


def ATan(alpha: float = 2.0) -> Surrogate:
    """σ(x) = atan(παx/2)/π + 1/2; σ'(x) = α / (2(1 + (παx/2)²))."""
    a = _positive(alpha, "alpha")
    return Surrogate(
        sp.atan(sp.pi / 2 * a * u) / sp.pi + sp.Rational(1, 2), u, f"ATan(alpha={alpha})"
    )


def PiecewiseQuadratic(alpha: float = 1.0) -> Surrogate:
    """σ'(x) = α − α²|x| for |x| ≤ 1/α, else 0."""
    a = _positive(alpha, "alpha")
    inner = -(a**2) / 2 * u * sp.Abs(u) + a * u + sp.Rational(1, 2)
    primitive = sp.Piecewise((0, u < -1 / a), (1, u > 1 / a), (inner, True))
    return Surrogate(primitive, u, name=f"PiecewiseQuadratic(alpha={alpha})")


def SoftSign(alpha: float = 2.0) -> Surrogate:
    """σ(x) = (αx / (1 + |αx|) + 1)/2; σ'(x) = α / (2(1 + |αx|)²)."""
    a = _positive(alpha, "alpha")
    primitive = (a * u / (1 + sp.Abs(a * u)) + 1) / 2
    return Surrogate(primitive, u, name=f"SoftSign(alpha={alpha})")


def Erf(alpha: float = 2.0) -> Surrogate:
    """σ(x) = erfc(−αx)/2; σ'(x) = α/√π · exp(−α²x²)."""
    a = _positive(alpha, "alpha")
    return Surrogate(sp.erfc(-a * u) / 2, u, name=f"Erf(alpha={alpha})")


def PiecewiseLeakyReLU(w: float = 1.0, c: float = 0.01) -> Surrogate:
    """σ'(x) = 1/(2w) for |x| < w, else c."""
    w_ = _positive(w, "w")
    c_ = _float(c, "c")
    primitive = sp.Piecewise(
        (c_ * u + c_ * w_, u < -w_),
        (c_ * u - c_ * w_ + 1, u > w_),
        (u / (2 * w_) + sp.Rational(1, 2), True),
    )
    return Surrogate(primitive, u, name=f"PiecewiseLeakyReLU(w={w}, c={c})")


def QPseudoSpike(alpha: float = 2.0) -> Surrogate:
    """σ'(x) = (1 + 2|x|/(α − 1))^(−α); requires α > 1."""
    a = _positive(alpha, "alpha")
    if a <= 1:
        raise ValueError(f"QPseudoSpike needs alpha > 1, got {alpha}")
    tail = (1 + 2 * sp.Abs(u) / (a - 1)) ** (1 - a) / 2
    primitive = sp.Piecewise((tail, u < 0), (1 - tail, True))
    return Surrogate(primitive, u, name=f"QPseudoSpike(alpha={alpha})")


def SuperSpike(alpha: float = 1.0) -> Surrogate:
    """SuperSpike as in SpikingJelly 2.0: σ(x) = αx / (1 + |x|), σ'(x) = α / (1 + |x|)².

    (Zenke & Ganguli's 1/(1 + β|x|)² is ``Surrogate(x / (1 + β*Abs(x)) / β, x)``.)
    """
    a = _positive(alpha, "alpha")
    return Surrogate(a * u / (1 + sp.Abs(u)), u, name=f"SuperSpike(alpha={alpha})")


def or_default(surrogate: Any) -> Surrogate:
    """``surrogate`` checked, or the default ``Sigmoid(alpha=4.0)`` for None."""
    if surrogate is None:
        return Sigmoid(alpha=4.0)
    if not isinstance(surrogate, Surrogate):
        raise TypeError(
            f"surrogate must be a symneuron.surrogate.Surrogate, got {type(surrogate).__name__}"
        )
    return surrogate
