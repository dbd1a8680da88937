"""Neurons with extra state variables: the cpu backend against the float64 torch reference,
and Izhikevich against SpikingJelly's own torch IzhikevichNode.

Each model runs with constants that make its extra state matter (nonzero adaptation),
on fresh random inputs that fire some but not all of the time.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest
import sympy as sp
import torch

import symneuron as sn
from symneuron.reference import simulate_reference

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="cpu backend needs cc")

#: Constants under which every extra state changes the spike train.
ACTIVE = {
    "Izhikevich": {"a": 0.3, "b": 0.2, "w_rest": 0.05},
    "ALIF": {"rho": 0.8, "beta": 0.6},
    "CuLIF": {"tau_syn": 3.0},
    "AdEx": {"a": 0.2, "b": 0.1},
}
LEARNABLE = {
    "Izhikevich": ["a", "b", "tau"],
    "ALIF": ["rho", "beta", "b0"],
    "CuLIF": ["tau", "tau_syn"],
    "AdEx": ["a", "b", "tau_w"],
}
X_SCALE = {"Izhikevich": 1.2, "ALIF": 2.4, "CuLIF": 1.0, "AdEx": 0.9}


def test_every_stateful_zoo_model_is_tested() -> None:
    assert set(sn.models.STATEFUL) == set(ACTIVE) == set(LEARNABLE)


def _neuron(name: str, reset: str, detach: bool) -> sn.Neuron:
    kw: dict[str, Any] = {**ACTIVE[name], "detach_reset": detach, "learnable": LEARNABLE[name]}
    if reset == "soft":
        kw["v_reset"] = None
    elif name == "ALIF":
        kw["v_reset"] = 0.0
    return sn.models.STATEFUL[name](**kw)


def _run(
    neuron: sn.Neuron,
    backend: str,
    inputs: dict[str, torch.Tensor],
    weights: list[torch.Tensor],
    store: bool = True,
) -> tuple[list[torch.Tensor], list]:
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in inputs.items()}
    params = {n: leaves[n] for n in neuron.learnable}
    states = {n: leaves[f"w:{n}"] for n in neuron.states}
    if backend == "reference":
        s, v, w = simulate_reference(
            neuron,
            leaves["x"],
            leaves["v0"],
            {**neuron.params, **params},
            w_init=states,
            store_v_seq=store,
        )
    else:
        s, v, w = sn.simulate(
            neuron,
            leaves["x"],
            leaves["v0"],
            params,
            backend=backend,
            states=states,
            store_v_seq=store,
        )
    outs = [s, v, *w.values()]
    loss = sum((o * r[: o.shape[0]]).sum() for o, r in zip(outs, weights, strict=False))
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return [o.detach() for o in outs], list(grads)


def _inputs(
    neuron: sn.Neuron,
    name: str,
    dtype: torch.dtype,
    gen: torch.Generator,
    shape: tuple[int, ...] = (3, 9),
    t_len: int = 12,
) -> dict[str, torch.Tensor]:
    def rand(*size: int) -> torch.Tensor:
        return torch.rand(size, generator=gen, dtype=torch.float64)

    inputs = {"x": X_SCALE[name] * rand(t_len, *shape), "v0": 0.5 * rand(*shape) - 0.1}
    for w, state in neuron.states.items():
        inputs[f"w:{w}"] = state.init + 0.2 * rand(*shape) - 0.1
    for p in neuron.learnable:
        inputs[p] = torch.tensor(neuron.params[p], dtype=torch.float64) * (1 + 0.05 * rand())
    return {k: v.to(dtype) for k, v in inputs.items()}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("detach", [False, True])
@pytest.mark.parametrize("reset", ["hard", "soft"])
@pytest.mark.parametrize("name", sorted(sn.models.STATEFUL))
def test_stateful_cpu_matches_reference(
    name: str, reset: str, detach: bool, dtype: torch.dtype
) -> None:
    neuron = _neuron(name, reset, detach)
    gen = torch.Generator().manual_seed(torch.randint(0, 2**31, ()).item())
    inputs = _inputs(neuron, name, dtype, gen)
    weights = [torch.randn(12, 3, 9, generator=gen, dtype=torch.float64) for _ in range(3)]
    ref_out, ref_grads = _run(
        neuron, "reference", {k: v.double() for k, v in inputs.items()}, weights
    )
    out, grads = _run(neuron, "cpu", inputs, [w.to(dtype) for w in weights])
    spikes = ref_out[0]
    assert 0.02 < float(spikes.mean()) < 0.98, "degenerate input"
    assert torch.equal(out[0].double(), spikes)
    atol, rtol = (1e-10, 1e-9) if dtype == torch.float64 else (1e-4, 1e-4)
    for got, ref in zip(out[1:], ref_out[1:], strict=True):
        torch.testing.assert_close(got.double(), ref, rtol=0, atol=atol)
    for key, got, ref in zip(inputs, grads, ref_grads, strict=True):
        scale = ref.abs().max().clamp_min(1.0)
        err = float((got.double() - ref).abs().max() / scale)
        assert err <= rtol, f"grad {key}: relative error {err:.2e}"
    state_grads = [g for k, g in zip(inputs, ref_grads, strict=True) if k.startswith("w:")]
    assert all(g.abs().sum() > 0 for g in state_grads), "a state's initial value got no gradient"


def test_store_last_returns_final_states() -> None:
    neuron = _neuron("Izhikevich", "hard", False)
    x = 1.2 * torch.rand(10, 4, 5, dtype=torch.float64)
    s_full, v_full, w_full = sn.simulate(neuron, x, backend="cpu")
    s_last, v_last, w_last = sn.simulate(neuron, x, backend="cpu", store_v_seq=False)
    assert torch.equal(s_full, s_last) and torch.equal(v_full[-1:], v_last)
    assert w_last["W"].shape == (1, 4, 5) and torch.equal(w_full["W"][-1:], w_last["W"])


def test_layer_keeps_and_resets_states() -> None:
    neuron = _neuron("ALIF", "soft", False)
    x = 2.4 * torch.rand(8, 2, 6, dtype=torch.float64)
    whole = sn.NeuronLayer(neuron).double()
    steps = sn.NeuronLayer(neuron, step_mode="s").double()
    out_whole = whole(x)
    out_steps = torch.stack([steps(x[t]) for t in range(8)])
    assert torch.equal(out_whole, out_steps)
    assert torch.equal(whole.states["A"], steps.states["A"])
    assert float(whole.states["A"].detach().abs().sum()) > 0
    whole.reset()
    assert whole.states == {} and whole.v is None


def test_state_validation() -> None:
    w = sp.Symbol("W")
    with pytest.raises(ValueError, match="update of state 'W' uses unknown symbols \\['S'\\]"):
        sn.Neuron(sn.V + sn.X - w, states={w: sn.State(update=w + sn.S)})
    with pytest.raises(ValueError, match="on_spike of state 'W' uses unknown symbols"):
        sn.Neuron(sn.V + sn.X - w, states={w: sn.State(on_spike=w + sn.X)})
    with pytest.raises(ValueError, match="State name 'tau'"):
        sn.Neuron(sn.V + sn.X, params={"tau": 1.0}, states={"tau": sn.State()})
    with pytest.raises(TypeError, match="must be a symneuron.State"):
        sn.Neuron(sn.V + sn.X, states={w: 0.5})
    with pytest.raises(ValueError, match="Unknown state 'Q'"):
        sn.simulate(_neuron("ALIF", "soft", False), torch.rand(3, 4), states={"Q": 0.0})


def test_check_passes_on_stateful_models() -> None:
    for name in sn.models.STATEFUL:
        report = sn.check(_neuron(name, "hard", False), backend="cpu")
        assert report.passed, str(report)
        assert any("_seq vs reference" in r.name and r.name[0] != "v" for r in report.results)


@pytest.mark.parametrize("reset", ["hard", "soft"])
def test_izhikevich_matches_spikingjelly(reset: str) -> None:
    """SpikingJelly's IzhikevichNode (torch, multi-step, float64) as an outside oracle."""
    if os.environ.get("CI"):
        import spikingjelly  # noqa: F401  (CI installs it)
    sj_neuron = pytest.importorskip("spikingjelly.activation_based.neuron")
    sj_surrogate = pytest.importorskip("spikingjelly.activation_based.surrogate")
    constants = {"a": 0.3, "b": 0.2, "w_rest": 0.05, "tau_w": 3.0, "v_rest": -0.1}
    v_reset = None if reset == "soft" else 0.0
    node = sj_neuron.IzhikevichNode(
        **constants,
        v_reset=v_reset,
        surrogate_function=sj_surrogate.ATan(),
        step_mode="m",
        store_v_seq=True,
    ).to(torch.float64)
    neuron = sn.models.Izhikevich(**constants, v_reset=v_reset, surrogate=sn.surrogate.ATan())
    gen = torch.Generator().manual_seed(torch.randint(0, 2**31, ()).item())
    x = 1.3 * torch.rand(10, 4, 7, generator=gen, dtype=torch.float64)
    r = torch.randn(10, 4, 7, generator=gen, dtype=torch.float64)
    x_sj, x_sn = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    spikes_sj = node(x_sj)
    spikes_sn, v_sn, _ = sn.simulate(neuron, x_sn, backend="cpu")
    assert 0.02 < float(spikes_sj.mean()) < 0.98
    assert torch.equal(spikes_sn, spikes_sj.detach())
    torch.testing.assert_close(v_sn.detach(), node.v_seq.detach(), rtol=0, atol=1e-6)
    (g_sj,) = torch.autograd.grad((spikes_sj * r).sum() + (node.v_seq * r).sum(), x_sj)
    (g_sn,) = torch.autograd.grad((spikes_sn * r).sum() + (v_sn * r).sum(), x_sn)
    torch.testing.assert_close(g_sn, g_sj, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("v_mode", ["seq", "last"])
def test_opcheck_stateful_ops(v_mode: str) -> None:
    from symneuron import binding as F

    neuron = _neuron("AdEx", "hard", False)
    gen = torch.Generator().manual_seed(torch.randint(0, 2**31, ()).item())
    x = 0.9 * torch.rand(6, 10, generator=gen, dtype=torch.float64)
    v0 = 0.3 * torch.rand(10, generator=gen, dtype=torch.float64)
    w0 = 0.1 * torch.rand(1, 10, generator=gen, dtype=torch.float64)
    params = [torch.full((10,), value, dtype=torch.float64) for value in neuron.params.values()]
    for name, p in zip(neuron.params, params, strict=True):
        p.requires_grad_(name in neuron.learnable)
    args = (
        F.register(neuron, "cpu"),
        "cpu",
        x.requires_grad_(),
        v0.requires_grad_(),
        w0.requires_grad_(),
        params,
        True,
        v_mode,
    )
    torch.library.opcheck(F.forward_op, args)


def test_torch_compile_stateful_layer() -> None:
    neuron = _neuron("Izhikevich", "hard", False)
    layer = sn.NeuronLayer(neuron).double()

    def step(x: torch.Tensor) -> torch.Tensor:
        layer.reset()
        return layer(x).sum()

    compiled = torch.compile(step, fullgraph=True)
    x = 1.2 * torch.rand(6, 3, 4, dtype=torch.float64)
    assert torch.equal(compiled(x), step(x))
