"""How extra states are written: an on-spike rule uses sn.S (issue 25, item 4), and an input
filtered by a synaptic current reaches V in the same step when the charge reads the
current's new value (item 7).

Oracles: a loop written here in plain float64 Python (Brian2's reset ``w += b`` applied
only at spikes) and snnTorch's ``Synaptic`` neuron.
"""

from __future__ import annotations

import re

import pytest
import sympy as sp
import torch

import symneuron as sn

V, X, S = sn.V, sn.X, sn.S
w, b, tau_w = sp.symbols("w b tau_w", real=True)
current = sp.Symbol("I", real=True)


# -- on_spike without sn.S -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["State", "ODEState"])
def test_an_on_spike_rule_without_the_spike_is_refused_with_the_fix(kind: str) -> None:
    """Brian2's ``reset="w += b"`` written as on_spike=w + b would add b at every step."""
    params = {b: 0.3, tau_w: 5.0}
    with pytest.raises(ValueError) as error:
        if kind == "State":
            state = sn.State(update=w - w / tau_w, on_spike=w + b)
            sn.Neuron(V + X - w, params=params, states={w: state})
        else:
            ode = sn.ODEState(-w / tau_w, on_spike=w + b)
            sn.Neuron.from_ode(-V + X - w, dt=1.0, params=params, states={w: ode})
    message = str(error.value)
    assert "on_spike of state 'w' (b + w) does not use the spike sn.S" in message
    assert "at every step" in message
    assert re.search(r"write S\*b \+ w\b", message), message  # the symneuron form


@pytest.mark.parametrize("rule", [sp.Integer(0), 0.0, -0.5 * w])
def test_a_constant_or_scaled_on_spike_rule_shows_its_spike_form(rule: object) -> None:
    with pytest.raises(ValueError, match=r"does not use the spike sn\.S.*write .*S"):
        sn.Neuron(V + X - w, states={w: sn.State(update=0.9 * w, on_spike=rule)})


def test_the_identity_and_a_rule_with_the_spike_are_accepted() -> None:
    keep = sn.Neuron(V + X - w, states={w: sn.State(update=0.9 * w, on_spike=w)})
    assert keep.states["w"].on_spike == keep.state_symbols["w"]
    sn.Neuron(V + X - w, states={w: sn.State(update=0.9 * w, on_spike=w + 0.3 * S)})


def test_the_form_the_error_shows_is_brian2s_reset() -> None:
    """w ← w + b at spikes only: the suggested rule against a loop written here."""
    params = {b: 0.3, tau_w: 5.0}
    with pytest.raises(ValueError) as error:
        sn.Neuron(V + X - w, params=params, states={w: sn.State(update=w * 0.8, on_spike=w + b)})
    suggested = re.search(r"write (.+?)(?: \(|;|\.$)", str(error.value))
    assert suggested is not None
    rule = sp.sympify(suggested.group(1), locals={"S": S, "b": b, "w": w})
    neuron = sn.Neuron(
        V + X - w, params=params, states={w: sn.State(update=w * 0.8, on_spike=rule)}
    )
    x = torch.rand(40, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) * 1.5
    spikes, v, states = sn.simulate(neuron, x, backend="cpu")
    v_ref, w_ref, vs, ws, ss = 0.0, 0.0, [], [], []
    for t in range(40):
        h = v_ref + float(x[t, 0]) - w_ref
        w_ref *= 0.8
        s = 1.0 if h >= 1.0 else 0.0
        v_ref = 0.0 if s else h
        w_ref = w_ref + 0.3 if s else w_ref  # Brian2: reset = "w += b"
        vs.append(v_ref), ws.append(w_ref), ss.append(s)
    assert 0 < sum(ss) < 40
    torch.testing.assert_close(spikes[:, 0], torch.tensor(ss, dtype=torch.float64))
    torch.testing.assert_close(v[:, 0], torch.tensor(vs, dtype=torch.float64))
    torch.testing.assert_close(states["w"][:, 0], torch.tensor(ws, dtype=torch.float64))


# -- a synaptic current: the same-step form --------------------------------------------


def test_the_error_for_a_neuron_without_input_shows_the_same_step_form() -> None:
    """It used to suggest a state update 0.9*I + X read by the charge: one step late."""
    with pytest.raises(ValueError) as error:
        sn.Neuron(0.8 * V + current, states={current: sn.State(update=0.5 * current)})
    message = str(error.value)
    assert "does not depend on the input X" in message
    assert "I_new = 0.5*I + X" in message and "charge=0.8*V + I_new" in message
    assert "states={I: sn.State(update=I_new)}" in message
    assert "one step late" in message


def _snntorch_v(x: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    snn = pytest.importorskip("snntorch")
    decay = {"alpha": alpha, "beta": beta}  # as float64: snnTorch would store float32
    neuron = snn.Synaptic(
        **{k: torch.tensor(v, dtype=torch.float64) for k, v in decay.items()}, threshold=1e9
    )  # no spikes, no reset
    neuron.reset_mem()
    out = []
    for t in range(x.shape[0]):
        _, _, mem = neuron(x[t])
        out.append(mem)
    return torch.stack(out)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_the_same_step_form_matches_snntorch_synaptic(backend: str) -> None:
    """syn[t] = α·syn[t−1] + x[t], mem[t] = β·mem[t−1] + syn[t] (snnTorch 1.0's Synaptic) is
    the charge β·V + Ĩ with Ĩ = α·I + X, as CuLIF writes it; the lagged form, whose charge
    reads I[t−1], is one step behind (the issue's V = [0, 1.0, 1.3] for [1.0, 1.3])."""
    alpha, beta = 0.5, 0.8
    x = torch.rand(50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(25))
    x[0] = 1.0
    expected = _snntorch_v(x, alpha, beta)
    new_current = alpha * current + X
    same_step = sn.Neuron(
        beta * V + new_current, states={current: sn.State(update=new_current)}, v_threshold=1e9
    )
    _, v, _ = sn.simulate(same_step, x, backend=backend)
    torch.testing.assert_close(v, expected, rtol=1e-13, atol=1e-13)  # sums in another order
    lagged = sn.Neuron(
        beta * V + current, states={current: sn.State(update=new_current)}, v_threshold=1e9
    )
    _, v_lagged, _ = sn.simulate(lagged, x, backend=backend)
    assert float(v_lagged[0].abs().max()) == 0.0
    torch.testing.assert_close(v_lagged[1:], expected[:-1], rtol=1e-13, atol=1e-13)


def test_culif_is_the_same_step_form() -> None:
    """The zoo's CuLIF: H = V + (Ĩ − V)/τ, Ĩ = I(1 − 1/τ_syn) + X, against snnTorch's
    Synaptic with α = 1 − 1/τ_syn, β = 1 − 1/τ and the input scaled by 1/τ."""
    tau, tau_syn = 2.0, 4.0
    x = torch.rand(40, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(7)) / 4
    _, v, _ = sn.simulate(sn.models.CuLIF(tau=tau, tau_syn=tau_syn, v_threshold=1e9), x)
    # H = (1 − 1/τ)V + Ĩ/τ: the scaled current Ĩ/τ follows α·(I/τ) + X/τ
    expected = _snntorch_v(x / tau, 1 - 1 / tau_syn, 1 - 1 / tau)
    torch.testing.assert_close(v, expected, rtol=1e-12, atol=1e-13)
