"""NeuronLayer: a thin ``nn.Module`` around :func:`symneuron.simulate`.

A layer keeps its memory (V and the extra states after its last call) between calls,
also when a call runs again under ``torch.utils.checkpoint`` or compiled
(:mod:`symneuron.checkpointing`). Its single-step API (:meth:`NeuronLayer.start`,
:meth:`~NeuronLayer.run_from`, :meth:`~NeuronLayer.keep`) lets a layer built around
it (:class:`~symneuron.RecurrentNeuronLayer`) run its neurons one step at a time.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from torch import nn

from .binding import Run
from .checkpointing import REENTRANT_FIX, REPLAYS, checkpoint_phase, keep_state, snapshot
from .layer_params import ParamRecords, param_tensors, placement
from .models import require_neuron
from .neuron import Neuron
from .simulate import BACKENDS, prepare, run_prepared
from .stochastic import check_seed, generator_state
from .validate import flag

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
        Initial values (float, or tensor for per-channel/per-neuron values), checked as
        :func:`symneuron.simulate` checks them. Learnable params become ``nn.Parameter``
        named after their symbols; the others are buffers (:mod:`~.layer_params`).
    check_finite : bool
        Raise :class:`~symneuron.validate.NonFiniteError` naming the first step and
        neuron at which V (or an extra state) became NaN or ±inf (see
        :func:`symneuron.simulate`).
    seed : int, optional
        For a neuron that draws random numbers (docs/noise.md): the layer keeps the
        generator's state (seed, offset) in the buffer ``rng_state`` and advances the
        offset by T each call, so every call draws new numbers and two calls of T steps
        draw what one call of 2T draws. None: a seed drawn from torch's default
        generator when the layer is built (``torch.manual_seed`` first makes it
        reproducible; mixed with the DDP rank). An int seed: give each rank its own.
        ``reset()`` keeps it.
    dtype, device : optional
        Where params and buffers are made, as for ``nn.Linear`` (default dtype: torch's).

    Notes
    -----
    ``copy.deepcopy(layer)`` works at any time; the copy's stored state is detached
    from the autograd graph of the original's last call.

    Under ``torch.utils.checkpoint`` the recomputation starts from the state the first
    run started from and leaves the memory as the first run left it, so gradients
    match an unchecked run. With ``use_reentrant=True`` the state a call leaves carries
    no gradient (reentrant checkpoints pass gradients to their inputs only), and the
    next call refuses it unless it was detached; ``use_reentrant=False`` has no such
    limit. With ``backend="auto"``, a dtype the kernels lack (bfloat16 on the CPU under
    ``torch.autocast``) runs the torch reference, with one warning.

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
        seed: int | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        require_neuron(neuron)
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
        self._register_params(params or {}, placement(dtype, device))
        if seed is not None:
            check_seed(seed)
        if neuron.draws:  # (seed, offset) on the layer's device, advanced on the device
            self.register_buffer("rng_state", generator_state(seed, torch.device(device or "cpu")))
        self.v: torch.Tensor | None = None
        self.v_seq: torch.Tensor | None = None
        #: The extra states' values after the last call (name -> [*shape]), if any.
        self.states: dict[str, torch.Tensor] = {}
        #: (V, states, "recompute", generator state) of each checkpointed call, until its
        #: recomputation (which returns it from :meth:`_start`)
        self._replays: list[tuple[Any, dict[str, torch.Tensor], str, Any]] = []
        #: V as kept by a gradient-free checkpointed run (use_reentrant=True), until replaced
        self._ungraded: torch.Tensor | None = None

    def _register_params(self, params: Mapping[Any, Any], place: dict[str, Any]) -> None:
        tensors, given = param_tensors(self.neuron, params, place)
        for name, tensor in tensors.items():
            if name in self.neuron.learnable:
                self.register_parameter(name, nn.Parameter(tensor))
            else:
                self.register_buffer(name, tensor)
        self._records = ParamRecords(self.neuron, given, self.param_values())

    def _apply(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> NeuronLayer:
        """``nn.Module._apply`` (``.double()``, ``.to()``, ...), keeping the floats given."""
        held = self._records.held(self.param_values())
        super()._apply(fn, *args, **kwargs)
        self._records.recast(self.param_values(), held)
        return self

    def param_values(self) -> dict[str, torch.Tensor]:
        """Current parameter tensors by name (parameters and buffers)."""
        return {name: getattr(self, name) for name in self._param_names}

    def call_params(self, x_seq: torch.Tensor) -> dict[str, Any]:
        """The parameter values a call on ``x_seq`` runs with (single-step API): the values
        given, in the call's dtype, for the parameters left as given; the tensors
        themselves for the others."""
        return self._param_values(torch.compiler.is_compiling(), getattr(x_seq, "dtype", None))

    def _param_values(self, compiling: bool, dtype: torch.dtype | None = None) -> dict[str, Any]:
        if compiling:
            return self.param_values()
        # the tables nn.Module.__getattr__ would search, read directly (host time)
        params, buffers = self._parameters, self._buffers
        out: dict[str, Any] = {}
        for name in self._param_names:
            value = params[name] if name in params else buffers.get(name, _MISSING)
            out[name] = getattr(self, name) if value is _MISSING else value
        return self._records.for_call(out, dtype)

    def keep(
        self, v: torch.Tensor | None, v_seq: torch.Tensor | None, states: Any, compiling: bool
    ) -> None:
        """Set the memory (single-step API): plain attributes, set without
        nn.Module.__setattr__'s search of its tables (host time) outside compilation;
        compiled, copies of the state out of the graph's outputs (CUDA graphs overwrite
        those at their next replay)."""
        if compiling:
            if v is not None:  # v_seq too: a graph output read at the next call fails
                seq = [] if v_seq is None else [v_seq]
                v, *kept = keep_state([v, *seq, *states.values()])
                if v_seq is not None:
                    v_seq, *kept = kept
                states = dict(zip(states, kept, strict=True))
            self.v, self.v_seq, self.states = v, v_seq, states
        else:
            self.__dict__.update(v=v, v_seq=v_seq, states=states)

    def reset(self) -> None:
        """Forget the membrane state and any extra states (call between sequences)."""
        if torch.compiler.is_compiling():
            self.keep(None, None, {}, True)
        else:  # (_keep's plain attributes, and the checkpoint records, at once: host time)
            self.__dict__.update(v=None, v_seq=None, states={}, _replays=[], _ungraded=None)

    def _steps(self, x: torch.Tensor) -> torch.Tensor:
        """One step's input as a sequence [1, *shape] (single-step mode)."""
        if isinstance(x, torch.Tensor) and x.dim() == 0:
            raise ValueError(
                "A single-step layer (step_mode='s') takes one step's input [*shape] "
                "with at least 1 dim, got a 0-dim tensor; use x.reshape(1)."
            )
        return x.unsqueeze(0)

    def mark_ungraded(self) -> None:
        """Record that the V just kept carries no gradient (kept by the first,
        gradient-free run of ``checkpoint(use_reentrant=True)``): the next call refuses it
        unless it was detached."""
        self.__dict__["_ungraded"] = self.v

    def advance_rng(self, x_seq: torch.Tensor, compiling: bool) -> torch.Tensor | None:
        """The generator state of this call (a copy: its backward reads it later), and the
        kept one advanced by the call's steps (None for a neuron that draws nothing)."""
        if not self.neuron.draws:
            return None
        steps = x_seq.shape[0] if isinstance(x_seq, torch.Tensor) and x_seq.dim() else 0
        state = cast(torch.Tensor, self.rng_state)
        rng = snapshot(state) if compiling else state.clone()  # (snapshot: why an op)
        with torch.no_grad():
            state[1] += steps  # in place: a captured CUDA graph advances it at each replay
        return rng

    def start(self, x_seq: torch.Tensor) -> tuple[Any, dict[str, torch.Tensor], str | None, Any]:
        """The state an eager call starts from (for a checkpoint's recomputation, the state
        its first run started from), how checkpoint runs it
        (:func:`~symneuron.checkpointing.checkpoint_phase`) and its generator state
        (:meth:`advance_rng`; a recomputation reuses the first's). Part of the
        single-step API a layer built around this one drives."""
        phase = checkpoint_phase()
        if phase == "recompute":
            replays = self.__dict__.setdefault("_replays", [])
            if replays:  # reruns come last first, as the backward pass meets them
                return replays.pop()
            phase = None  # a forward inside a backward pass of the user's own
        v, states = self.v, self.states
        if v is not None and v is self.__dict__.get("_ungraded"):
            if phase == "reentrant" or torch.is_grad_enabled():
                raise RuntimeError(
                    "This layer's state comes from a call under torch.utils.checkpoint("
                    f"use_reentrant=True) and carries no gradient to it. {REENTRANT_FIX}"
                )
        if phase is None:  # not checkpointed (the common case)
            return v, states, None, self.advance_rng(x_seq, False)
        if phase == "reentrant" and v is not None and v.requires_grad:
            raise RuntimeError(f"This layer's state carries a gradient. {REENTRANT_FIX}")
        rng = self.advance_rng(x_seq, False)
        replays = self.__dict__.setdefault("_replays", [])
        replays.append((v, states, "recompute", rng))  # what its recomputation returns
        del replays[:-REPLAYS]
        return v, states, phase, rng

    def run_from(
        self,
        x_seq: torch.Tensor,
        v: torch.Tensor | None,
        states: dict[str, torch.Tensor],
        compiling: bool,
        rng: torch.Tensor | None = None,
    ) -> tuple[Any, Run | None]:
        """:func:`simulate` from ``v`` and ``states`` (single-step API: one step's input
        as ``x_seq`` [1, *shape]), with the hint to reset on a state left by a call under
        torch.inference_mode: its results, and the kernels' run it validated where the
        steps after it may repeat it with their own values
        (:func:`~symneuron.simulate.next_step`; None under torch.compile, on the torch
        reference and with ``check_finite``)."""
        store = self.store_v_seq and self.step_mode == "m"
        try:
            job, check = prepare(
                self.neuron,
                x_seq,
                v,
                self._param_values(compiling, getattr(x_seq, "dtype", None)),
                backend=self.backend,
                store_v_seq=store,
                states=states or None,
                check_finite=self.check_finite,
                seed=rng,
            )
            result = run_prepared(job, check, x_seq, store)
        except RuntimeError as exc:
            if isinstance(v, torch.Tensor) and v.is_inference() and "Inference" in str(exc):
                raise RuntimeError(
                    "This layer holds V from a call under torch.inference_mode(), which "
                    "autograd cannot use: call layer.reset() before each new sequence (on "
                    "every NeuronLayer of the model), or run the earlier calls under "
                    "torch.no_grad() instead."
                ) from exc
            raise
        repeat = job if isinstance(job, Run) and not (check or compiling) else None
        return result, repeat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_seq = x if self.step_mode == "m" else self._steps(x)
        compiling = torch.compiler.is_compiling()  # (asked once: host time)
        if compiling:
            v, states, phase, rng = self.v, self.states, None, self.advance_rng(x_seq, True)
        else:
            v, states, phase, rng = self.start(x_seq)
        if isinstance(v, torch.Tensor) and isinstance(x_seq, torch.Tensor):
            if v.shape != x_seq.shape[1:] and x_seq.dim() >= 2:
                raise ValueError(
                    f"This layer holds V of shape {tuple(v.shape)} from the last sequence, "
                    f"but the input's shape per step is {tuple(x_seq.shape[1:])}: call "
                    "layer.reset() before each new sequence (on every NeuronLayer of the model)."
                )
        result = self.run_from(x_seq, v, states, compiling, rng)[0]
        spikes, v_seq = result[0], result[1]
        store = self.store_v_seq and self.step_mode == "m"
        if phase == "recompute":  # the memory stays as the first run left it
            return spikes[0] if self.step_mode == "s" else spikes
        if x_seq.shape[0] == 0:  # no step: the memory stays as it was
            self.keep(self.v, v_seq if store else None, self.states, compiling)
            return spikes
        if len(self.neuron.states):  # (len: Dynamo misreads an empty mappingproxy as true)
            states = {name: seq[-1] for name, seq in result[2].items()}
        self.keep(v_seq[-1], v_seq if store else None, states, compiling)
        if phase == "reentrant":
            self.mark_ungraded()
        return spikes[0] if self.step_mode == "s" else spikes

    def __deepcopy__(self, memo: dict[int, Any]) -> NeuronLayer:
        """A deep copy whose stored state is detached (a tensor inside an autograd graph
        cannot be deep-copied)."""
        state = dict(self.__dict__)
        state["v"] = _detached(self.v)
        state["v_seq"] = _detached(self.v_seq)
        state["states"] = {name: value.detach() for name, value in self.states.items()}
        state.update(_replays=[], _ungraded=None)  # records stay with it
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(state, memo))
        return new

    def extra_repr(self) -> str:
        return f"{self.neuron!r}, backend={self.backend!r}, step_mode={self.step_mode!r}"


def _detached(value: torch.Tensor | None) -> torch.Tensor | None:
    return None if value is None else value.detach()
