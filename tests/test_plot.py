"""``sn.plot``: the drawn data (scatter offsets, line data, bar heights) is what was given.

The oracles are the inputs themselves, read back element by element, histograms
counted in integers, and spikes computed outside the code under test (the layers run by
hand through ``sn.simulate``'s torch reference).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import numpy as np
import pytest
import sympy as sp
import torch
from torch import nn

import symneuron as sn
from symneuron import plot

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
plt = pytest.importorskip("matplotlib.pyplot")

tau, theta, rho = sp.symbols("tau theta rho", positive=True)
a = sp.Symbol("a", real=True)
LIF = sn.Neuron(sn.V + (sn.X - sn.V) / tau, params={tau: 2.0})
THRESHOLD_LIF = sn.Neuron(
    sn.V + (sn.X - sn.V) / tau, params={tau: 2.0, theta: 0.7}, v_threshold=theta
)
ADAPTIVE = sn.Neuron(  # ALIF-like: the threshold rises with the adaptation state a
    sn.V + (sn.X - sn.V) / tau,
    params={tau: 2.0, rho: 0.9},
    states={a: sn.State(update=rho * a, on_spike=a + (1 - rho) * sn.S)},
    v_threshold=1 + 0.5 * a,
    v_reset=None,
)


@pytest.fixture(autouse=True)
def close_figures() -> Iterator[None]:
    yield
    plt.close("all")


def histogram(spikes: torch.Tensor, bins: int) -> list[int]:
    """Integer counts: a neuron that fired c of T steps falls in bin min(c*bins // T, bins-1)."""
    steps = spikes.shape[0]
    counts = spikes.reshape(steps, -1).sum(0).round().long()
    index = torch.clamp(counts * bins // steps, max=bins - 1)
    return [int((index == k).sum()) for k in range(bins)]


def random_spikes(seed: int, shape: tuple[int, ...], p: float = 0.3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=gen) < p).float()


def test_raster_marks_every_spike_at_its_step_and_neuron() -> None:
    spikes = random_spikes(1, (9, 2, 3))  # [T, *shape]: neurons numbered row-major
    fig = plot.raster(spikes)
    offsets = fig.axes[0].collections[0].get_offsets()
    drawn = {(int(t), int(n)) for t, n in offsets}
    expected = {
        (t, 3 * i + j) for t in range(9) for i in range(2) for j in range(3) if spikes[t, i, j] == 1
    }
    assert len(offsets) == len(expected) > 0
    assert drawn == expected
    assert fig.axes[0].get_xlim() == (-0.5, 8.5)
    assert fig.axes[0].get_ylim() == (-0.5, 5.5)


def test_raster_draws_on_the_callers_axes_and_returns_their_figure() -> None:
    fig, (top, bottom) = plt.subplots(2, 1)
    spikes = random_spikes(2, (5, 4))
    assert plot.raster(spikes, ax=bottom, title="mine") is fig
    assert len(top.collections) == 0 and len(bottom.collections) == 1
    assert bottom.get_title() == "mine"
    assert plot.raster(spikes.numpy(), ax=top) is fig  # NumPy arrays too


def test_raster_rejects_membrane_potentials_and_bad_input() -> None:
    with pytest.raises(ValueError, match=r"spikes \(0 or 1\).*not v_seq"):
        plot.raster(torch.full((4, 3), 0.25))
    with pytest.raises(TypeError, match="torch.Tensor or numpy array, got list"):
        plot.raster([[0, 1]])
    with pytest.raises(ValueError, match=r"\[T, \*shape\] with T >= 1"):
        plot.raster(torch.zeros(0, 3))
    with pytest.raises(ValueError, match="one per panel"):
        plot.raster(torch.zeros(3, 2), ax=[None, None])


def test_traces_draw_v_of_the_chosen_neurons_and_the_threshold_line() -> None:
    gen = torch.Generator().manual_seed(3)
    v_seq = torch.rand(12, 2, 2, generator=gen, dtype=torch.float64)
    fig = plot.traces(v_seq, threshold=0.7, neurons=[1, 3])
    axis = fig.axes[0]
    *traces, line = axis.lines
    flat = v_seq.reshape(12, 4)
    for trace, n in zip(traces, [1, 3], strict=True):
        np.testing.assert_array_equal(trace.get_xdata(), np.arange(12))
        np.testing.assert_allclose(trace.get_ydata(), [float(flat[t, n]) for t in range(12)])
    assert list(line.get_ydata()) == [0.7, 0.7]
    assert [t.get_text() for t in axis.get_legend().get_texts()] == [
        "neuron 1",
        "neuron 3",
        "threshold",
    ]


def test_traces_threshold_from_a_neuron_at_its_params() -> None:
    v_seq = torch.zeros(4, 3)
    assert list(plot.traces(v_seq, threshold=LIF).axes[0].lines[-1].get_ydata()) == [1.0, 1.0]
    fig = plot.traces(v_seq, threshold=THRESHOLD_LIF)
    assert fig.axes[0].lines[-1].get_ydata() == pytest.approx([0.7, 0.7])
    fig = plot.traces(v_seq, threshold=THRESHOLD_LIF, params={"theta": torch.tensor(0.4)})
    assert fig.axes[0].lines[-1].get_ydata() == pytest.approx([0.4, 0.4])
    assert len(plot.traces(v_seq).axes[0].lines) == 3  # no threshold: no line
    with pytest.raises(ValueError, match=r"changes with its states \['a'\].*threshold=<float>"):
        plot.traces(v_seq, threshold=ADAPTIVE)
    with pytest.raises(TypeError, match="float or a symneuron.Neuron, got str"):
        plot.traces(v_seq, threshold="1.0")
    with pytest.raises(ValueError, match=r"indices in \[0, 3\)"):
        plot.traces(v_seq, neurons=[3])


def test_traces_of_a_neuron_with_states_one_panel_each_and_spike_marks() -> None:
    gen = torch.Generator().manual_seed(4)
    spikes, v_seq, states = sn.simulate(ADAPTIVE, 2.0 * torch.rand(20, 6, generator=gen))
    fig = plot.traces(v_seq, threshold=1.0, states=states, neurons=[0, 5], spike_seq=spikes)
    v_axis, a_axis = fig.axes
    assert a_axis.get_ylabel() == "a"
    for trace, n in zip(a_axis.lines, [0, 5], strict=True):
        np.testing.assert_allclose(trace.get_ydata(), states["a"][:, n].numpy())
    marks = [c.get_offsets() for c in v_axis.collections]
    for drawn, n in zip(marks, [0, 5], strict=True):
        steps = [t for t in range(20) if spikes[t, n] == 1]
        np.testing.assert_array_equal(drawn[:, 0], steps)
        np.testing.assert_array_equal(drawn[:, 1], [1.0] * len(steps))
    assert sum(len(m) for m in marks) > 0
    with pytest.raises(ValueError, match="one per panel"):
        plot.traces(v_seq, states=states, ax=plt.subplots()[1])


def test_rates_histograms_each_layer_per_neuron_and_sample() -> None:
    layers = {"a": random_spikes(5, (10, 4, 8), 0.2), "b": random_spikes(6, (10, 4, 3), 0.6)}
    fig = plot.rates(layers, bins=5)
    assert len(fig.axes) == 2
    for axis, (name, spikes) in zip(fig.axes, layers.items(), strict=True):
        rate = spikes.numpy().reshape(10, -1).sum(0) / 10
        assert [p.get_height() for p in axis.patches] == histogram(spikes, 5)
        assert [p.get_x() for p in axis.patches] == pytest.approx([0, 0.2, 0.4, 0.6, 0.8])
        assert axis.get_title().startswith(f"{name}: mean rate {rate.mean():.3f}")
    fig = plot.rates([layers["a"]])
    assert fig.axes[0].get_title().startswith("layer 0:")
    fig, grid = plt.subplots(1, 2)  # an array of Axes, as plt.subplots gives it
    assert plot.rates(layers, ax=grid) is fig
    assert all(len(axis.patches) == 20 for axis in grid)


def test_rates_of_a_model_record_its_layers_with_hooks() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 7), sn.NeuronLayer(LIF), nn.Linear(7, 4), sn.NeuronLayer(LIF))
    x = 3 * torch.rand(12, 6, 5, generator=torch.Generator().manual_seed(7))
    fig = plot.rates(net, x, bins=4)
    assert all(not layer._forward_hooks for layer in net)
    with torch.no_grad():  # the oracle: the same layers run by hand on the torch reference
        hidden, _ = sn.simulate(LIF, net[0](x), backend="torch")
        output, _ = sn.simulate(LIF, net[2](hidden), backend="torch")
    for axis, name, spikes in zip(fig.axes, ["1", "3"], [hidden, output], strict=True):
        assert [p.get_height() for p in axis.patches] == histogram(spikes, 4)
        assert axis.get_title().startswith(f"{name}: ")
    assert hidden.sum() > 0


def test_rates_of_a_single_step_layer_stack_its_calls_over_time() -> None:
    class Loop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell = sn.NeuronLayer(LIF, step_mode="s")

        def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
            self.cell.reset()
            return torch.stack([self.cell(x) for x in x_seq])

    x = 2.5 * torch.rand(9, 16, generator=torch.Generator().manual_seed(8))
    fig = plot.rates(Loop(), x, bins=9)
    spikes, _ = sn.simulate(LIF, x, backend="torch")
    assert [p.get_height() for p in fig.axes[0].patches] == histogram(spikes, 9)


def test_rates_errors_name_the_fix() -> None:
    net = nn.Sequential(nn.Linear(3, 3), sn.NeuronLayer(LIF))
    with pytest.raises(TypeError, match=r"needs the model's input x"):
        plot.rates(net)
    with pytest.raises(ValueError, match="holds no symneuron.NeuronLayer"):
        plot.rates(nn.Linear(3, 3), torch.rand(2, 3))
    with pytest.raises(TypeError, match=r"only used with a model"):
        plot.rates([torch.zeros(3, 2)], torch.zeros(3))
    with pytest.raises(ValueError, match="2 Axes"):
        plot.rates({"a": torch.zeros(3, 2), "b": torch.zeros(3, 2)}, ax=plt.subplots()[1])
    with pytest.raises(ValueError, match="bins must be a positive int"):
        plot.rates([torch.zeros(3, 2)], bins=0)
    with pytest.raises(TypeError, match="got int"):
        plot.rates(3)
    with pytest.raises(ValueError, match="no layers"):
        plot.rates({})


def test_without_matplotlib_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r"pip install symneuron\[plot\]"):
        plot.raster(torch.zeros(3, 2))
