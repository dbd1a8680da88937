"""The ``MODEL`` argument of the command line, and a neuron's equations as rows.

``MODEL`` is a zoo name with optional keyword arguments in Python syntax
(``'LIF(tau=3.0, v_reset=None)'``, values read by ``ast.literal_eval``) or
``path/to/file.py:name`` for a neuron of your own; :func:`load_model` turns it
into a ``Neuron``. :func:`describe` gives the equations ``symneuron show`` prints
and the documentation's zoo page renders.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sympy as sp
from sympy.core.function import AppliedUndef

from .. import models
from ..definition import Definition, H, S
from ..neuron import Neuron

__all__ = ["UsageError", "zoo", "load_model", "describe"]

_SYNTAX = (
    "write NAME or NAME(key=value, ...), e.g. 'LIF(tau=3.0, v_reset=None)', or "
    "path/to/file.py:name for a neuron of your own"
)


class UsageError(Exception):
    """A bad command line: its message is printed and the command exits with status 2."""


# -- MODEL ---------------------------------------------------------------------------------


def zoo() -> dict[str, Callable[..., Neuron]]:
    """Every model of :mod:`symneuron.models` by name, the noisy ones included, read
    when called."""
    found: dict[str, Callable[..., Neuron]] = {}
    # STATEFUL: older symneuron kept it apart; NOISY: out of ZOO, whose tests run unseeded
    for table in ("ZOO", "STATEFUL", "NOISY"):
        found.update(getattr(models, table, None) or {})
    return found


def _parse_call(text: str) -> tuple[str, dict[str, Any]]:
    """``'LIF(tau=3.0)'`` -> ``("LIF", {"tau": 3.0})``; values by :func:`ast.literal_eval`."""
    if text.strip().endswith(".py"):
        raise UsageError(
            f"cannot read the model {text!r}: name the neuron in the file, as "
            f"'{text.strip()}:name' (a Neuron, or a function returning one, defined there)"
        )
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise UsageError(f"cannot read the model {text!r}: {_SYNTAX}") from None
    if isinstance(node, ast.Name):
        return node.id, {}
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise UsageError(f"cannot read the model {text!r}: {_SYNTAX}")
    if node.args or any(k.arg is None for k in node.keywords):
        raise UsageError(f"{text!r}: give arguments by keyword only, e.g. LIF(tau=3.0)")
    kwargs = {}
    for keyword in node.keywords:
        try:
            kwargs[str(keyword.arg)] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError):
            raise UsageError(
                f"{keyword.arg}={ast.unparse(keyword.value)} is not a Python literal; give a "
                "number, string, None, True/False or a list, e.g. learnable=['tau']"
            ) from None
    return node.func.id, kwargs


def _load_file(path: str, call: str) -> Neuron:
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"no file {path!r}; a neuron of your own is path/to/file.py:name")
    name, kwargs = _parse_call(call)
    spec = importlib.util.spec_from_file_location(f"_symneuron_user_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {path!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.resolve().parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(file.resolve().parent))
    if not hasattr(module, name):
        found = [k for k, v in vars(module).items() if isinstance(v, Definition)]
        raise UsageError(f"{path} has no {name!r}; the neurons defined there: {found or 'none'}")
    obj = getattr(module, name)
    neuron = obj.replace(**kwargs) if isinstance(obj, Definition) else obj(**kwargs)
    if not isinstance(neuron, Neuron):
        raise UsageError(
            f"{path}:{name} gave a {type(neuron).__name__}, not a symneuron.Neuron; point at a "
            "Neuron or at a function returning one"
        )
    return neuron


def load_model(text: str) -> Neuron:
    """The neuron a ``MODEL`` argument names (see the module docstring for the syntax).

    Raises :class:`UsageError` naming the known models when the name is unknown, and
    for arguments the model does not take.

    Examples
    --------
    >>> from symneuron.cli import load_model
    >>> load_model("LIF(tau=3.0, v_reset=None)").params["tau"]
    3.0
    """
    where = text.find(".py:")
    try:
        if where > 0:
            return _load_file(text[: where + 3], text[where + 4 :])
        name, kwargs = _parse_call(text)
        known = zoo()
        if name not in known:
            raise UsageError(
                f"unknown model {name!r}; the zoo has {', '.join(sorted(known))}, "
                "or give a neuron of your own as path/to/file.py:name"
            )
        return known[name](**kwargs)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{text}: {exc}") from exc


def _partial_latex(key: str) -> str:
    """``'dH/dtau'`` -> ``\\frac{\\partial H}{\\partial \\tau}``; ``'dW~/dV'`` with a tilde."""
    match = re.fullmatch(r"d(\w+)(~?)/d(\w+)", key)
    if match is None:
        return key
    top = sp.latex(sp.Symbol(match[1]))
    top = f"\\tilde{{{top}}}" if match[2] else top
    return f"\\frac{{\\partial {top}}}{{\\partial {sp.latex(sp.Symbol(match[3]))}}}"


def describe(neuron: Neuron, latex: bool = False) -> list[tuple[str, str]]:
    """``neuron``'s equations as ``(left side, right side)`` rows, as text or LaTeX.

    The rows are the ODEs and their discretisation (a neuron built by
    ``Neuron.from_ode``), the charge, each extra state's pre-spike update, the spike, the
    reset, each state's on-spike rule, the surrogate's derivative and every
    derived partial (``neuron.derivatives()``). ``symneuron show`` prints them; the
    documentation's zoo page renders them.

    Examples
    --------
    >>> import symneuron as sn
    >>> from symneuron.cli import describe
    >>> describe(sn.models.IF())[0]
    ('H', 'V + X')
    """
    fmt: Callable[[Any], str] = sp.latex if latex else sp.sstr
    # the threshold, the reset and the on-spike rules see the updated states W~
    tilde = {
        sym: sp.Symbol(f"{name}tilde" if latex else f"{name}~", real=True)
        for name, sym in neuron.state_symbols.items()
    }
    threshold = sp.sympify(neuron.v_threshold).subs(tilde)
    rows = []
    system = getattr(neuron, "ode", None)
    if system is not None:  # built from ODEs: show them before their discretised step

        def d(name: str) -> str:
            return f"\\frac{{d{name}}}{{dt}}" if latex else f"d{name}/dt"

        rows.append((d("V"), fmt(system.dv)))
        rows += [(d(name), fmt(st.ode)) for name, st in system.states.items()]
        shown = [neuron.charge, *(neuron.view(st.update) for st in neuron.states.values())]
        outlined = sorted({f.func.__name__ for e in shown for f in e.atoms(AppliedUndef)})
        named = "".join(f", {f} = d{f[2:]}/dt" for f in outlined)  # (Neuron.view's f_V)
        rows.append(("step", f"{system.method}, dt = {system.dt}{named}"))
    rows.append(("H", fmt(neuron.charge)))
    for name, state in neuron.states.items():
        new = neuron.view(state.update) if state.update is not None else neuron.state_symbols[name]
        rows.append((fmt(tilde[neuron.state_symbols[name]]), fmt(new)))
    if getattr(neuron, "firing", "level") == "crossing":
        crossing = (
            f"H \\text{{ crosses }} {fmt(threshold)} \\text{{ upwards}}"
            if latex
            else (f"1 when H crosses {fmt(threshold)} upwards")
        )
        rows.append(("S", crossing))
    else:
        step = fmt(H - threshold)
        rows.append(("S", f"\\Theta\\left({step}\\right)" if latex else f"Heaviside({step})"))
        reset = H - threshold * S if neuron.v_reset is None else H * (1 - S) + neuron.v_reset * S
        rows.append(("V_{new}" if latex else "V_new", fmt(reset)))
    for name, state in neuron.states.items():
        if state.on_spike is not None:
            label = f"{fmt(sp.Symbol(name))}_{{new}}" if latex else f"{name}_new"
            rows.append((label, fmt(state.on_spike.subs(tilde))))
    rows.append(("\\sigma'(u)" if latex else "surrogate'(u)", fmt(neuron.surrogate.derivative())))
    for key, expr in neuron.derivatives().items():
        rows.append((_partial_latex(key) if latex else key, fmt(expr)))
    return rows
