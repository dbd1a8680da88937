"""NeuronLayer: a thin ``nn.Module`` around :func:`symneuron.simulate`."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .neuron import Neuron
from .simulate import BACKENDS, simulate
from .validate import finite_float, flag, named

__all__ = ["NeuronLayer"]

_STEP_MODES = ("m", "s")
_MISSING = object()


class NeuronLayer(nn.Module):
    """A layer of spiking neurons with memory ``v`` between calls.

    Parameters
    ----------
    neuron : Neuron
    backend : {"auto", "cuda", "cpu", "torch"}
    step_mode : {"m", "s"}
        ``"m"`` takes ``x_seq`` [T, *shape]; ``"s"`` takes one step [*shape] and
        runs it through the same kernels.
    store_v_seq : bool
        Keep V of every step of the last call in ``self.v_seq`` (multi-step mode).
    params : mapping, optional
        Initial values (float, or tensor for per-channel/per-neuron values).
        Learnable params become ``nn.Parameter`` named after their symbols; the
        others are buffers.
    check_finite : bool
        Raise :class:`~symneuron.validate.NonFiniteError` naming the first step and
        neuron at which V (or an extra state) became NaN or ±inf (see
        :func:`symneuron.simulate`).

    Notes
    -----
    ``copy.deepcopy(layer)`` works at any time; the copy's stored state is detached
    from the autograd graph of the original's last call.

    Examples
    --------
    >>> import torch, symneuron as sn
    >>> layer = sn.NeuronLayer(sn.models.PLIF())
    >>> spikes = layer(torch.rand(4, 2, 8))
    >>> layer.reset()
    """

    def __init__(
        self,
        neuron: Neuron,
        *,
        backend: str = "auto",
        step_mode: str = "m",
        store_v_seq: bool = False,
        params: Mapping[Any, float | torch.Tensor] | None = None,
        check_finite: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(neuron, Neuron):
            raise TypeError(f"neuron must be a symneuron.Neuron, got {type(neuron).__name__}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if step_mode not in _STEP_MODES:
            raise ValueError(
                f"step_mode must be 'm' (multi-step) or 's' (single), got {step_mode!r}"
            )
        self.neuron = neuron
        self.backend = backend
        self.step_mode = step_mode
        self.store_v_seq = flag(store_v_seq, "store_v_seq")
        self.check_finite = flag(check_finite, "check_finite")
        #: the params' names as a plain tuple (Dynamo of torch 2.4 cannot iterate the
        #: neuron's read-only mapping)
        self._param_names = tuple(neuron.params)
        self._register_params(params or {})
        self.v: torch.Tensor | None = None
        self.v_seq: torch.Tensor | None = None
        #: The extra states' values after the last call (name -> [*shape]), if any.
        self.states: dict[str, torch.Tensor] = {}

    def _register_params(self, params: Mapping[Any, float | torch.Tensor]) -> None:
        values: dict[str, float | torch.Tensor] = dict(self.neuron.params)
        values.update(named(params, "parameter", self.neuron.params))
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                if not value.is_floating_point():
                    raise TypeError(
                        f"Parameter {name!r} must be a floating-point tensor, got "
                        f"{value.dtype}; use .float()"
                    )
                tensor = value.detach().clone()
            else:
                value = finite_float(value, f"Parameter {name!r}")
                tensor = torch.tensor(value, dtype=torch.get_default_dtype())
            if not bool(torch.isfinite(tensor).all()):
                raise ValueError(f"Parameter {name!r} must be finite, got {value}")
            if name in self.neuron.learnable:
                self.register_parameter(name, nn.Parameter(tensor))
            else:
                self.register_buffer(name, tensor)

    def param_values(self) -> dict[str, torch.Tensor]:
        """Current parameter tensors by name (parameters and buffers)."""
        if torch.compiler.is_compiling():
            return {name: getattr(self, name) for name in self._param_names}
        # the tables nn.Module.__getattr__ would search, read directly (host time)
        params, buffers = self._parameters, self._buffers
        out: dict[str, torch.Tensor] = {}
        for name in self._param_names:
            value = params[name] if name in params else buffers.get(name, _MISSING)
            out[name] = getattr(self, name) if value is _MISSING else value  # type: ignore[assignment]
        return out

    def _keep(self, v: torch.Tensor | None, v_seq: torch.Tensor | None, states: Any) -> None:
        """Set the memory: plain attributes, set without nn.Module.__setattr__'s search of
        its tables (host time) outside compilation."""
        if torch.compiler.is_compiling():
            self.v, self.v_seq, self.states = v, v_seq, states
        else:
            self.__dict__.update(v=v, v_seq=v_seq, states=states)

    def reset(self) -> None:
        """Forget the membrane state and any extra states (call between sequences)."""
        self._keep(None, None, {})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.step_mode == "s":
            if isinstance(x, torch.Tensor) and x.dim() == 0:
                raise ValueError(
                    "A single-step layer (step_mode='s') takes one step's input [*shape] "
                    "with at least 1 dim, got a 0-dim tensor; use x.reshape(1)."
                )
            x_seq = x.unsqueeze(0)
        else:
            x_seq = x
        if isinstance(self.v, torch.Tensor) and isinstance(x_seq, torch.Tensor):
            if self.v.shape != x_seq.shape[1:] and x_seq.dim() >= 2:
                raise ValueError(
                    f"This layer holds V of shape {tuple(self.v.shape)} from the last sequence, "
                    f"but the input's shape per step is {tuple(x_seq.shape[1:])}: call "
                    "layer.reset() before each new sequence (on every NeuronLayer of the model)."
                )
        store = self.store_v_seq and self.step_mode == "m"
        result = simulate(
            self.neuron,
            x_seq,
            self.v,
            self.param_values(),
            backend=self.backend,
            store_v_seq=store,
            states=self.states or None,
            check_finite=self.check_finite,
        )
        spikes, v_seq = result[0], result[1]
        if x_seq.shape[0] == 0:  # no step: the memory stays as it was
            self._keep(self.v, v_seq if store else None, self.states)
            return spikes
        states = self.states
        if self.neuron.states:
            states = {name: seq[-1] for name, seq in result[2].items()}
        self._keep(v_seq[-1], v_seq if store else None, states)
        return spikes[0] if self.step_mode == "s" else spikes

    def __deepcopy__(self, memo: dict[int, Any]) -> NeuronLayer:
        """A deep copy whose stored state is detached (a tensor inside an autograd graph
        cannot be deep-copied)."""
        state = dict(self.__dict__)
        state["v"] = _detached(self.v)
        state["v_seq"] = _detached(self.v_seq)
        state["states"] = {name: value.detach() for name, value in self.states.items()}
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(state, memo))
        return new

    def extra_repr(self) -> str:
        return f"{self.neuron!r}, backend={self.backend!r}, step_mode={self.step_mode!r}"


def _detached(value: torch.Tensor | None) -> torch.Tensor | None:
    return None if value is None else value.detach()
