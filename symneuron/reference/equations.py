"""A neuron's equations as torch functions (SymPy's torch printer and ``lambdify``),
built once per neuron for the reference (:mod:`symneuron.reference`).

Under ``torch.compile`` SymPy cannot be traced: :func:`equations` calls :func:`_built`,
marked :func:`~symneuron.memo.constant_result`, which Dynamo runs eagerly before it
traces the attribute read that follows; it traces only the torch functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import NamedTuple

import sympy as sp
import torch
from sympy.printing.pytorch import TorchPrinter

from ..definition import Definition, H, S, V, X
from ..memo import constant_result
from ..stochastic import NOISES
from ..surrogate import u as U
from ..validate import check_total_piecewise

__all__ = ["Equations", "equations", "torch_function"]


class _Printer(TorchPrinter):
    """SymPy's torch printer plus the special functions it lacks."""

    _kf = {**TorchPrinter._kf, "erfc": "torch.special.erfc", "erf": "torch.special.erf"}

    def _print_erfc(self, expr: sp.Expr) -> str:
        return f"torch.special.erfc({self._print(expr.args[0])})"

    def _print_erf(self, expr: sp.Expr) -> str:
        return f"torch.special.erf({self._print(expr.args[0])})"

    def _print_expm1(self, expr: sp.Expr) -> str:
        return f"torch.expm1({self._print(expr.args[0])})"

    def _extremum(self, expr: sp.Expr, pairwise: str, bound: str) -> str:
        """Max/Min: tensors pairwise, numbers as a clamp (torch's max/min take no numbers)."""
        numbers = [a for a in expr.args if a.is_number]
        tensors = [self._print(a) for a in expr.args if not a.is_number]
        if not tensors:
            return self._print(sp.Float(expr.evalf(20), 20))
        text = tensors[0]
        for other in tensors[1:]:
            text = f"{pairwise}({text}, {other})"
        for number in numbers:
            text = f"torch.clamp({text}, {bound}={self._print(sp.Float(number.evalf(20), 20))})"
        return text

    def _print_Max(self, expr: sp.Expr) -> str:
        return self._extremum(expr, "torch.maximum", "min")

    def _print_Piecewise(self, expr: sp.Piecewise) -> str:
        check_total_piecewise(expr)
        return str(super()._print_Piecewise(expr))

    def _print_Min(self, expr: sp.Expr) -> str:
        return self._extremum(expr, "torch.minimum", "max")


def _numbers_as_floats(expr: sp.Expr) -> sp.Expr:
    """Constant subexpressions (sqrt(2), exp(-1), pi**2) as floats: torch ops need tensors."""
    return expr.replace(
        lambda e: isinstance(e, sp.Expr) and e.is_number and not e.is_Number,
        lambda e: sp.Float(e.evalf(20), 20),
    )


def torch_function(args: Sequence[sp.Symbol], expr: sp.Expr) -> Callable[..., torch.Tensor]:
    """``expr`` as a Python function of torch tensors (SymPy's lambdify, once per
    arguments and expression: a reference run builds one per equation)."""
    return _lambdified(tuple(args), sp.sympify(expr))


@lru_cache(maxsize=1024)
def _lambdified(args: tuple[sp.Symbol, ...], expr: sp.Expr) -> Callable[..., torch.Tensor]:
    expr = _numbers_as_floats(expr)
    return sp.lambdify(list(args), expr, modules=[{"torch": torch}], printer=_Printer)


class Equations(NamedTuple):
    """A neuron's equations as torch functions, in the kernels' order: the integrator's
    stages K (each from the earlier ones); H = f(V, X, W, θ, K); each
    W̃ = g(V, X, H, W, θ, K); S = Θ(H − V_th(W̃, θ)); each W after the spike; p(H) of
    escape firing. The draws (``noise<i>``) are the last arguments of the charge and
    the updates."""

    stages: list[Callable[..., torch.Tensor]]  # (V, X, *W, *θ, *K earlier) -> K_i
    charge: Callable[..., torch.Tensor]  # (V, X, *W, *θ, *K, *Z) -> H
    updates: list[Callable[..., torch.Tensor]]  # (V, X, H, *W, *θ, *K, *Z) -> W̃, per state
    resets: list[Callable[..., torch.Tensor]]  # (S, *W̃, *θ) -> W after the spike
    threshold: Callable[..., torch.Tensor]  # (*W̃, *θ) -> V_th
    probability: Callable[..., torch.Tensor] | None  # (H, *θ) -> p(H), escape
    primitive: Callable[..., torch.Tensor]  # u -> the surrogate's primitive σ(u)
    levels: dict[str, Callable[..., torch.Tensor]]  # v_reset's, v_start's text -> (*θ) -> it


#: the attribute of a neuron that holds its :class:`Equations` (built once per neuron)
_ATTRIBUTE = "_torch_equations"


def equations(neuron: Definition) -> Equations:
    """``neuron``'s :class:`Equations`. Under ``torch.compile``, Dynamo calls
    :func:`_built` eagerly (SymPy cannot be traced) and then traces the attribute read,
    which sees the equations just built."""
    _built(neuron)
    found: Equations = getattr(neuron, _ATTRIBUTE)
    return found


@constant_result
def _built(neuron: Definition) -> bool:
    """Build ``neuron``'s :class:`Equations` onto it, once (a cache: a copy or an unpickled
    neuron builds its own)."""
    if _ATTRIBUTE not in vars(neuron):
        object.__setattr__(neuron, _ATTRIBUTE, _build(neuron))
    return True


def _build(neuron: Definition) -> Equations:
    p_syms = [neuron.symbols[n] for n in neuron.params]
    w_syms = list(neuron.state_symbols.values())
    base = [*w_syms, *p_syms]
    k_syms = [z for z, _ in neuron.stages]
    z_syms = [NOISES[i] for i in neuron.noise_streams]
    states = neuron.states.values()
    p = neuron.spike_probability
    levels = [lv for lv in (neuron.v_reset, neuron.v_start) if isinstance(lv, sp.Expr)]
    return Equations(
        stages=[
            torch_function([V, X, *base, *k_syms[:i]], e) for i, (_, e) in enumerate(neuron.stages)
        ],
        charge=torch_function([V, X, *base, *k_syms, *z_syms], neuron.step_charge),
        updates=[torch_function([V, X, H, *base, *k_syms, *z_syms], s.update) for s in states],
        resets=[torch_function([S, *w_syms, *p_syms], s.on_spike) for s in states],
        threshold=torch_function([*w_syms, *p_syms], sp.sympify(neuron.v_threshold)),
        probability=None if p is None else torch_function([H, *p_syms], p),
        primitive=torch_function([U], neuron.surrogate.primitive_in_u()),
        levels={str(lv): _level_function(neuron, lv) for lv in levels},
    )


def _level_function(neuron: Definition, level: sp.Expr) -> Callable[..., torch.Tensor]:
    return torch_function([neuron.symbols[n] for n in neuron.params], level)
