"""A layer of spiking neurons fed back by their own spikes through learnable weights.

Per batch row and step (``R`` = :attr:`RecurrentNeuronLayer.weight`, ``M`` the fixed
connectivity mask, row j receiving from column i as in ``nn.Linear``)::

    X_eff[t] = x[t] + (R ⊙ M)·s[t−d] (+ b),   s[−d..−1] = 0 after reset()
    the neuron's step with X_eff in place of X;  s[t] = its spikes

Any neuron the compiler takes works: X_eff enters wherever X enters (the charge or a
state's update). On the ``cpu`` and ``cuda`` backends a sequence runs in one fused
kernel each way (:mod:`symneuron.binding_recurrent`, docs/architecture.md; custom ops under
``torch.compile``); on ``torch`` the layer loops over steps through the neuron's
single-step layer (:attr:`RecurrentNeuronLayer.cell`, its simulation from the state the
call starts from), the recurrent product in torch between steps: the oracle the fused
kernels are tested against. A neuron that draws random numbers (docs/noise.md) draws
the same ones both ways: the cell's generator state, advanced by T each call, keys step
t of a call at its offset + t. Under ``torch.utils.checkpoint`` a call starts from the
cell's :meth:`NeuronLayer.start` (V, the states and the generator state; for the
recomputation, those its first run started from) and keeps its last spikes likewise.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from . import binding_recurrent
from .binding import Run
from .binding_loop import LoopProducts
from .checkpointing import REENTRANT_FIX as _CELL_FIX
from .checkpointing import REPLAYS, checkpoint_phase
from .layer import NeuronLayer
from .neuron import Neuron
from .simulate import next_step, prepare
from .validate import dense, flag, raise_if_not_finite

__all__ = ["RecurrentNeuronLayer"]


_REENTRANT_FIX = (
    "torch.utils.checkpoint(use_reentrant=True) passes gradients only to the checkpointed "
    "function's inputs, and a RecurrentNeuronLayer's state is none of them: use "
    "use_reentrant=False, or cut the gradient through the state first (layer.s = "
    "layer.s.detach(), layer.cell.v = layer.cell.v.detach(), and each tensor of "
    "layer.cell.states; truncated backpropagation through time)."
)

#: what a call starts from: last spikes, V, extra states, checkpoint phase, generator state
Start = tuple[torch.Tensor | None, Any, dict[str, torch.Tensor], str | None, Any]
#: what a call leaves: last spikes, V, extra states
End = tuple[torch.Tensor | None, Any, dict[str, torch.Tensor]]


#: Batch rows × neurons² from which a layer called inside a CUDA graph capture runs the
#: loop over steps: on an H200 (benchmarks/recurrent.py, one training step graphed, T =
#: 100, fp32) the fused kernels took 0.90 / 2.47 / 15.95 / 35.9 ms at 64×256, 64×512,
#: 256×1024, 128×2048 (B×F) and the loop 3.32 / 3.87 / 9.73 / 14.7 ms (a torch loop
#: 5.70 / 6.35 / 12.6 / 17.5): the fused kernels read all of R for every batch row each
#: step, the loop's product once for all rows. Eager, the loop's launches cost 0.5 ms a
#: step of host time (52-74 ms at every size): the fused kernels win there (below
#: :data:`EAGER_LOOP_FROM`).
LOOP_FROM = 100_000_000
#: Batch rows × neurons² from which an eager call runs the loop over steps too: in float32
#: and float64 (the fused kernels' exact multiply-adds), and in 16-bit (on tensor cores)
#: where the layer has more batch rows than the GPU has SMs (one block per batch row then
#: runs in waves). On an H200 (benchmarks/recurrent.py, one training step eager, T = 100,
#: fused / loop ms): fp32 256 × 4096 270 / 71, 512 × 2048 138 / 44, 128 × 4096 68 / 46,
#: 64 × 4096 37 / 41, 256 × 2048 31 / 52; bf16 256 × 4096 181 / 53, 512 × 2048 72 / 55,
#: 128 × 4096 22 / 37 (docs/performance_recurrent.md, "Eager: the loop ...")
EAGER_LOOP_FROM = 2**31


def _loop_eager(rows: int, size: int, x_seq: torch.Tensor) -> bool:
    """Whether an eager call of ``rows`` batch rows of ``size`` neurons with input
    ``x_seq`` on a CUDA device runs the loop over steps (:data:`EAGER_LOOP_FROM`)."""
    if rows * size**2 < EAGER_LOOP_FROM:
        return False
    if x_seq.dtype not in (torch.float16, torch.bfloat16):
        return True
    return rows > torch.cuda.get_device_properties(x_seq.device).multi_processor_count


def _spiking_sum(s: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Σ_m R[c, m] over the neurons m with s[m] = 1: R·s as the fused kernels compute it,
    where a weight of a neuron that did not spike is not read (0·NaN would be NaN)."""
    return torch.where(s.bool().unsqueeze(-2), weight, 0).sum(-1)


def _recurrent_input(weight: torch.Tensor, deferred: bool) -> Any:
    """How the loop computes R·s[t−D] (``product(t, s)``): a matrix product a step, its
    dL/dR summed once over the sequence where ``deferred`` and not compiled
    (:class:`~symneuron.binding_loop.LoopProducts`), or where R holds a non-finite value
    the sum over the spiking neurons (the kernels' result; checked once per call, not
    where the check cannot read the value: compiled, or in a CUDA graph capture)."""
    capturing = weight.is_cuda and torch.cuda.is_current_stream_capturing()
    compiling = torch.compiler.is_compiling()
    if compiling or capturing or bool(torch.isfinite(weight).all()):
        if deferred and not compiling:
            return LoopProducts.of(weight)
        return lambda t, s: nn.functional.linear(s, weight)
    return lambda t, s: _spiking_sum(s, weight)


class RecurrentNeuronLayer(nn.Module):
    r"""``size`` neurons whose input adds their own previous spikes through ``weight``.

    .. math::

        X_\mathrm{eff}[t] = x[t] + (R \odot M)\, s[t-d] + b, \qquad s[-d..-1] = 0

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
    delay : int
        The connection's delay ``d`` in steps (>= 1): a spike at step t reaches the
        layer's input at step t + d. The layer keeps the last ``d`` steps of spikes.
    fused : bool, optional
        On the ``cpu`` and ``cuda`` backends, whether a call runs the fused kernels (one
        launch a sequence each way) or the loop over steps (a matrix product and the
        neuron's step kernel a step). None (default): the fused kernels, except inside a
        CUDA graph capture for a layer of at least :data:`LOOP_FROM` batch rows × size²,
        and eager from :data:`EAGER_LOOP_FROM` (in 16-bit, with more batch rows than the
        GPU has SMs), where the loop was measured faster (docs/performance_recurrent.md).
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
    dtype : torch.dtype, optional
        The dtype of ``weight``, ``bias``, ``mask`` and the neuron's parameters, created
        in it as ``nn.Linear(..., dtype=)`` creates its own (default: torch's default
        dtype); parameters given as floats keep their values as
        :class:`~symneuron.NeuronLayer` keeps them.
    device : torch.device or str, optional
        Where they are created.

    Attributes
    ----------
    weight : nn.Parameter [size, size], initialised like ``nn.Linear(size, size)``.
    cell : NeuronLayer
        The neurons (single-step), holding V, the extra states and the parameters.
    s : Tensor or None
        The spikes of the last ``delay`` steps, [delay, *batch, size], oldest first: what
        the next call feeds back, until :meth:`reset`.

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
        delay: int = 1,
        fused: bool | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int (the number of neurons), got {size!r}")
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 1:
            raise ValueError(
                f"delay must be an int >= 1 (steps from a spike to the input it reaches), "
                f"got {delay!r}"
            )
        self.size = size
        self.delay = delay
        self.fused = None if fused is None else flag(fused, "fused")
        self.cell = NeuronLayer(
            neuron,
            backend=backend,
            step_mode="s",
            params=params,
            seed=seed,
            dtype=dtype,
            device=device,
        )
        weight = torch.empty(size, size, dtype=dtype, device=device)  # (the cell checked them)
        nn.init.kaiming_uniform_(weight, a=math.sqrt(5))  # as nn.Linear
        self.weight = nn.Parameter(weight, requires_grad=flag(learn_weight, "learn_weight"))
        if flag(bias, "bias"):
            bound = 1 / math.sqrt(size)
            self.bias: nn.Parameter | None = nn.Parameter(
                torch.empty(size, dtype=dtype, device=device).uniform_(-bound, bound)
            )
        else:
            self.bias = None
        if mask is not None:
            mask = self._checked_mask(mask).to(dtype=dtype, device=device)
        self.register_buffer("mask", mask)
        self.s: torch.Tensor | None = None
        #: the last spikes each checkpointed call started from, until its recomputation
        #: (beside the cell's records of V, the states and the generator state)
        self._replays: list[torch.Tensor | None] = []

    def _checked_mask(self, mask: Any) -> torch.Tensor:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"mask must be a tensor [size, size], got {type(mask).__name__}")
        dense(mask, "mask")
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

    def _history(self, x_seq: torch.Tensor) -> torch.Tensor | None:
        """The kept spikes of the last ``delay`` steps, checked against this call's input
        and in its dtype and device (a kernel reads them as the input's dtype)."""
        s = self.s
        if s is None:
            return None
        expected = (self.delay, *x_seq.shape[1:])
        if tuple(s.shape) != expected:
            raise ValueError(
                f"This layer holds spikes of shape {tuple(s.shape)} from the last sequence, "
                f"but this call needs [delay, *batch, size] = {list(expected)}: call "
                "layer.reset() before each new sequence."
            )
        if s.dtype != x_seq.dtype or s.device != x_seq.device:
            return s.to(dtype=x_seq.dtype, device=x_seq.device)
        return s

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        """Spikes [T, *batch, size] for input ``x_seq`` [T, *batch, size]."""
        x_seq = self._check_input(x_seq)
        weight = self.effective_weight.to(x_seq.dtype)
        bias = None if self.bias is None else self.bias.to(x_seq.dtype)
        history = self._history(x_seq)
        cell, compiling = self.cell, torch.compiler.is_compiling()
        start = self._start(x_seq, history, compiling)
        phase = start[3]
        drive = x_seq if bias is None else x_seq + bias
        per_step = self._per_step(x_seq)
        fused = None if per_step else self._fused(drive, weight, start, compiling)
        deferred = per_step and self._defers(x_seq)
        spikes, end = fused or self._loop(x_seq, weight, bias, start, compiling, deferred)
        if phase != "recompute":  # a recomputation leaves the memory as the first run did
            cell.keep(end[1], None, end[2], compiling)
            self.s = end[0]
            if phase == "reentrant":
                cell.mark_ungraded()
        return spikes

    def _per_step(self, x_seq: torch.Tensor) -> bool:
        """Whether this call runs the loop over steps (one product and one step kernel a
        step) rather than the fused kernels: as ``fused`` says, else inside a CUDA graph
        capture for a layer of at least :data:`LOOP_FROM` batch rows × neurons², where the
        loop's launches cost no host time and its products read R once for all rows, and
        eager from :data:`EAGER_LOOP_FROM` (in 16-bit, with more batch rows than SMs)."""
        if self.fused is not None:
            return not self.fused
        if torch.compiler.is_compiling():  # (Dynamo cannot trace the capture query)
            return False
        if not x_seq.is_cuda:
            return False
        rows = x_seq[0].numel() // self.size if x_seq.shape[0] else 0
        large = rows * self.size**2 >= LOOP_FROM
        if torch.cuda.is_current_stream_capturing():
            return large
        if large:  # a capture of this call runs cuBLAS, whose handle a capture cannot
            torch.cuda.current_blas_handle()  # create: made now, by the warm-up call
        return _loop_eager(rows, self.size, x_seq)

    def _defers(self, x_seq: torch.Tensor) -> bool:
        """Whether the loop over steps sums dL/dR once over the sequence
        (:class:`~symneuron.binding_loop.LoopProducts`): where the layer chose the loop
        inside a CUDA graph capture, whose steps the GPU's work bounds. Eager, each step's
        product of dL/dR runs while the host launches the next steps, and one product
        after the last would not (H200, fp32 512 × 2048, eager training step: 55.8 ms
        with it, 44.5 without)."""
        if self.fused is not None or not x_seq.is_cuda:
            return False
        return torch.cuda.is_current_stream_capturing()

    def _last_steps(self, before: torch.Tensor | None, spikes: torch.Tensor) -> torch.Tensor:
        """The spikes of the last ``delay`` steps after a call: the call's last ones,
        after those kept before it (zeros after a reset) when the call was shorter."""
        if spikes.shape[0] >= self.delay:
            return spikes[spikes.shape[0] - self.delay :]
        if before is None:
            before = spikes.new_zeros((self.delay, *spikes.shape[1:]))
        return torch.cat([before, spikes])[spikes.shape[0] :]

    def _start(self, x_seq: torch.Tensor, s: torch.Tensor | None, compiling: bool) -> Start:
        """The state a call starts from, as :meth:`NeuronLayer.start` gives the cell's
        (for a checkpoint's recomputation, the state its first run started from; the
        generator state advanced by T), with the kept spikes ``s`` recorded and replayed
        alike."""
        cell = self.cell
        if compiling:
            return s, cell.v, cell.states, None, cell.advance_rng(x_seq, True)
        if s is not None and s.requires_grad and not torch.is_grad_enabled():
            if checkpoint_phase() == "reentrant":
                raise RuntimeError(f"This layer's state carries a gradient. {_REENTRANT_FIX}")
        try:
            v, states, phase, rng = cell.start(x_seq)
        except RuntimeError as exc:  # the cell's refusals, with this layer's fix
            if _CELL_FIX not in str(exc):
                raise
            raise RuntimeError(str(exc).replace(_CELL_FIX, _REENTRANT_FIX)) from None
        replays = self.__dict__.setdefault("_replays", [])
        if phase == "recompute":  # (the cell's record and this one go in and out together)
            return replays.pop(), v, states, phase, rng
        if phase is not None:
            replays.append(s)
            del replays[:-REPLAYS]
        return s, v, states, phase, rng

    def _fused(
        self, drive: torch.Tensor, weight: torch.Tensor, start: Start, compiling: bool
    ) -> tuple[torch.Tensor, End] | None:
        """The sequence through the fused kernels (one launch each way) and the state it
        leaves, or None where the neuron runs on the torch reference (then :meth:`_loop`)."""
        cell, (s, v, states, _, rng) = self.cell, start
        job, check = prepare(
            cell.neuron,
            drive,
            v,
            cell.call_params(drive),
            backend=cell.backend,
            store_v_seq=False,
            states=states or None,
            check_finite=cell.check_finite,
            seed=rng,
        )
        if not isinstance(job, Run):
            return None
        s_init = None if s is None else s.reshape(self.delay, -1).contiguous()
        spikes, v_out, w_out = binding_recurrent.run(job, weight, s_init, self.delay)
        if check:
            raise_if_not_finite([("V", v_out)], drive)
        shape = job.shape
        spikes = spikes.view(drive.shape[0], *shape)
        if w_out is not None:
            states = {name: w_out[i, -1].view(shape) for i, name in enumerate(cell.neuron.states)}
        if drive.shape[0] == 0:  # no step: the state stays as it was
            return spikes, (s, v, states)
        return spikes, (self._last_steps(s, spikes), v_out[-1].view(shape), states)

    def _loop(
        self,
        x_seq: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        start: Start,
        compiling: bool,
        deferred: bool = False,
    ) -> tuple[torch.Tensor, End]:
        """The sequence one step at a time through the cell's simulation (the oracle of
        the fused kernels), the recurrent product in torch on the spikes of ``delay``
        steps before (``deferred``: dL/dR as one product, :func:`_recurrent_input`);
        step t draws at offset + t."""
        cell, (s, v, states, _, rng) = self.cell, start
        if rng is not None:  # [T, 2]: row t is step t's generator state
            steps = torch.arange(x_seq.shape[0], device=rng.device)
            rng = rng + torch.stack((torch.zeros_like(steps), steps), dim=1)
        before = [None] * self.delay if s is None else list(s.unbind(0))
        product = _recurrent_input(weight, deferred)
        out: list[torch.Tensor] = []
        job = None  # the first step's validated run, which the next steps repeat
        for t, x in enumerate(x_seq):
            fed = before[t] if t < self.delay else out[t - self.delay]
            drive = x if fed is None else x + product(t, fed)
            drive = drive if bias is None else drive + bias
            step_rng = None if rng is None else rng[t]
            if job is None:
                result, job = cell.run_from(drive.unsqueeze(0), v, states, compiling, step_rng)
            else:
                result = next_step(job, drive, v, states, step_rng)
            # the step's [1, ...] results as views: squeeze's backward is a view too,
            # where an index's would fill a zero tensor and copy (two launches a step)
            v = result[1].squeeze(0)
            if len(cell.neuron.states):
                states = {name: seq.squeeze(0) for name, seq in result[2].items()}
            out.append(result[0].squeeze(0))
        if not out:  # (no step: empty spikes, in x_seq's graph as simulate's are)
            return x_seq * 0, (s, v, states)
        spikes = torch.stack(out)
        return spikes, (self._last_steps(s, spikes), v, states)

    def reset(self) -> None:
        """Forget V, the extra states and the last spikes (a new sequence starts)."""
        self.cell.reset()
        self.s = None
        if not torch.compiler.is_compiling():  # (checkpoint records are made eagerly only)
            self._replays = []

    def __deepcopy__(self, memo: dict[int, Any]) -> RecurrentNeuronLayer:
        """A deep copy whose stored spikes are detached (as :class:`NeuronLayer`'s state)."""
        state = dict(self.__dict__)
        state["s"] = None if self.s is None else self.s.detach()
        state["_replays"] = []  # records stay with it, as the cell's
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(state, memo))
        return new

    def extra_repr(self) -> str:
        masked = ", masked" if self.mask is not None else ""
        delay = f", delay={self.delay}" if self.delay != 1 else ""
        return f"size={self.size}, bias={self.bias is not None}{delay}{masked}"
