"""A layer of spiking neurons fed back by their own spikes through learnable weights.

Per batch row and step (``R`` = :attr:`RecurrentNeuronLayer.weight`, ``M`` the fixed
connectivity mask, row j receiving from column i as in ``nn.Linear``)::

    X_eff[t] = x[t] + (R ⊙ M)·s[t−1] (+ b),   s[−1] = 0 after reset()
    the neuron's step with X_eff in place of X;  s[t] = its spikes

Any neuron the compiler takes works: X_eff enters wherever X enters (the charge or a
state's update). On the ``cpu`` and ``cuda`` backends a sequence runs in one fused
kernel each way (:mod:`symneuron.binding_recurrent`, DESIGN §3b; custom ops under
``torch.compile``); on ``torch`` the layer loops over steps through the neuron's
single-step layer (:attr:`RecurrentNeuronLayer.cell`), the recurrent product in torch
between steps: the oracle the fused kernels are tested against. A neuron that draws
random numbers (docs/noise.md) draws the same ones both ways: the cell's generator
state, advanced by T each call, keys step t of a call at its offset + t.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import nn

from . import binding_recurrent
from .binding import Run
from .layer import NeuronLayer, _snapshot
from .neuron import Neuron
from .simulate import prepare
from .validate import flag, raise_if_not_finite

__all__ = ["RecurrentNeuronLayer"]


def _call_state(cell: NeuronLayer, compiling: bool) -> torch.Tensor | None:
    """A copy of the cell's generator state for one fused call (its backward reads it
    after the kept one has advanced), as :meth:`NeuronLayer._advance` makes; None for a
    neuron that draws nothing."""
    if not cell.neuron.draws:
        return None
    state = cast(torch.Tensor, cell.rng_state)
    return _snapshot(state) if compiling else state.clone()


def _advance(cell: NeuronLayer, steps: int) -> None:
    """The cell's kept generator state advanced by a fused call's ``steps``, in place as
    :meth:`NeuronLayer._advance` does (a captured CUDA graph advances it at each replay)."""
    with torch.no_grad():
        cast(torch.Tensor, cell.rng_state)[1] += steps


class RecurrentNeuronLayer(nn.Module):
    r"""``size`` neurons whose input adds their own previous spikes through ``weight``.

    .. math::

        X_\mathrm{eff}[t] = x[t] + (R \odot M)\, s[t-1] + b, \qquad s[-1] = 0

    Parameters
    ----------
    neuron : Neuron
    size : int
        Number of neurons; the input's last dimension.
    bias : bool
        Add a learnable bias ``b`` [size] (initialised like ``nn.Linear``'s).
    mask : Tensor [size, size], optional
        Fixed connectivity: ``weight`` is multiplied by it elementwise in every step
        (so masked weights get zero gradient). ``1 - torch.eye(size)``: no autapses.
    learn_weight : bool
        Whether ``weight`` is learnable (else frozen: ``requires_grad=False``).
    backend : {"auto", "cuda", "cpu", "torch"}
    params : mapping, optional
        The neuron's parameter values, as for :class:`~symneuron.NeuronLayer` (they live
        on :attr:`cell`).
    seed : int, optional
        For a neuron that draws random numbers (docs/noise.md), as for
        :class:`~symneuron.NeuronLayer`: :attr:`cell` keeps the generator's state (seed,
        offset) in its buffer ``rng_state`` and every call advances the offset by T, so
        two calls of T steps draw what one call of 2T draws, on every backend alike (the
        fused kernels draw step t at offset + t, the loop over steps one step a call).
        None: a seed drawn from torch's default generator when the layer is built.

    Attributes
    ----------
    weight : nn.Parameter [size, size], initialised like ``nn.Linear(size, size)``.
    cell : NeuronLayer
        The neurons (single-step), holding V, the extra states and the parameters.
    s : Tensor or None
        The spikes of the last step, fed back at the next call until :meth:`reset`.

    Examples
    --------
    >>> import torch, symneuron as sn
    >>> rnn = sn.RecurrentNeuronLayer(sn.models.LIF(), 16)
    >>> spikes = rnn(torch.rand(10, 4, 16))  # [T, batch, size]
    >>> rnn.reset()
    """

    def __init__(
        self,
        neuron: Neuron,
        size: int,
        *,
        bias: bool = False,
        mask: torch.Tensor | None = None,
        learn_weight: bool = True,
        backend: str = "auto",
        params: Mapping[Any, float | torch.Tensor] | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int (the number of neurons), got {size!r}")
        self.size = size
        self.cell = NeuronLayer(neuron, backend=backend, step_mode="s", params=params, seed=seed)
        weight = torch.empty(size, size)
        nn.init.kaiming_uniform_(weight, a=math.sqrt(5))  # as nn.Linear
        self.weight = nn.Parameter(weight, requires_grad=flag(learn_weight, "learn_weight"))
        if flag(bias, "bias"):
            bound = 1 / math.sqrt(size)
            self.bias: nn.Parameter | None = nn.Parameter(torch.empty(size).uniform_(-bound, bound))
        else:
            self.bias = None
        self.register_buffer("mask", None if mask is None else self._checked_mask(mask))
        self.s: torch.Tensor | None = None

    def _checked_mask(self, mask: Any) -> torch.Tensor:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"mask must be a tensor [size, size], got {type(mask).__name__}")
        if tuple(mask.shape) != (self.size, self.size):
            raise ValueError(
                f"mask must be [size, size] = [{self.size}, {self.size}], got "
                f"{list(mask.shape)}; e.g. 1 - torch.eye({self.size}) for no autapses"
            )
        return mask.detach().to(torch.get_default_dtype())

    @property
    def effective_weight(self) -> torch.Tensor:
        """``weight`` with the mask applied (what the recurrence multiplies by)."""
        mask: torch.Tensor | None = self.mask  # type: ignore[assignment]
        return self.weight if mask is None else self.weight * mask

    def _check_input(self, x_seq: Any) -> torch.Tensor:
        if not isinstance(x_seq, torch.Tensor) or x_seq.dim() < 2:
            shape = tuple(x_seq.shape) if isinstance(x_seq, torch.Tensor) else type(x_seq)
            raise ValueError(f"x_seq must be a tensor [T, *batch, size], got {shape}")
        if x_seq.shape[-1] != self.size:
            raise ValueError(
                f"x_seq's last dim must be the layer's size {self.size}, got shape "
                f"{tuple(x_seq.shape)}; put the neurons last ([T, batch, size])"
            )
        if tuple(self.weight.shape) != (self.size, self.size):
            raise ValueError(
                f"weight must be square [size, size] = [{self.size}, {self.size}], got "
                f"{list(self.weight.shape)}"
            )
        return x_seq

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        """Spikes [T, *batch, size] for input ``x_seq`` [T, *batch, size]."""
        x_seq = self._check_input(x_seq)
        weight = self.effective_weight.to(x_seq.dtype)
        bias = None if self.bias is None else self.bias.to(x_seq.dtype)
        s = self.s
        if s is not None and s.shape != x_seq.shape[1:]:
            raise ValueError(
                f"This layer holds spikes of shape {tuple(s.shape)} from the last sequence, "
                f"but the input's shape per step is {tuple(x_seq.shape[1:])}: call "
                "layer.reset() before each new sequence."
            )
        fused = self._fused(x_seq if bias is None else x_seq + bias, weight)
        if fused is not None:
            return fused
        out = []
        for x in x_seq:
            drive = x if s is None else x + nn.functional.linear(s, weight)
            s = self.cell(drive if bias is None else drive + bias)
            out.append(s)
        self.s = s
        return torch.stack(out) if out else x_seq.new_zeros(x_seq.shape)

    def _fused(self, drive: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
        """The sequence through the fused kernels (one launch each way), or None where
        the neuron runs on the torch reference (then the loop over steps runs it)."""
        cell, compiling = self.cell, torch.compiler.is_compiling()
        rng = _call_state(cell, compiling)
        job, check = prepare(
            cell.neuron, drive, cell.v, cell.param_values(), backend=cell.backend,
            store_v_seq=False, states=cell.states or None, check_finite=cell.check_finite,
            seed=rng,
        )  # fmt: skip
        if not isinstance(job, Run):
            return None
        if rng is not None:
            _advance(cell, drive.shape[0])
        s_init = None if self.s is None else self.s.reshape(-1)
        spikes, v_out, w_out = binding_recurrent.run(job, weight, s_init)
        if check:
            raise_if_not_finite([("V", v_out)], drive)
        shape = job.shape
        spikes = spikes.view(drive.shape[0], *shape)
        states = {}
        if w_out is not None:
            states = {name: w_out[i, -1].view(shape) for i, name in enumerate(cell.neuron.states)}
        cell._keep(v_out[-1].view(shape), None, states, compiling)
        self.s = spikes[-1]
        return spikes

    def reset(self) -> None:
        """Forget V, the extra states and the last spikes (a new sequence starts)."""
        self.cell.reset()
        self.s = None

    def __deepcopy__(self, memo: dict[int, Any]) -> RecurrentNeuronLayer:
        """A deep copy whose stored spikes are detached (as :class:`NeuronLayer`'s state)."""
        state = dict(self.__dict__)
        state["s"] = None if self.s is None else self.s.detach()
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(state, memo))
        return new

    def extra_repr(self) -> str:
        masked = ", masked" if self.mask is not None else ""
        return f"size={self.size}, bias={self.bias is not None}{masked}"
