"""Recurrent layers through NIR: cyclic graphs out and in, and snnTorch's RLeaky/RSynaptic.

Oracles: the original symneuron network for round trips; a float64 loop written here
from NIR's LIF equation for a hand-built cyclic graph; snnTorch 1.0.0 (an outside
library) simulating its own RLeaky/RSynaptic, and running our export through its
importer (nirtorch 2.6 executes the cycle).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import symneuron as sn

nir = pytest.importorskip("nir")
snir = pytest.importorskip("symneuron.nir")

DT = 1e-3
SNN_DT = 1e-4  # snnTorch 1.0.0's converters hard-code dt = 1e-4
F64 = torch.float64
SNNTORCH_EDGES = [("input", "lif"), ("lif", "w_rec"), ("w_rec", "lif"), ("lif", "output")]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _stateful(net: nn.Module) -> list[nn.Module]:
    return [m for m in net.modules() if isinstance(m, (sn.NeuronLayer, sn.RecurrentNeuronLayer))]


def _steps(net: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(output [T, ...], V [T, ...] of every recurrent layer), one step per call from reset."""
    recurrent = [m for m in net.modules() if isinstance(m, sn.RecurrentNeuronLayer)]
    for layer in _stateful(net):
        layer.reset()
    outs, vs = [], []
    with torch.no_grad():
        for t in range(x.shape[0]):
            outs.append(net(x[t : t + 1])[0])
            vs.append([layer.cell.v.clone() for layer in recurrent])
    return torch.stack(outs), [torch.stack(v) for v in zip(*vs, strict=True)]


def _recurrent(neuron: sn.Neuron, size: int, seed: int, scale: float, **kw) -> nn.Module:
    torch.manual_seed(seed)
    layer = sn.RecurrentNeuronLayer(neuron, size, **kw)
    with torch.no_grad():
        layer.weight.mul_(scale)
    return layer


def _tau(low: float, high: float, n: int, seed: int) -> torch.Tensor:
    return low + (high - low) * torch.rand(n, generator=_gen(seed), dtype=F64)


CASES = {
    "LIF_bias": (
        lambda: _recurrent(
            sn.models.LIF(), 6, 1, 2.0, bias=True, params={"tau": _tau(1.5, 4, 6, 1)}
        ),
        "LIF",
        "Affine",
    ),
    "LIF_no_decay_input_masked": (
        lambda: _recurrent(
            sn.models.LIF(decay_input=False, tau=3.0, v_reset=-0.1),
            6,
            2,
            1.0,
            mask=1 - torch.eye(6),
        ),
        "LIF",
        "Linear",
    ),
    "PLIF": (lambda: _recurrent(sn.models.PLIF(), 6, 3, 2.0), "LIF", "Linear"),
    "CuLIF_frozen": (
        lambda: _recurrent(sn.models.CuLIF(), 6, 4, 2.0, learn_weight=False),
        "CubaLIF",
        "Linear",
    ),
    "IF": (lambda: _recurrent(sn.models.IF(), 6, 5, 0.5), "IF", "Linear"),
    "Threshold": (lambda: _recurrent(sn.models.LIF(tau=1.0), 6, 6, 2.0), "Threshold", "Linear"),
}


def _round_trip(net: nn.Module, x: torch.Tensor, method: str) -> tuple:
    """Export and load in float64: identical spikes, V to 1e-12; returns (graph, spikes)."""
    net = net.to(F64)
    graph = snir.export(net, x, dt=DT, method=method)
    loaded = snir.load(graph, dt=DT, method=method, dtype=F64)
    out0, v0 = _steps(net, x)
    out1, v1 = _steps(loaded, x)
    assert torch.equal(out0, out1)
    assert len(v0) == len(v1) == 1
    assert (v0[0] - v1[0]).abs().max().item() < 1e-12
    return graph, loaded


@pytest.mark.parametrize("method", ["euler", "exp_euler"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_recurrent_layer_round_trips_as_snntorch_writes_it(case: str, method: str) -> None:
    make, neuron_kind, weight_kind = CASES[case]
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 6), make(), nn.Linear(6, 3))
    x = 4 * torch.rand(25, 3, 5, generator=_gen(10), dtype=F64)
    graph, loaded = _round_trip(net, x, method)
    sub = graph.nodes["1"]
    assert type(sub).__name__ == "NIRGraph" and sorted(sub.edges) == sorted(SNNTORCH_EDGES)
    assert [type(sub.nodes[k]).__name__ for k in ("input", "lif", "w_rec", "output")] == [
        "Input",
        neuron_kind,
        weight_kind,
        "Output",
    ]
    assert isinstance(loaded.node("1"), sn.RecurrentNeuronLayer)
    spikes = _steps(net[:2], x)[0]
    with torch.no_grad():
        net[1].weight.zero_()
    assert 0 < float(spikes.mean()) < 0.9
    assert not torch.equal(spikes, _steps(net[:2], x)[0])  # the recurrent edge mattered


def test_write_read_and_export_again(tmp_path) -> None:
    """nir.write/read keeps the cycle; the loaded module exports to the same graph."""
    net = nn.Sequential(nn.Linear(5, 6), CASES["LIF_bias"][0]()).to(F64)
    x = 4 * torch.rand(20, 2, 5, generator=_gen(11), dtype=F64)
    graph = snir.export(net, x, dt=DT)
    nir.write(tmp_path / "rnn.nir", graph)
    back = nir.read(tmp_path / "rnn.nir")
    assert sorted(back.nodes["1"].edges) == sorted(SNNTORCH_EDGES)
    loaded = snir.load(back, dt=DT, dtype=F64)
    assert torch.equal(_steps(loaded, x)[0], _steps(net, x)[0])
    again = snir.export(loaded, x, dt=DT)
    assert sorted(again.edges) == sorted(graph.edges)
    for field in ("weight", "bias"):
        np.testing.assert_array_equal(
            getattr(again.nodes["1"].nodes["w_rec"], field),
            getattr(graph.nodes["1"].nodes["w_rec"], field),
        )


def _hand_built() -> tuple:
    """input -> a -> lif <-> w_rec (Affine), lif -> output and lif -> b -> output: flat."""
    rng = np.random.default_rng(7)
    a, w, b, bias = (
        rng.normal(size=(6, 4)),
        rng.normal(size=(6, 6)),
        rng.normal(size=(6, 6)),
        rng.normal(size=6) * 0.2,
    )
    lif = dict(
        tau=np.full(6, 2e-3),
        r=np.full(6, 1.5),
        v_leak=np.full(6, 0.1),
        v_threshold=np.ones(6),
        v_reset=np.zeros(6),
    )
    nodes = {
        "input": nir.Input(input_type={"input": np.array([4])}),
        "a": nir.Linear(weight=a),
        "lif": nir.LIF(**lif),
        "w_rec": nir.Affine(weight=w, bias=bias),
        "b": nir.Linear(weight=b),
        "output": nir.Output(output_type={"output": np.array([6])}),
    }
    edges = [
        ("input", "a"),
        ("a", "lif"),
        ("lif", "w_rec"),
        ("w_rec", "lif"),
        ("lif", "b"),
        ("b", "output"),
        ("lif", "output"),
    ]
    return nir.NIRGraph(nodes=nodes, edges=edges), [torch.tensor(m) for m in (a, w, bias, b)]


def test_flat_cycle_loads_and_matches_the_equations() -> None:
    graph, (a, w, bias, b) = _hand_built()
    net = snir.load(graph, dt=DT, dtype=F64)
    (layer,) = [m for m in net.modules() if isinstance(m, sn.RecurrentNeuronLayer)]
    got: list[torch.Tensor] = []
    layer.register_forward_hook(lambda m, i, out: got.append(out))
    x = 1.5 * torch.rand(30, 3, 4, generator=_gen(12), dtype=F64)
    v, s, spikes = torch.zeros(3, 6, dtype=F64), torch.zeros(3, 6, dtype=F64), []
    for xt in x:  # NIR's LIF, Euler with dt/tau = 1/2: v += (v_leak - v + r*I)/2
        h = v + (0.1 - v + 1.5 * (xt @ a.T + s @ w.T + bias)) / 2
        s = (h > 1.0).to(F64)
        v = torch.where(s > 0, torch.zeros_like(h), h)
        spikes.append(s)
    want = torch.stack(spikes)
    assert 0 < float(want.mean()) < 0.9
    out = net(x)
    assert torch.equal(got[0], want)
    torch.testing.assert_close(out, want @ b.T + want, rtol=0, atol=1e-12)
    net.reset()  # a new sequence (of another batch size) starts from s = 0 and V = 0
    net(x[:, :2])
    assert torch.equal(got[1], want[:, :2])


# -- snnTorch through NIR ------------------------------------------------------------------


def _cast_linear_inputs(net: nn.Module) -> nn.Module:
    """snnTorch's spikes are float32: cast what enters each nn.Linear to float64."""
    for mod in net.modules():
        if isinstance(mod, nn.Linear):
            mod.register_forward_pre_hook(lambda m, args: tuple(t.to(F64) for t in args))
    return net.to(F64)


def _snntorch_steps(step, x: torch.Tensor, neuron: nn.Module) -> tuple:
    """(spikes [T, ...], V [T, ...]) of ``step(x[t])`` called for every t, V read from
    snnTorch's ``neuron.mem`` after each step."""
    spikes, mems = [], []
    with torch.no_grad():
        for xt in x:
            spikes.append(step(xt).to(F64))
            mems.append(neuron.mem.clone())
    return torch.stack(spikes), torch.stack(mems)


def _compare(ours: nn.Module, x: torch.Tensor, spikes: torch.Tensor, mem: torch.Tensor) -> None:
    out, (v,) = _steps(ours, x)
    assert 0.05 < float(spikes.mean()) < 0.9
    assert torch.equal(out, spikes)
    assert (v - mem).abs().max().item() < 1e-12


def test_snntorch_rleaky_export_loads_into_the_recurrent_layer() -> None:
    """RLeaky (beta = 1 - 1/tau, reset to zero at the spike): snnTorch writes the cycle
    flat ("1.lif" <-> "1.w_rec", an Affine with the recurrent bias); it loads as a
    RecurrentNeuronLayer that gives snnTorch's own spikes, V to 1e-12, in float64."""
    snn = pytest.importorskip("snntorch")
    export_nir = pytest.importorskip("snntorch.export_nir")
    torch.manual_seed(8)
    rleaky = snn.RLeaky(
        beta=torch.tensor(0.8, dtype=F64),
        linear_features=6,
        init_hidden=True,
        reset_mechanism="zero",
        reset_delay=False,
    )
    theirs = _cast_linear_inputs(nn.Sequential(nn.Linear(5, 6), rleaky))
    graph = export_nir.export_to_nir(theirs, torch.zeros(5, dtype=F64))
    assert {("1.lif", "1.w_rec"), ("1.w_rec", "1.lif")} <= set(graph.edges)
    x = 4 * torch.rand(30, 4, 5, generator=_gen(13), dtype=F64)
    spikes, mem = _snntorch_steps(theirs, x, rleaky)
    ours = snir.load(graph, dt=SNN_DT, dtype=F64)
    assert isinstance(ours.node("1.lif"), sn.RecurrentNeuronLayer)
    _compare(ours, x, spikes, mem)


def test_snntorch_rsynaptic_export_loads_into_the_recurrent_layer() -> None:
    """RSynaptic's export (CubaLIF <-> Affine) against snnTorch's Synaptic with the
    RSynaptic's recurrent nn.Linear around it (RSynaptic's own forward cannot reset at
    the spike: with reset_delay=False snnTorch 1.0.0 raises a TypeError)."""
    snn = pytest.importorskip("snntorch")
    export_nir = pytest.importorskip("snntorch.export_nir")
    torch.manual_seed(9)
    alpha, beta = torch.tensor(0.7, dtype=F64), torch.tensor(0.85, dtype=F64)
    rsyn = snn.RSynaptic(
        alpha=alpha, beta=beta, linear_features=6, init_hidden=True, reset_mechanism="zero"
    )
    theirs = _cast_linear_inputs(nn.Sequential(nn.Linear(5, 6), rsyn))
    graph = export_nir.export_to_nir(theirs, torch.zeros(5, dtype=F64))
    synaptic = snn.Synaptic(
        alpha=alpha, beta=beta, init_hidden=True, reset_mechanism="zero", reset_delay=False
    )
    fc, recurrent = theirs[0], rsyn.recurrent
    spk = torch.zeros(4, 6, dtype=F64)

    def step(xt: torch.Tensor) -> torch.Tensor:
        nonlocal spk
        spk = synaptic(fc(xt) + recurrent(spk)).to(F64)
        return spk

    x = 2 * torch.rand(30, 4, 5, generator=_gen(14), dtype=F64)
    spikes, mem = _snntorch_steps(step, x, synaptic)
    ours = snir.load(graph, dt=SNN_DT, dtype=F64)
    assert ours.node("1.lif").cell.neuron.name == "NIR_CubaLIF"
    _compare(ours, x, spikes, mem)


def _synaptic(alpha: float, beta: float) -> sn.Neuron:
    """snnTorch's Synaptic as a symneuron neuron: Ĩ = αI + X, H = βV + Ĩ, reset to 0."""
    import sympy as sp

    a, b, i = sp.symbols("alpha beta I")
    current = a * i + sn.X
    return sn.Neuron(
        b * sn.V + current, params={a: alpha, b: beta}, states={i: sn.State(update=current)}
    )


@pytest.mark.parametrize("neuron", ["LIF", "Synaptic"])
def test_our_export_runs_in_snntorch(neuron: str) -> None:
    """Our nested subgraph through snnTorch's import_from_nir (a Leaky or Synaptic and an
    nn.Linear in a cycle that nirtorch 2.6 runs, its state passed from step to step):
    the same spikes, V to 1e-12, in float64. Decays 0.75 and 0.5 are exact in float32,
    where snnTorch's importer keeps them."""
    import_nir = pytest.importorskip("snntorch.import_nir")
    make = {
        "LIF": lambda: sn.models.LIF(tau=4.0, decay_input=False),
        "Synaptic": lambda: _synaptic(0.75, 0.5),
    }[neuron]
    net = nn.Sequential(nn.Linear(5, 6), _recurrent(make(), 6, 10, 2.0)).to(F64)
    x = 3 * torch.rand(30, 4, 5, generator=_gen(15), dtype=F64)
    graph = snir.export(net, x, dt=SNN_DT)
    theirs = _cast_linear_inputs(import_nir.import_from_nir(graph))
    state = None

    def step(xt: torch.Tensor) -> torch.Tensor:
        nonlocal state
        out, state = theirs(xt, state)
        return out

    spikes, mem = _snntorch_steps(step, x, theirs.get_submodule("1.lif"))
    _compare(net, x, spikes, mem)


# -- errors ----------------------------------------------------------------------------------


def _cycle(neuron: object, weight: object, *extra: tuple[str, str]) -> object:
    """input -> n <-> w -> ... ; n -> output, plus ``extra`` edges."""
    nodes = {
        "input": nir.Input(input_type={"input": np.array([3])}),
        "n": neuron,
        "w": weight,
        "output": nir.Output(output_type={"output": np.array([3])}),
    }
    edges = [("input", "n"), ("n", "w"), ("w", "n"), ("n", "output"), *extra]
    return nir.NIRGraph(nodes=nodes, edges=edges)


def _lif(n: int = 3) -> object:
    return nir.LIF(
        tau=np.full(n, 2e-3),
        r=np.ones(n),
        v_leak=np.zeros(n),
        v_threshold=np.ones(n),
        v_reset=np.zeros(n),
    )


UNSUPPORTED = {
    "readout_feeds_back_v": (
        lambda: _cycle(
            nir.LI(tau=np.full(3, 2e-3), r=np.ones(3), v_leak=np.zeros(3)),
            nir.Linear(weight=np.eye(3)),
        ),
        r"'n' \(LI\) and 'w' \(Linear\)",
    ),
    "other_node_in_the_loop": (
        lambda: _cycle(_lif(), nir.Scale(scale=np.ones(3))),
        r"'n' \(LIF\) and 'w' \(Scale\)",
    ),
    "weight_with_other_edges": (
        lambda: _cycle(_lif(), nir.Linear(weight=np.eye(3)), ("w", "output")),
        r"'w' \(Linear\) feeds 'n' back but also has the edges \[\('w', 'output'\)\]",
    ),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_unsupported_cycles_name_the_supported_form(case: str) -> None:
    make, what = UNSUPPORTED[case]
    with pytest.raises(ValueError, match=what) as error:
        snir.load(make(), dt=DT)
    assert "loads one form of cycle: a spiking neuron node (LIF, IF, CubaLIF" in str(error.value)


def test_a_longer_loop_and_two_recurrent_edges_are_refused() -> None:
    graph = _cycle(_lif(), nir.Linear(weight=np.eye(3)))
    graph.nodes["w2"] = nir.Linear(weight=np.eye(3))
    graph.edges += [("n", "w2"), ("w2", "n")]
    with pytest.raises(ValueError, match="'n' has two recurrent edges"):
        snir.load(graph, dt=DT)
    loop = nir.NIRGraph.from_list(
        nir.Linear(weight=np.eye(3)), _lif(), nir.Linear(weight=np.eye(3))
    )
    names = list(loop.nodes)
    loop.edges.append((names[3], names[1]))  # a three-node loop back to the first Linear
    with pytest.raises(ValueError, match=r"cycle through .* not of the recurrent form.*RLeaky"):
        snir.load(loop, dt=DT)


def test_export_errors_name_the_layer_and_reason() -> None:
    soft = nn.Sequential(nn.Linear(3, 4), sn.RecurrentNeuronLayer(sn.models.LIF(v_reset=None), 4))
    with pytest.raises(ValueError, match="node '1' .*soft reset"):
        snir.export(soft, torch.zeros(1, 1, 3), dt=DT)
    wide = sn.RecurrentNeuronLayer(sn.models.LIF(), 4)
    with pytest.raises(ValueError, match=r"size 4 takes inputs \[T, B, 4\], got .*\[2, 4\]"):
        snir.export(wide, torch.zeros(1, 1, 2, 4), dt=DT)
