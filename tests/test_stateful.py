"""Neurons with extra state variables: the cpu backend against the float64 torch reference,
and Izhikevich against SpikingJelly's own torch IzhikevichNode.

Each model runs with constants that make its extra state matter (nonzero adaptation),
on seeded random inputs that fire some but not all of the time.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest
import sympy as sp
import torch
from conftest import generator, run_with_grads, seed_of

import symneuron as sn

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


def _inputs(
    neuron: sn.Neuron,
    name: str,
    gen: torch.Generator,
    shape: tuple[int, ...] = (3, 9),
    t_len: int = 12,
) -> dict[str, Any]:
    """Arguments of ``run_with_grads`` (float64): x_seq, v_init, params and states."""

    def rand(*size: int) -> torch.Tensor:
        return torch.rand(size, generator=gen, dtype=torch.float64)

    x_seq, v_init = X_SCALE[name] * rand(t_len, *shape), 0.5 * rand(*shape) - 0.1
    states = {w: state.init + 0.2 * rand(*shape) - 0.1 for w, state in neuron.states.items()}
    params = {
        p: torch.tensor(neuron.params[p], dtype=torch.float64) * (1 + 0.05 * rand())
        for p in neuron.learnable
    }
    return {"x_seq": x_seq, "v_init": v_init, "params": params, "states": states}


def _cast(inputs: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    return {
        k: {n: t.to(dtype) for n, t in v.items()} if isinstance(v, dict) else v.to(dtype)
        for k, v in inputs.items()
    }


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("detach", [False, True])
@pytest.mark.parametrize("reset", ["hard", "soft"])
@pytest.mark.parametrize("name", sorted(sn.models.STATEFUL))
def test_stateful_cpu_matches_reference(
    name: str, reset: str, detach: bool, dtype: torch.dtype
) -> None:
    neuron = _neuron(name, reset, detach)
    gen = generator(seed_of("stateful", name, reset, detach, dtype))
    inputs = _cast(_inputs(neuron, name, gen), dtype)
    weights = [torch.randn(12, 3, 9, generator=gen, dtype=torch.float64) for _ in range(3)]
    ref = run_with_grads(neuron, weights=weights, **_cast(inputs, torch.float64))
    got = run_with_grads(neuron, weights=weights, backend="cpu", **inputs)
    assert 0.02 < float(ref.spikes.mean()) < 0.98, "degenerate input"
    assert torch.equal(got.spikes.double(), ref.spikes)
    atol, rtol = (1e-10, 1e-9) if dtype == torch.float64 else (1e-4, 1e-4)
    assert got.states.keys() == ref.states.keys() == neuron.states.keys()
    for out in ["v_seq", *ref.states]:
        got_seq = got.v_seq if out == "v_seq" else got.states[out]
        ref_seq = ref.v_seq if out == "v_seq" else ref.states[out]
        torch.testing.assert_close(got_seq.double(), ref_seq, rtol=0, atol=atol)
    assert got.grads.keys() == ref.grads.keys()
    for key, ref_grad in ref.grads.items():
        scale = ref_grad.abs().max().clamp_min(1.0)
        err = float((got.grads[key].double() - ref_grad).abs().max() / scale)
        assert err <= rtol, f"grad {key}: relative error {err:.2e}"
    state_grads = [g for k, g in ref.grads.items() if k.startswith("w:")]
    assert state_grads, "no initial state was a leaf"
    assert all(g.abs().sum() > 0 for g in state_grads), "a state's initial value got no gradient"


#: whether each model's backward reads the W̃ its forward could save, from its equations
#: (default constructors, nothing learnable): Izhikevich's, CuLIF's and AdEx's states enter
#: the step linearly, so no partial depends on W̃ (and V[t-1] is recomputed from H alone);
#: ALIF's threshold is b0 + beta·W̃, so the backward's spike needs it. With a learnable tau,
#: Izhikevich's dH/dtau = -(f(V) - W + X)/tau² needs W[t-1], recomputed from W̃[t-1].
READS_WT = {"Izhikevich": False, "CuLIF": False, "AdEx": False, "ALIF": True, "Izh-tau": True}


@pytest.mark.parametrize("name", [*sorted(sn.models.STATEFUL), "Izh-tau"])
def test_w_tilde_saved_only_when_the_backward_reads_it(name: str) -> None:
    from symneuron.runtime import kernels

    if name == "Izh-tau":
        neuron = sn.models.Izhikevich(**ACTIVE["Izhikevich"], learnable=["tau"])
    else:
        neuron = sn.models.STATEFUL[name](**ACTIVE[name])
    prog = kernels.program(neuron, "cpu")
    assert prog.needs_wt is READS_WT[name]
    x = torch.rand(5, 7, generator=generator(seed_of("wt", name)), dtype=torch.float64)
    params = [torch.full((7,), v, dtype=torch.float64) for v in neuron.params.values()]
    wt_seq = prog.forward(x, None, None, params, True, "last").wt_seq
    assert (wt_seq is not None) is READS_WT[name]
    if wt_seq is not None:
        assert wt_seq.shape == (len(neuron.states), 5, 7)
    # the gradients of a model that saves nothing are checked against the float64
    # reference by test_stateful_cpu_matches_reference


def test_store_last_returns_final_states() -> None:
    neuron = _neuron("Izhikevich", "hard", False)
    x = 1.2 * torch.rand(10, 4, 5, generator=generator(seed_of("last")), dtype=torch.float64)
    s_full, v_full, w_full = sn.simulate(neuron, x, backend="cpu")
    s_last, v_last, w_last = sn.simulate(neuron, x, backend="cpu", store_v_seq=False)
    assert torch.equal(s_full, s_last) and torch.equal(v_full[-1:], v_last)
    assert w_last["W"].shape == (1, 4, 5) and torch.equal(w_full["W"][-1:], w_last["W"])


def test_layer_keeps_and_resets_states() -> None:
    neuron = _neuron("ALIF", "soft", False)
    x = 2.4 * torch.rand(8, 2, 6, generator=generator(seed_of("layer")), dtype=torch.float64)
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
        sn.simulate(_neuron("ALIF", "soft", False), torch.full((3, 4), 0.5), states={"Q": 0.0})


def test_check_passes_on_stateful_models() -> None:
    for name in sn.models.STATEFUL:
        report = sn.check(_neuron(name, "hard", False), backend="cpu", seed=seed_of("check", name))
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
    gen = generator(seed_of("spikingjelly", reset))
    x = 1.3 * torch.rand(10, 4, 7, generator=gen, dtype=torch.float64)
    r = torch.randn(10, 4, 7, generator=gen, dtype=torch.float64)
    x_sj, x_sn = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    spikes_sj = node(x_sj)
    spikes_sn, v_sn, _ = sn.simulate(neuron, x_sn, backend="cpu")
    assert 0.02 < float(spikes_sj.detach().mean()) < 0.98
    assert torch.equal(spikes_sn, spikes_sj.detach())
    torch.testing.assert_close(v_sn.detach(), node.v_seq.detach(), rtol=0, atol=1e-6)
    (g_sj,) = torch.autograd.grad((spikes_sj * r).sum() + (node.v_seq * r).sum(), x_sj)
    (g_sn,) = torch.autograd.grad((spikes_sn * r).sum() + (v_sn * r).sum(), x_sn)
    torch.testing.assert_close(g_sn, g_sj, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("v_mode", ["seq", "last"])
def test_opcheck_stateful_ops(v_mode: str) -> None:
    from symneuron import binding as F

    neuron = _neuron("AdEx", "hard", False)
    gen = generator(seed_of("opcheck", v_mode))
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


@pytest.mark.slow  # torch.compile (inductor) of a whole layer
def test_torch_compile_stateful_layer() -> None:
    neuron = _neuron("Izhikevich", "hard", False)
    layer = sn.NeuronLayer(neuron).double()

    def step(x: torch.Tensor) -> torch.Tensor:
        layer.reset()
        return layer(x).sum()

    compiled = torch.compile(step, fullgraph=True)
    x = 1.2 * torch.rand(6, 3, 4, generator=generator(seed_of("compile")), dtype=torch.float64)
    assert torch.equal(compiled(x), step(x))
