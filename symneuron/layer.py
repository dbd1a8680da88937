"""NeuronLayer: a thin ``nn.Module`` around :func:`symneuron.simulate`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .neuron import Neuron
from .simulate import BACKENDS, simulate
from .validate import named

__all__ = ["NeuronLayer"]

_STEP_MODES = ("m", "s")


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
        self.store_v_seq = store_v_seq
        self._register_params(params or {})
        self.v: torch.Tensor | None = None
        self.v_seq: torch.Tensor | None = None
        #: The extra states' values after the last call (name -> [*shape]), if any.
        self.states: dict[str, torch.Tensor] = {}

    def _register_params(self, params: Mapping[Any, float | torch.Tensor]) -> None:
        values: dict[str, float | torch.Tensor] = dict(self.neuron.params)
        values.update(named(params, "parameter", self.neuron.params))
        for name, value in values.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                tensor = value.detach().clone()
            else:
                tensor = torch.tensor(float(value), dtype=torch.get_default_dtype())
            if not bool(torch.isfinite(tensor).all()):
                raise ValueError(f"Parameter {name!r} must be finite, got {value}")
            if name in self.neuron.learnable:
                self.register_parameter(name, nn.Parameter(tensor))
            else:
                self.register_buffer(name, tensor)

    def param_values(self) -> dict[str, torch.Tensor]:
        """Current parameter tensors by name (parameters and buffers)."""
        return {name: getattr(self, name) for name in self.neuron.params}

    def reset(self) -> None:
        """Forget the membrane state and any extra states (call between sequences)."""
        self.v = None
        self.v_seq = None
        self.states = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_seq = x.unsqueeze(0) if self.step_mode == "s" else x
        store = self.store_v_seq and self.step_mode == "m"
        result = simulate(
            self.neuron,
            x_seq,
            self.v,
            self.param_values(),
            backend=self.backend,
            store_v_seq=store,
            states=self.states or None,
        )
        spikes, v_seq = result[0], result[1]
        if self.neuron.states:
            self.states = {name: seq[-1] for name, seq in result[2].items()}
        self.v = v_seq[-1]
        self.v_seq = v_seq if store else None
        return spikes[0] if self.step_mode == "s" else spikes

    def extra_repr(self) -> str:
        return f"{self.neuron!r}, backend={self.backend!r}, step_mode={self.step_mode!r}"
