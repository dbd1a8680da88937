"""NIR export and load: round trips, nir.write/read, snnTorch through NIR, clear errors.

Oracles: the original symneuron network (zoo models) for round trips, the dt formulas
worked by hand, a torch + ``sn.simulate`` composition for a residual graph, and
snnTorch 1.0.0 (an outside library) for both directions through NIR.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import sympy as sp
import torch
from torch import nn

import symneuron as sn

nir = pytest.importorskip("nir")
snir = pytest.importorskip("symneuron.nir")

DT = 1e-3
F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _record(net: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list, list]:
    """(output, spikes of every NeuronLayer, V of every NeuronLayer), from a fresh state."""
    layers = [m for m in net.modules() if isinstance(m, sn.NeuronLayer)]
    spikes: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda m, i, o: spikes.append(o)) for m in layers]
    for layer in layers:
        layer.store_v_seq = True
        layer.reset()
    with torch.no_grad():
        out = net(x)
    for hook in hooks:
        hook.remove()
    return out, spikes, [layer.v_seq for layer in layers]


def _round_trip(net: nn.Module, x: torch.Tensor, method: str = "euler"):
    """Export, load, and check identical spikes and V (to 1e-12) in float64."""
    net = net.to(F64)
    graph = snir.export(net, x, dt=DT, method=method)
    loaded = snir.load(graph, dt=DT, method=method, dtype=F64)
    out0, s0, v0 = _record(net, x)
    out1, s1, v1 = _record(loaded, x)
    assert len(s0) == len(s1) and len(v0) == len(v1)
    assert torch.equal(out0, out1) or (out0 - out1).abs().max() < 1e-12
    for a, b in zip(s0, s1, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(v0, v1, strict=True):
        assert (a - b).abs().max().item() < 1e-12
    return graph, s0


def _per_neuron(low: float, high: float, n: int, seed: int) -> torch.Tensor:
    return low + (high - low) * torch.rand(n, generator=_gen(seed), dtype=F64)


def _synaptic(alpha: float, beta: float) -> sn.Neuron:
    """snnTorch's Synaptic as a symneuron neuron: Ĩ = αI + X, H = βV + Ĩ, reset to 0."""
    a, b, i = sp.symbols("alpha beta I")
    current = a * i + sn.X
    return sn.Neuron(
        b * sn.V + current, params={a: alpha, b: beta}, states={i: sn.State(update=current)}
    )


LAYERS = {
    "LIF": (
        lambda: sn.NeuronLayer(sn.models.LIF(), params={"tau": _per_neuron(1.5, 4, 6, 1)}),
        "LIF",
    ),
    "LIF_no_decay_input": (
        lambda: sn.NeuronLayer(sn.models.LIF(decay_input=False, v_reset=-0.1, tau=3.0)),
        "LIF",
    ),
    "IF": (lambda: sn.NeuronLayer(sn.models.IF()), "IF"),
    "PLIF": (
        lambda: sn.NeuronLayer(sn.models.PLIF(), params={"w": _per_neuron(-1, 1, 6, 2)}),
        "LIF",
    ),
    "ThresholdLIF": (
        lambda: sn.NeuronLayer(
            sn.models.ThresholdLIF(), params={"theta": _per_neuron(0.5, 1, 6, 3)}
        ),
        "LIF",
    ),
    "CuLIF": (lambda: sn.NeuronLayer(sn.models.CuLIF()), "CubaLIF"),
    "Threshold": (lambda: sn.NeuronLayer(sn.models.LIF(tau=1.0)), "Threshold"),
    "LI": (lambda: snir.Readout(sn.models.LIF(tau=2.5)), "LI"),
    "I": (lambda: snir.Readout(sn.models.IF()), "I"),
    "CubaLI": (lambda: snir.Readout(sn.models.CuLIF(tau_syn=3.0)), "CubaLI"),
    "Scale": (lambda: snir.Scale(_per_neuron(0.5, 2, 6, 4)), "Scale"),
    "Linear_no_bias": (lambda: nn.Linear(6, 6, bias=False), "Linear"),
}


@pytest.mark.parametrize("case", sorted(LAYERS))
def test_each_layer_round_trips(case: str) -> None:
    make, kind = LAYERS[case]
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 6), make())
    x = 2 * torch.rand(12, 3, 5, generator=_gen(10), dtype=F64)
    graph, spikes = _round_trip(net, x)
    assert type(graph.nodes["1"]).__name__ == kind
    if kind not in ("LI", "I", "CubaLI"):  # readouts never spike: V is compared instead
        assert all(s.sum() > 0 for s in spikes)  # the comparison saw spikes


def test_dt_conversion_by_hand() -> None:
    """symneuron LIF(tau=k) is NIR's LIF with tau = k*dt; r = 1 (decay_input) or k."""
    x = torch.zeros(1, 1, 3)
    for decay_input, r in ((True, 1.0), (False, 2.0)):
        layer = sn.NeuronLayer(sn.models.LIF(tau=2.0, decay_input=decay_input))
        node = snir.export(layer, x, dt=1e-3).nodes["neuronlayer"]
        np.testing.assert_allclose(node.tau, 2e-3, rtol=1e-15)
        np.testing.assert_allclose(node.r, r, rtol=1e-15)
        assert node.v_threshold[0] == np.nextafter(1.0, 0.0)  # NIR fires on v > theta
    exact = snir.export(layer, x, dt=1e-3, method="exp_euler").nodes["neuronlayer"]
    np.testing.assert_allclose(exact.tau, 1e-3 / math.log(2.0), rtol=1e-15)  # e^{-dt/tau} = 1/2
    cuba = snir.export(sn.NeuronLayer(sn.models.CuLIF(tau=2.0, tau_syn=4.0)), x, dt=0.5)
    node = cuba.nodes["neuronlayer"]
    np.testing.assert_allclose(
        [node.tau_mem[0], node.tau_syn[0], node.w_in[0], node.r[0]],
        [1.0, 2.0, 4.0, 1.0],
        rtol=1e-15,
    )
    assert (
        float(snir.export(sn.NeuronLayer(sn.models.IF()), x, dt=0.25).nodes["neuronlayer"].r[0])
        == 4.0
    )


def test_exp_euler_round_trips() -> None:
    torch.manual_seed(1)
    net = nn.Sequential(
        nn.Linear(5, 6),
        sn.NeuronLayer(sn.models.LIF(tau=3.0)),
        nn.Linear(6, 4),
        sn.NeuronLayer(sn.models.CuLIF()),
    )
    _round_trip(net, 3 * torch.rand(15, 2, 5, generator=_gen(11), dtype=F64), method="exp_euler")


def test_mlp_round_trips() -> None:
    torch.manual_seed(2)
    net = nn.Sequential(
        nn.Linear(8, 16),
        sn.NeuronLayer(sn.models.PLIF(decay_input=False)),
        nn.Linear(16, 12),
        sn.NeuronLayer(sn.models.CuLIF()),
        nn.Linear(12, 4),
        snir.Readout(sn.models.LIF()),
    )
    graph, spikes = _round_trip(net, 2 * torch.rand(20, 4, 8, generator=_gen(12), dtype=F64))
    assert [type(graph.nodes[k]).__name__ for k in "12345"] == [
        "LIF",
        "Affine",
        "CubaLIF",
        "Affine",
        "LI",
    ]
    assert all(s.sum() > 0 for s in spikes[:2])


def test_cnn_round_trips() -> None:
    torch.manual_seed(3)
    tau = _per_neuron(1.5, 3, 4, 5).reshape(4, 1, 1)  # per channel
    net = nn.Sequential(
        snir.PerStep(nn.Conv2d(2, 4, 3, padding=1)),
        sn.NeuronLayer(sn.models.LIF(), params={"tau": tau}),
        snir.PerStep(nn.AvgPool2d(2)),
        snir.PerStep(nn.Conv2d(4, 4, 3, bias=False)),
        sn.NeuronLayer(sn.models.IF()),
        snir.PerStep(nn.AvgPool2d(2, divisor_override=1), nn.Flatten(), nn.Linear(4, 3)),
        snir.Readout(sn.models.LIF()),
    )
    with torch.no_grad():
        net[0].module.weight.copy_(torch.rand(4, 2, 3, 3, generator=_gen(20)) / 4 - 0.05)
        net[3].module.weight.copy_(torch.rand(4, 4, 3, 3, generator=_gen(21)) / 8)  # IF spikes
    graph, spikes = _round_trip(net, 3 * torch.rand(10, 2, 2, 8, 8, generator=_gen(13), dtype=F64))
    kinds = [type(n).__name__ for n in graph.nodes.values()]
    assert {"Conv2d", "AvgPool2d", "SumPool2d", "Flatten"} <= set(kinds)
    assert all(s.sum() > 0 for s in spikes[:2])
    conv1d = nn.Sequential(
        snir.PerStep(nn.Conv1d(2, 3, 3, stride=2)),
        sn.NeuronLayer(sn.models.LIF()),
        snir.PerStep(nn.Flatten(), nn.Linear(27, 2)),
    )
    graph, _ = _round_trip(conv1d, 3 * torch.rand(8, 2, 2, 19, generator=_gen(14), dtype=F64))
    assert type(graph.nodes["0"]).__name__ == "Conv1d"


def _residual_graph() -> tuple:
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(6, 5)), rng.normal(size=(6, 6)) * 0.5
    lif = dict(tau=np.full(6, 2e-3), r=np.ones(6), v_leak=np.zeros(6), v_threshold=np.ones(6))
    nodes = {
        "input": nir.Input(input_type=np.array([5])),
        "a": nir.Linear(weight=a),
        "l1": nir.LIF(**lif),
        "b": nir.Linear(weight=b),
        "l2": nir.LIF(**lif),
        "output": nir.Output(output_type=np.array([6])),
    }
    edges = [("input", "a"), ("a", "l1"), ("l1", "b"), ("b", "l2"), ("l1", "l2"), ("l2", "output")]
    return nir.NIRGraph(nodes=nodes, edges=edges), torch.tensor(a), torch.tensor(b)


def test_residual_graph_loads_runs_and_exports() -> None:
    graph, a, b = _residual_graph()
    net = snir.load(graph, dt=DT, dtype=F64)
    x = 2 * torch.rand(20, 3, 5, generator=_gen(15), dtype=F64)
    # oracle: the same network from torch ops and the zoo LIF (tau = 2e-3/DT = 2 steps)
    lif = sn.models.LIF(tau=2.0, v_threshold=float(np.nextafter(1.0, 2.0)))
    s1, _ = sn.simulate(lif, x @ a.T, backend="torch")
    s2, _ = sn.simulate(lif, s1 @ b.T + s1, backend="torch")
    assert s1.sum() > 0 and s2.sum() > 0
    assert torch.equal(net(x), s2)
    again = snir.export(net, x, dt=DT)
    assert sorted(again.edges) == sorted(graph.edges)
    net.reset()
    assert torch.equal(snir.load(again, dt=DT, dtype=F64)(x), s2)


def test_write_read_round_trip(tmp_path) -> None:
    torch.manual_seed(4)
    plif = sn.NeuronLayer(sn.models.PLIF(), params={"w": _per_neuron(-1, 1, 6, 6)})
    net = nn.Sequential(nn.Linear(5, 6), plif, nn.Linear(6, 3), sn.NeuronLayer(sn.models.CuLIF()))
    net = net.to(F64)
    x = 2 * torch.rand(12, 2, 5, generator=_gen(16), dtype=F64)
    graph = snir.export(net, x, dt=DT)
    nir.write(tmp_path / "net.nir", graph)
    back = nir.read(tmp_path / "net.nir")
    assert sorted(back.edges) == sorted(graph.edges)
    for name in ("1", "3"):
        for field in ("v_threshold", "r", "v_leak"):
            np.testing.assert_array_equal(
                getattr(back.nodes[name], field), getattr(graph.nodes[name], field)
            )
    out, _, _ = _record(net, x)
    assert torch.equal(snir.load(back, dt=DT, dtype=F64)(x), out)


# -- snnTorch through NIR ------------------------------------------------------------------

SNN_DT = 1e-4  # snnTorch 1.0.0's converters hard-code dt = 1e-4


def _snntorch_run(net: nn.Module, x: torch.Tensor, layers: list) -> tuple:
    """snnTorch, step by step in float64: (output spikes, V of ``layers`` after every step)."""
    net = net.to(F64)
    for mod in net.modules():  # snnTorch's spikes are float32: cast them for the next layer
        if isinstance(mod, nn.Linear):
            mod.register_forward_pre_hook(lambda m, args: tuple(t.to(F64) for t in args))
    outs, mems = [], []
    for t in range(x.shape[0]):
        out = net(x[t])
        outs.append(out[0] if isinstance(out, tuple) else out)
        mems.append([layer.mem.clone() for layer in layers])
    return torch.stack(outs).to(F64), [torch.stack(m) for m in zip(*mems, strict=True)]


def test_nir_graph_agrees_with_snntorch() -> None:
    import_nir = pytest.importorskip("snntorch.import_nir")
    rng = np.random.default_rng(5)
    tau, tau_syn, tau_mem = 3e-4, 5e-4, 2e-4  # r = tau/dt, w_in = tau_syn/dt: snnTorch's unit gains
    graph = nir.NIRGraph.from_list(
        nir.Affine(weight=rng.normal(size=(6, 5)), bias=rng.normal(size=6) * 0.1),
        nir.LIF(
            tau=np.full(6, tau),
            r=np.full(6, tau / SNN_DT),
            v_leak=np.zeros(6),
            v_threshold=np.ones(6),
        ),
        nir.Linear(weight=rng.normal(size=(3, 6))),
        nir.CubaLIF(
            tau_syn=np.full(3, tau_syn),
            tau_mem=np.full(3, tau_mem),
            r=np.full(3, tau_mem / SNN_DT),
            v_leak=np.zeros(3),
            v_threshold=np.ones(3),
            w_in=np.full(3, tau_syn / SNN_DT),
        ),
    )
    x = torch.tensor(rng.uniform(0, 1, size=(30, 4, 5)))
    theirs = import_nir.import_from_nir(graph)
    s_ref, v_ref = _snntorch_run(theirs, x, [theirs.lif, theirs.cubalif])
    ours = snir.load(graph, dt=SNN_DT, dtype=F64)
    out, spikes, v = _record(ours, x)
    assert spikes[0].sum() > 0 and s_ref.sum() > 0
    assert torch.equal(out, s_ref)
    for a, b in zip(v, v_ref, strict=True):  # snnTorch keeps beta = 1 - dt/tau as float32
        assert (a - b).abs().max().item() < 1e-6


def test_symneuron_export_agrees_with_snntorch() -> None:
    import_nir = pytest.importorskip("snntorch.import_nir")
    torch.manual_seed(6)
    net = nn.Sequential(
        nn.Linear(5, 6),
        sn.NeuronLayer(sn.models.LIF(tau=4.0, decay_input=False)),
        nn.Linear(6, 3),
        sn.NeuronLayer(_synaptic(0.8, 0.6)),
    ).to(F64)
    with torch.no_grad():
        net[2].weight.copy_(torch.rand(3, 6, generator=_gen(19)))  # excitatory: layer 2 spikes
    x = 3 * torch.rand(30, 4, 5, generator=_gen(17), dtype=F64)
    theirs = import_nir.import_from_nir(snir.export(net, x, dt=SNN_DT))
    s_ref, v_ref = _snntorch_run(theirs, x, [theirs.get_submodule("1"), theirs.get_submodule("3")])
    out, spikes, v = _record(net, x)
    assert spikes[0].sum() > 0 and out.sum() > 0
    assert torch.equal(out, s_ref)
    for a, b in zip(v, v_ref, strict=True):  # snnTorch keeps alpha and beta as float32
        assert (a - b).abs().max().item() < 1e-6


def test_snntorch_export_loads() -> None:
    """snnTorch's exporter works with per-neuron beta/threshold and an unbatched sample; it
    writes float32 (tau = 1e-4/(1 - beta), r = tau/dt), so V agrees to float32 rounding
    (1e-5) and, on this seeded input, every spike agrees."""
    snn = pytest.importorskip("snntorch")
    export_nir = pytest.importorskip("snntorch.export_nir")
    torch.manual_seed(7)
    leaky = snn.Leaky(
        beta=torch.full((6,), 0.9),
        threshold=torch.ones(6),
        init_hidden=True,
        reset_mechanism="zero",
        reset_delay=False,
    )
    theirs = nn.Sequential(nn.Linear(5, 6), leaky)
    graph = export_nir.export_to_nir(theirs, torch.zeros(5))
    x = torch.rand(30, 4, 5, generator=_gen(18))
    s_ref, (v_ref,) = _snntorch_run(theirs, x.to(F64), [leaky])
    ours = snir.load(graph, dt=SNN_DT, dtype=F64)
    out, _, (v,) = _record(ours, x.to(F64))
    assert s_ref.sum() > 0
    assert (v - v_ref).abs().max().item() < 1e-5
    assert torch.equal(out, s_ref)


# -- errors ----------------------------------------------------------------------------------

NOT_IN_NIR = {
    "QIF": (lambda: sn.models.QIF(), "not linear"),
    "EIF": (lambda: sn.models.EIF(), "not linear"),
    "Izhikevich": (lambda: sn.models.Izhikevich(), "not linear"),
    "soft_reset": (lambda: sn.models.LIF(v_reset=None), "soft reset"),
    "ALIF": (lambda: sn.models.ALIF(v_reset=0.0), "threshold"),
}


@pytest.mark.parametrize("case", sorted(NOT_IN_NIR))
def test_inexpressible_neuron_names_node_and_reason(case: str) -> None:
    make, reason = NOT_IN_NIR[case]
    net = nn.Sequential(nn.Linear(3, 4), sn.NeuronLayer(make()))
    with pytest.raises(ValueError, match=rf"node '1' .*{reason}"):
        snir.export(net, torch.zeros(1, 1, 3), dt=DT)


def test_other_errors(monkeypatch) -> None:
    with pytest.raises(TypeError, match="ReLU has no NIR node"):
        snir.export(nn.Sequential(nn.Linear(3, 4), nn.ReLU()), torch.zeros(1, 1, 3), dt=DT)
    with pytest.raises(ValueError, match="dt must be a positive"):
        snir.export(nn.Linear(3, 4), torch.zeros(1, 1, 3), dt=0)
    delay = nir.NIRGraph.from_list(nir.Delay(delay=np.ones(3)))
    with pytest.raises(ValueError, match="'delay' of type Delay cannot be loaded"):
        snir.load(delay, dt=DT)
    graph, _, _ = _residual_graph()
    graph.edges.append(("l2", "b"))
    with pytest.raises(ValueError, match="cycle"):
        snir.load(graph, dt=DT)
    monkeypatch.setitem(sys.modules, "nir", None)
    with pytest.raises(ImportError, match=r"pip install symneuron\[nir\]"):
        snir.load(graph, dt=DT)
