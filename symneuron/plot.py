"""``sn.plot``: spike rasters, membrane traces and firing-rate histograms (matplotlib).

matplotlib is an optional dependency (``pip install symneuron[plot]``), imported
only when a function here draws. Every function returns the matplotlib
``Figure`` it drew on and takes an optional ``ax`` (an ``Axes``, or a sequence of
them for plots with several panels), so it composes with a figure of your own.

>>> import torch, symneuron as sn
>>> from symneuron import plot
>>> spikes, v = sn.simulate(sn.models.LIF(), 1.5 * torch.rand(16, 8))
>>> fig = plot.raster(spikes)
>>> fig = plot.traces(v, threshold=sn.models.LIF(), neurons=[0, 1])
>>> fig = plot.rates({"LIF": spikes})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import sympy as sp
import torch
from torch import nn

from .definition import Definition
from .layer import NeuronLayer

__all__ = ["raster", "traces", "rates"]

_INSTALL = "symneuron.plot needs matplotlib; install it with: pip install symneuron[plot]"


def _pyplot() -> Any:
    """``matplotlib.pyplot``, or an ImportError that names the extra to install."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError(_INSTALL) from err
    return plt


def _as_array(values: Any, name: str) -> np.ndarray:
    """A float64 NumPy copy of a tensor or array, at least 1-d and finite."""
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float64).numpy()
    elif not isinstance(values, np.ndarray):
        kind = type(values).__name__
        raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {kind}")
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 0 or array.shape[0] == 0:
        raise ValueError(f"{name} must be [T, *shape] with T >= 1, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} holds NaN or inf values")
    return array


def _flat(array: np.ndarray) -> np.ndarray:
    """[T, *shape] -> [T, N] (neurons in row-major order of ``shape``)."""
    return array.reshape(array.shape[0], -1)


def _spikes(values: Any, name: str) -> np.ndarray:
    """A 0/1 spike array [T, N]; other values raise (a common slip: passing v_seq)."""
    array = _flat(_as_array(values, name))
    odd = array[(array != 0) & (array != 1)]
    if odd.size:
        raise ValueError(
            f"{name} must hold spikes (0 or 1), got values like {odd[0]:.4g}; pass the "
            "spike_seq that sn.simulate or a NeuronLayer returns, not v_seq."
        )
    return array


def _axes(ax: Any, count: int, sharex: bool = True) -> tuple[Any, list[Any]]:
    """``(figure, [Axes] * count)``: new ones, or the caller's ``ax`` checked for length."""
    if ax is None:
        fig, made = _pyplot().subplots(count, 1, sharex=sharex, squeeze=False)
        return fig, list(made[:, 0])
    if isinstance(ax, np.ndarray):  # e.g. plt.subplots(2, 2)[1]
        axes = list(ax.ravel())
    else:
        axes = list(ax) if isinstance(ax, Sequence) else [ax]
    if len(axes) != count:
        raise ValueError(f"ax must give {count} Axes (one per panel), got {len(axes)}")
    return axes[0].figure, axes


def raster(
    spike_seq: Any,
    *,
    ax: Any = None,
    color: str = "k",
    marker: str = "|",
    size: float = 40.0,
    title: str | None = None,
) -> Any:
    """Draw a spike raster: a mark at (t, n) for every spike of neuron n at step t.

    Parameters
    ----------
    spike_seq : Tensor or ndarray [T, *shape]
        0/1 spikes, as :func:`symneuron.simulate` or a ``NeuronLayer`` returns
        them; the neurons of ``shape`` are numbered in row-major order (index
        ``spike_seq[:, b]`` first to draw one sample of a batch).
    ax : matplotlib Axes, optional
        Draw here instead of on a new figure.
    color, marker, size : matplotlib scatter style.
    title : str, optional

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import torch, symneuron as sn
    >>> spikes, _ = sn.simulate(sn.models.LIF(), 2 * torch.rand(20, 4, 10))
    >>> fig = sn.plot.raster(spikes[:, 0], title="sample 0")
    """
    spikes = _spikes(spike_seq, "spike_seq")
    fig, (axis,) = _axes(ax, 1)
    steps, neurons = np.nonzero(spikes)
    axis.scatter(steps, neurons, s=size, c=color, marker=marker)
    axis.set_xlim(-0.5, spikes.shape[0] - 0.5)
    axis.set_ylim(-0.5, spikes.shape[1] - 0.5)
    axis.set_xlabel("time step t")
    axis.set_ylabel("neuron")
    if title is not None:
        axis.set_title(title)
    return fig


def _threshold_value(threshold: Any, params: Mapping[str, Any] | None) -> float | None:
    """The threshold as a number: given, or the neuron's at its (or ``params``') values."""
    if threshold is None:
        return None
    if not isinstance(threshold, Definition):
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise TypeError(
                f"threshold must be a float or a symneuron.Neuron, got {type(threshold).__name__}"
            )
        return float(threshold)
    level = threshold.v_threshold
    if not isinstance(level, sp.Expr):
        return float(level)
    states = set(threshold.state_symbols.values()) & level.free_symbols
    if states:
        raise ValueError(
            f"{threshold.name}'s threshold {level} changes with its states "
            f"{sorted(map(str, states))}; pass threshold=<float> to draw a fixed line."
        )
    values = {**threshold.params, **(params or {})}
    subs = {}
    for name, symbol in threshold.symbols.items():
        value = values[name]
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(
                    f"param {name!r} is per-neuron; pass threshold=<float> for the line"
                )
            value = float(value.detach())
        subs[symbol] = value
    return float(level.subs(subs))


def traces(
    v_seq: Any,
    *,
    threshold: Any = None,
    spike_seq: Any = None,
    states: Mapping[str, Any] | None = None,
    neurons: Sequence[int] | None = None,
    params: Mapping[str, Any] | None = None,
    ax: Any = None,
    title: str | None = None,
) -> Any:
    """Draw membrane traces V[t] (and extra states) of some neurons, with the threshold.

    ``v_seq`` is V after each step's spike and reset, as :func:`symneuron.simulate`
    returns it: a spike shows as a drop to ``v_reset`` (soft reset: by the
    threshold), so a trace stays below the threshold line.

    Parameters
    ----------
    v_seq : Tensor or ndarray [T, *shape]
        Neurons numbered in row-major order of ``shape``.
    threshold : float or Neuron, optional
        Drawn as a dashed line. A neuron gives its ``v_threshold`` (evaluated at
        its default params, or at ``params``); a threshold that moves with a
        state (e.g. ALIF) needs a float.
    spike_seq : Tensor or ndarray [T, *shape], optional
        The spikes of the same run: each is marked with a dot on the threshold
        line (on the top of the V axis without a threshold), in its neuron's colour.
    states : mapping, optional
        Extra states by name, each [T, *shape] (the third value that
        ``sn.simulate`` returns for a neuron with states); each gets a panel
        under V.
    neurons : sequence of int, optional
        Which neurons to draw (default: the first five).
    params : mapping, optional
        Param name -> value used to evaluate a neuron's threshold
        (e.g. ``layer.param_values()``).
    ax : Axes or sequence of Axes, optional
        One Axes per panel: V first, then one per state.
    title : str, optional

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import torch, symneuron as sn
    >>> alif = sn.models.ALIF()
    >>> spikes, v, states = sn.simulate(alif, 1.5 * torch.rand(30, 8))
    >>> fig = sn.plot.traces(v, threshold=1.0, states=states, neurons=[0, 3])
    """
    content = _trace_content(v_seq, states, neurons, threshold, params, spike_seq)
    fig, axes = _axes(ax, len(content.panels))
    _draw_traces(axes, content, title)
    return fig


class _Traces(NamedTuple):
    """What :func:`traces` draws, checked: each panel [T, N] by name ("V" first), the
    neurons to draw, the threshold line (or None) and the spikes [T, N] (or None)."""

    panels: dict[str, np.ndarray]
    neurons: list[int]
    level: float | None
    spikes: np.ndarray | None


def _trace_content(
    v_seq: Any,
    states: Mapping[str, Any] | None,
    neurons: Sequence[int] | None,
    threshold: Any,
    params: Mapping[str, Any] | None,
    spike_seq: Any,
) -> _Traces:
    """``traces``' arguments checked (in this order) and converted to arrays."""
    v = _flat(_as_array(v_seq, "v_seq"))
    panels = {"V": v}
    for name, values in (states or {}).items():
        state = _flat(_as_array(values, f"states[{name!r}]"))
        if state.shape != v.shape:
            raise ValueError(f"states[{name!r}] has shape {state.shape}, v_seq {v.shape}")
        panels[name] = state
    chosen = list(range(min(5, v.shape[1]))) if neurons is None else list(neurons)
    bad = [n for n in chosen if not 0 <= n < v.shape[1]]
    if bad or not chosen:
        raise ValueError(f"neurons must be indices in [0, {v.shape[1]}), got {list(neurons or [])}")
    level = _threshold_value(threshold, params)
    spikes = None if spike_seq is None else _spikes(spike_seq, "spike_seq")
    if spikes is not None and spikes.shape != v.shape:
        raise ValueError(f"spike_seq has shape {spikes.shape}, v_seq {v.shape} (both [T, N])")
    return _Traces(panels, chosen, level, spikes)


def _draw_traces(axes: list[Any], content: _Traces, title: str | None) -> None:
    """One line per neuron on each panel; the threshold and spikes on the first (V)."""
    panels, chosen, level, spikes = content
    v = panels["V"]
    steps = np.arange(v.shape[0])
    for axis, (name, values) in zip(axes, panels.items(), strict=True):
        for n in chosen:
            axis.plot(steps, values[:, n], label=f"neuron {n}")
        axis.set_ylabel(name)
    if level is not None:
        axes[0].axhline(level, color="r", linestyle="--", label="threshold")
    if spikes is not None:
        mark = level if level is not None else float(v[:, chosen].max())
        for line, n in zip(axes[0].lines, chosen, strict=False):
            when = np.nonzero(spikes[:, n])[0]
            axes[0].scatter(when, np.full(len(when), mark), color=line.get_color(), zorder=3)
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    axes[-1].set_xlabel("time step t")
    if title is not None:
        axes[0].set_title(title)


def _record(model: nn.Module, x: Any) -> dict[str, torch.Tensor]:
    """Each NeuronLayer's spikes [T, *shape] during one ``model(x)`` call, by module name."""
    layers = {n: m for n, m in model.named_modules() if isinstance(m, NeuronLayer)}
    if not layers:
        raise ValueError(f"{type(model).__name__} holds no symneuron.NeuronLayer to record")
    outputs: dict[str, list[torch.Tensor]] = {name: [] for name in layers}
    hooks = [
        layer.register_forward_hook(lambda _m, _i, out, name=name: outputs[name].append(out))
        for name, layer in layers.items()
    ]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    recorded = {}
    for name, layer in layers.items():
        if not outputs[name]:
            raise ValueError(f"layer {name!r} did not run in model(x); nothing to plot")
        join = torch.stack if layer.step_mode == "s" else torch.cat
        recorded[name] = join(outputs[name])
    return recorded


def _layers(source: Any, x: Any) -> Mapping[str, Any]:
    """``rates``' source as spike tensors by layer name."""
    if isinstance(source, nn.Module):
        if x is None:
            raise TypeError("rates(model, x) needs the model's input x to record its layers")
        return _record(source, x)
    if x is not None:
        raise TypeError("x is only used with a model; pass rates(model, x)")
    if isinstance(source, Mapping):
        layers = dict(source)
    elif isinstance(source, Sequence) and not isinstance(source, str):
        layers = {f"layer {i}": spikes for i, spikes in enumerate(source)}
    else:
        raise TypeError(
            "source must be a mapping or sequence of spike tensors, or an nn.Module "
            f"(with x), got {type(source).__name__}"
        )
    if not layers:
        raise ValueError("rates() got no layers to plot")
    return layers


def rates(
    source: Any,
    x: Any = None,
    *,
    bins: int = 20,
    ax: Any = None,
    title: str | None = None,
) -> Any:
    """Histogram of firing rates (spikes per step, over time), one panel per layer.

    Each neuron of each sample contributes one value: the mean of its spikes over
    the time axis (axis 0). Silent and saturated neurons pile up at 0 and 1.

    Parameters
    ----------
    source : mapping, sequence or nn.Module
        Spike tensors [T, *shape] by layer name (a mapping) or in order (a
        sequence); or a model whose ``NeuronLayer`` outputs are recorded with
        forward hooks while it runs on ``x`` (under ``torch.no_grad()``).
    x : Tensor, optional
        The model's input (only with a model).
    bins : int
        Number of equal bins on [0, 1]: bin k counts the rates in [k/bins, (k+1)/bins)
        (the last one also 1).
    ax : Axes or sequence of Axes, optional
        One Axes per layer.
    title : str, optional
        Title of the first panel (each panel is labelled with its layer).

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import torch, symneuron as sn
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(4, 16), sn.NeuronLayer(sn.models.LIF()))
    >>> fig = sn.plot.rates(net, 3 * torch.rand(10, 2, 4))
    """
    layers = _layers(source, x)
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive int, got {bins!r}")
    fig, axes = _axes(ax, len(layers))
    for axis, (name, spikes) in zip(axes, layers.items(), strict=True):
        rate = _spikes(spikes, f"spikes of {name!r}").mean(axis=0)
        # bin k holds rates in [k/bins, (k+1)/bins), the last one 1 too; the 1e-9 keeps
        # rates that sit on an edge (count/T = k/bins) in the bin they open, not by rounding
        index = np.minimum(np.floor(rate * bins + 1e-9).astype(int), bins - 1)
        counts = np.bincount(index, minlength=bins)
        axis.bar(np.arange(bins) / bins, counts, width=1.0 / bins, align="edge", color="C0")
        silent = float((rate == 0).mean())
        label = f"{name}: mean rate {rate.mean():.3f}, silent {silent:.0%}"
        axis.set_title(label, fontsize="small")
        axis.set_ylabel("count")
    axes[-1].set_xlabel("firing rate (spikes per step)")
    if title is not None:
        fig.suptitle(title)
    return fig
