"""An extra state variable, and how a neuron fires: the parts of a definition that
describe what happens after the charge (stage 0: imports only the reserved symbols)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sympy as sp

from .symbols import S, X

__all__ = ["State", "firing_mode", "check_crossing_states", "check_on_spike", "FIRING"]

#: How a neuron fires: on the level of H (then a reset), on an upward crossing, or with
#: probability p(H) (escape noise, then the reset).
FIRING = ("level", "crossing", "escape")


@dataclass(frozen=True)
class State:
    """An extra state variable W of a neuron (see docs/user_guide.md, "Extra states").

    Parameters
    ----------
    update : sympy.Expr, optional
        The pre-spike update W̃ = g(V, W..., X, H; θ), written with the state
        symbols (their values before this step), :data:`V`, :data:`X`, :data:`H`
        and params. ``None`` keeps W̃ = W.
    on_spike : sympy.Expr, optional
        The reset W[t] = r(W̃..., S; θ), written with the state symbols (here
        meaning their updated values W̃), :data:`S` and params, e.g. ``W + b*S``.
        ``None`` keeps W[t] = W̃.
    init : float
        W[0] when no initial value is given.

    Examples
    --------
    >>> import sympy as sp, symneuron as sn
    >>> a = sp.Symbol("a")
    >>> adaptation = sn.State(update=0.9 * a, on_spike=a + 0.1 * sn.S)
    """

    update: sp.Expr | None = None
    on_spike: sp.Expr | None = None
    init: float = 0.0


def firing_mode(firing: Any, v_reset: Any, probability: Any = None) -> str:
    """``firing`` checked against the reset and the spike probability: ``"level"``,
    ``"crossing"`` (no reset) or ``"escape"`` (with ``probability``)."""
    if firing not in FIRING:
        raise ValueError(
            f"firing must be 'level' (S = Θ(H − θ), then a reset), 'escape' (S = 1 with "
            f"probability spike_probability, then a reset) or 'crossing' (S = 1 when H "
            f"crosses θ from below, no reset), got {firing!r}"
        )
    if (firing == "escape") != (probability is not None):
        raise ValueError(
            "firing='escape' takes a spike probability p(H) and only it does: pass "
            "firing='escape' together with spike_probability=<expression in sn.H>."
        )
    if firing == "crossing" and v_reset is None:
        raise ValueError(
            "firing='crossing' neurons have no reset, so a soft reset (v_reset=None) cannot "
            "apply; leave v_reset out, or use firing='level' for a soft reset."
        )
    if firing == "crossing" and not (isinstance(v_reset, (int, float)) and v_reset == 0.0):
        raise ValueError(
            f"firing='crossing' neurons have no reset, but v_reset={v_reset!r} was given; "
            "leave v_reset out (V[0] comes from v_init), or use firing='level'."
        )
    return str(firing)


def check_crossing_states(
    firing: str, states: Mapping[str, State], symbols: Mapping[str, sp.Symbol]
) -> None:
    """Reject on-spike rules under ``firing="crossing"``, which has no reset."""
    if firing != "crossing":
        return
    with_reset = sorted(n for n, s in states.items() if s.on_spike != symbols[n])
    if with_reset:
        raise ValueError(
            f"firing='crossing' neurons have no reset, but the states {with_reset} have "
            "on_spike rules; drop them or use firing='level' with a v_reset."
        )


def check_on_spike(name: str, symbol: sp.Symbol, rule: sp.Expr) -> None:
    """Refuse an on-spike ``rule`` of state ``name`` that does not use the spike S (and is
    not the state itself): it would apply at every step. A Brian2 user writes the reset
    ``w += b`` as ``on_spike=w + b``; the error shows the form with S."""
    if rule.has(S) or rule == symbol:
        return
    at_spikes = sp.expand(S * rule + (1 - S) * symbol)
    raise ValueError(
        f"The on_spike of state {name!r} ({rule}) does not use the spike sn.S, so it would "
        "apply at every step, spike or not. on_spike is the state's new value written with "
        f"sn.S; for {rule} at spikes only (as Brian2's reset), write {at_spikes} (that is, "
        f"S*({rule}) + (1 - S)*{name}); a change at every step belongs in update."
    )


def check_uses_x(expressions: list[sp.Expr]) -> None:
    """X must reach the step map: the charge, a state's update or an integrator stage
    (``expressions``); else a ValueError that shows the same-step synapse form."""
    if not any(e.has(X) for e in expressions):
        raise ValueError(
            "The neuron does not depend on the input X: use X in the charge, or in a state "
            "whose new value the charge reads. A synaptic current I that passes X on in "
            "the same step (snnTorch's Synaptic, sn.models.CuLIF) is written into the "
            "charge: I_new = 0.5*I + X; sn.Neuron(charge=0.8*V + I_new, "
            "states={I: sn.State(update=I_new)}). A charge that reads I itself sees "
            "I[t-1], so X reaches V one step late."
        )
