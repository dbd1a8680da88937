r"""NIR's neuron nodes <-> symneuron neurons: the discretisation with time step ``dt``.

NIR's neurons are ODEs in continuous time; symneuron's are step maps. Both
directions use one discretisation, a step of length ``dt`` (in the unit of NIR's
τ; no other unit is assumed) with the input X[t] held constant over the step:

.. math::
    \text{LIF:}\quad H &= V + \lambda\,(v_{leak} - V + r X), \qquad
    \lambda = dt/\tau \ (\texttt{euler}) \ \text{or}\ 1 - e^{-dt/\tau}\ (\texttt{exp\_euler}) \\
    \text{IF:}\quad H &= V + dt\, r X \\
    \text{CubaLIF:}\quad \tilde I &= I + \lambda_{syn} (w_{in} X - I), \qquad
    H = V + \lambda_{mem} (v_{leak} - V + r \tilde I) \\
    \text{Threshold:}\quad S &= [X > \theta]

(the current is stepped first and V sees the new current, as in snnTorch's
``Synaptic`` and symneuron's ``CuLIF``). Export reads these numbers off any neuron
whose step map has this form, per neuron:

.. math::
    \lambda = 1 - \partial H/\partial V, \quad r = (\partial H/\partial X)/\lambda, \quad
    v_{leak} = H|_{V=X=0}/\lambda, \quad
    \tau = dt/\lambda \ (\texttt{euler}) \ \text{or}\ -dt/\ln(1-\lambda)\ (\texttt{exp\_euler}).

So symneuron's ``LIF(tau=k)`` with ``decay_input=True`` is NIR's LIF with τ = k·dt,
r = 1; with ``decay_input=False``, τ = k·dt, r = k. snnTorch's converters hard-code
dt = 1e-4 and Euler (β = 1 − dt/τ, r = τ/dt); Norse's exporter (norse#411) divided dt
by an *inverse* time constant, dt/τ⁻¹, where dt·τ⁻¹ was meant; snnTorch's CubaLIF
importer folded w_in·dt/τ_syn ≠ 1 into the threshold (snntorch#435). Here dt is an
argument, τ and dt share a unit, and the same formula runs both ways.

Firing: NIR fires on v > θ, symneuron on H ≥ θ. Export writes the largest float64
θ_NIR < θ; load uses the smallest θ of the compute dtype above θ_NIR. Both are exact:
for every H of that dtype, H ≥ θ ⟺ H > θ_NIR.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import sympy as sp
import torch
from torch import nn

from ..definition import State, V, X
from ..layer import NeuronLayer
from ..neuron import Neuron
from .modules import Readout

__all__ = ["METHODS", "to_node", "from_node", "neuron_of", "NEURON_NODES"]

#: The discretisations: forward Euler, and exponential Euler (exact for a held input).
METHODS = ("euler", "exp_euler")

#: NIR node types that become neuron layers.
NEURON_NODES = ("LIF", "IF", "LI", "I", "CubaLIF", "CubaLI", "Threshold")

_TAU, _R, _V_LEAK, _THETA, _V_RESET = sp.symbols("tau r v_leak theta v_rst", real=True)
_TAU_SYN, _W_IN, _I_SYN = sp.symbols("tau_syn w_in I_syn", real=True)
_K = sp.Symbol("k", real=True)


def _leak(tau: sp.Expr, dt: float, method: str) -> sp.Expr:
    """λ, the fraction of the distance to the target closed in one step."""
    return sp.Float(dt) / tau if method == "euler" else 1 - sp.exp(-sp.Float(dt) / tau)


def _tau(leak: np.ndarray, dt: float, method: str, where: str) -> np.ndarray:
    upper = 2.0 if method == "euler" else 1.0
    if not bool(np.all((leak > 0) & (leak < upper))):
        bad = leak[~((leak > 0) & (leak < upper))].flat[0]
        raise ValueError(
            f"{where}: the leak per step 1 - dH/dV = {bad} has no NIR time constant with "
            f"method={method!r} (needs 0 < leak < {upper}; tau = dt/leak for euler, "
            "-dt/log(1 - leak) for exp_euler)."
        )
    out: np.ndarray = dt / leak if method == "euler" else -dt / np.log1p(-leak)
    return out


# -- export: a neuron layer -> a NIR node -------------------------------------------


class _Values:
    """Evaluates expressions in a layer's parameters, per neuron, in float64."""

    def __init__(self, neuron: Neuron, layer: NeuronLayer, shape: tuple[int, ...], where: str):
        self.where, self.shape = where, shape
        self.symbols = [neuron.symbols[n] for n in neuron.params]
        self.args = [
            layer.param_values()[n].detach().cpu().to(torch.float64).numpy() for n in neuron.params
        ]

    def __call__(self, expr: Any) -> np.ndarray:
        value = sp.lambdify(self.symbols, expr, modules="numpy")(*self.args)
        try:
            return np.broadcast_to(np.asarray(value, dtype=np.float64), self.shape).copy()
        except ValueError:
            raise ValueError(
                f"{self.where}: parameter values of shape {np.shape(value)} do not broadcast "
                f"to the layer's neurons {self.shape}."
            ) from None


def _linear(expr: sp.Expr, variables: list[sp.Symbol], where: str) -> list[sp.Expr]:
    """[∂expr/∂z for z in variables] + [expr at 0]; ValueError unless expr is affine in them."""
    parts = []
    for z in variables:
        part = sp.diff(expr, z)
        if part.free_symbols & set(variables):
            raise ValueError(
                f"{where}: {expr} is not linear in {z}; NIR's neurons (IF, LIF, CubaLIF, LI, "
                "CubaLI) are linear ODEs, so this neuron (e.g. QIF, EIF, Izhikevich) has no "
                "NIR node."
            )
        parts.append(sp.simplify(part))
    return [*parts, sp.simplify(expr.xreplace({z: 0 for z in variables}))]


def _check_exportable(neuron: Neuron, spiking: bool, where: str) -> None:
    if getattr(neuron, "draws", False):
        raise ValueError(
            f"{where}: {neuron.name} draws random numbers (noise or escape firing), which NIR's "
            "neurons cannot express; export the same equations without the noise term."
        )
    firing = getattr(neuron, "firing", "level")
    if firing != "level":
        raise ValueError(f"{where}: firing={firing!r} (no reset) has no NIR counterpart.")
    if spiking and neuron.v_reset is None:
        raise ValueError(
            f"{where}: soft reset (V <- H - v_threshold*S) is not in NIR, whose neurons reset "
            "to v_reset; build the neuron with a hard reset (v_reset=<value>) to export it."
        )
    v_init = getattr(neuron, "v_init", None)
    if v_init is not None and v_init != neuron.v_reset:
        raise ValueError(
            f"{where}: v_init={v_init} has no NIR counterpart (a loaded layer starts at v_reset)."
        )
    if len(neuron.states) > 1:
        raise ValueError(
            f"{where}: states {list(neuron.states)}; NIR's neurons have at most one extra state, "
            "the synaptic current of CubaLIF."
        )
    for level in (neuron.v_threshold, neuron.v_reset):
        if isinstance(level, sp.Expr) and level.free_symbols & set(neuron.state_symbols.values()):
            raise ValueError(
                f"{where}: a threshold or reset that moves with a state is not in NIR."
            )


def _synapse(neuron: Neuron, where: str) -> tuple[sp.Symbol, sp.Expr, sp.Expr]:
    """(I, p, q) of a synaptic current Ĩ = p·I + q·X that is not changed by spikes."""
    ((name, state),) = neuron.states.items()
    current = neuron.state_symbols[name]
    if state.on_spike != current:
        raise ValueError(
            f"{where}: state {name!r} changes on spikes; NIR's CubaLIF current does not."
        )
    update = state.update
    assert update is not None
    if update.free_symbols & {V, sp.Symbol("H", real=True)}:
        raise ValueError(
            f"{where}: state {name!r} depends on V or H; NIR's CubaLIF current does not."
        )
    p, q, drift = _linear(update, [current, X], f"{where}, state {name!r}")
    if drift != 0 or q == 0:
        raise ValueError(
            f"{where}: state {name!r} is not a synaptic current (I~ = p*I + q*X, q != 0), "
            f"got {update}."
        )
    return current, p, q


def to_node(name: str, layer: nn.Module, shape: tuple[int, ...], dt: float, method: str) -> Any:
    """The NIR node of a :class:`~symneuron.NeuronLayer` or :class:`Readout` with neurons
    of ``shape`` (without time and batch)."""
    import nir

    spiking = isinstance(layer, NeuronLayer)
    inner = layer if spiking else getattr(layer, "layer", None)
    if not isinstance(inner, NeuronLayer):
        raise TypeError(f"node {name!r}: {type(layer).__name__} is not a neuron layer")
    neuron = inner.neuron
    where = f"node {name!r} ({neuron.name})"
    _check_exportable(neuron, spiking, where)
    value = _Values(neuron, inner, shape, where)
    d_v, d_x, *d_i, bias = _linear(neuron.charge, [V, X, *neuron.state_symbols.values()], where)
    synapse = _synapse(neuron, where) if neuron.states else None
    if synapse is not None:
        current, p, q = synapse
        if sp.simplify(d_i[0] * q - d_x * p) != 0:
            raise ValueError(f"{where}: the charge sees I and X other than through I~ = p*I + q*X.")
        d_x = sp.simplify(d_x / q)
    leak, gain, drift = value(1 - d_v), value(d_x), value(bias)
    common: dict[str, np.ndarray] = {}
    if spiking:
        common["v_threshold"] = np.nextafter(value(neuron.v_threshold), -np.inf)
        common["v_reset"] = value(neuron.v_reset)
    if synapse is not None:
        syn_leak = value(1 - p)
        nodes = {True: nir.CubaLIF, False: nir.CubaLI}
        return nodes[spiking](
            tau_syn=_tau(syn_leak, dt, method, f"{where}, synaptic current"),
            tau_mem=_tau(leak, dt, method, where),
            r=gain / leak,
            v_leak=drift / leak,
            w_in=value(q) / syn_leak,
            **common,
        )
    if np.all(leak == 0):
        if np.any(drift != 0):
            raise ValueError(
                f"{where}: IF with a constant drift H = V + {bias} + ... is not in NIR."
            )
        return nir.IF(r=gain / dt, **common) if spiking else nir.I(r=gain / dt)
    if spiking and np.all((leak == 1) & (gain == 1) & (drift == 0)):
        return nir.Threshold(threshold=common["v_threshold"])
    tau = _tau(leak, dt, method, where)
    if spiking:
        return nir.LIF(tau=tau, r=gain / leak, v_leak=drift / leak, **common)
    return nir.LI(tau=tau, r=gain / leak, v_leak=drift / leak)


# -- load: a NIR node -> a neuron layer ------------------------------------------------


@functools.lru_cache(maxsize=64)
def _neuron(kind: str, dt: float, method: str) -> Neuron:
    """The symneuron neuron of NIR node type ``kind`` (built once per dt and method)."""
    level = {_THETA: 1.0, _V_RESET: 0.0}
    spiking = {"v_threshold": _THETA, "v_reset": _V_RESET}
    if kind in ("LIF", "LI"):
        dv = (_V_LEAK - V + _R * X) / _TAU
        params = {_TAU: 1.0, _R: 1.0, _V_LEAK: 0.0, **level}
        return Neuron.from_ode(
            dv, dt=dt, method=method, params=params, name=f"NIR_{kind}", **spiking
        )
    if kind in ("IF", "I"):
        params = {_R: 1.0, **level}
        return Neuron.from_ode(
            _R * X, dt=dt, method=method, params=params, name=f"NIR_{kind}", **spiking
        )
    if kind == "Threshold":
        return Neuron(_K * V + X, params={_K: 0.0, **level}, name="NIR_Threshold", **spiking)
    current = _I_SYN + _leak(_TAU_SYN, dt, method) * (_W_IN * X - _I_SYN)
    charge = V + _leak(_TAU, dt, method) * (_V_LEAK - V + _R * current)
    params = {_TAU_SYN: 1.0, _W_IN: 1.0, _TAU: 1.0, _R: 1.0, _V_LEAK: 0.0, **level}
    states = {_I_SYN: State(update=current)}
    return Neuron(charge, params=params, states=states, name=f"NIR_{kind}", **spiking)


def _strict(theta: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The smallest ``dtype`` values above ``theta``: H ≥ result ⟺ H > theta in ``dtype``."""
    above = torch.from_numpy(np.nextafter(np.asarray(theta, np.float64), np.inf))
    out = above.to(dtype)
    low = out.to(torch.float64) < above
    return torch.where(low, torch.nextafter(out, torch.full_like(out, float("inf"))), out)


_FIELDS = {
    "LIF": {"tau": "tau", "r": "r", "v_leak": "v_leak"},
    "IF": {"r": "r"},
    "CubaLIF": {
        "tau_syn": "tau_syn",
        "w_in": "w_in",
        "tau_mem": "tau",
        "r": "r",
        "v_leak": "v_leak",
    },
}
_FIELDS["LI"], _FIELDS["I"], _FIELDS["CubaLI"] = _FIELDS["LIF"], _FIELDS["IF"], _FIELDS["CubaLIF"]


def neuron_of(
    node: Any, dt: float, method: str, dtype: torch.dtype
) -> tuple[Neuron, dict[str, torch.Tensor]]:
    """The neuron of NIR neuron ``node`` and its parameter values per neuron, in ``dtype``."""
    kind = type(node).__name__
    neuron = _neuron(kind, float(dt), method)

    def tensor(array: Any) -> torch.Tensor:
        return torch.tensor(np.array(array, dtype=np.float64)).to(dtype)

    params = {ours: tensor(getattr(node, field)) for field, ours in _FIELDS.get(kind, {}).items()}
    if kind in ("LIF", "IF", "CubaLIF"):
        params["theta"] = _strict(node.v_threshold, dtype)
        params["v_rst"] = tensor(node.v_reset)
    if kind == "Threshold":
        params["theta"] = _strict(node.threshold, dtype)
    return neuron, params


def from_node(node: Any, dt: float, method: str, backend: str, dtype: torch.dtype) -> nn.Module:
    """The layer that runs NIR neuron ``node`` (a node type in :data:`NEURON_NODES`)."""
    neuron, params = neuron_of(node, dt, method, dtype)
    if type(node).__name__ in ("LI", "I", "CubaLI"):
        return Readout(neuron, backend=backend, params=params)
    return NeuronLayer(neuron, backend=backend, params=params)
