"""NeuronLayer: a thin ``nn.Module`` around :func:`symneuron.simulate`.

A layer keeps its memory (V and the extra states after its last call) between calls.
Three ways of running a call again are handled here: ``torch.utils.checkpoint``
reruns a call in the backward pass, which must start from the state the first run
started from and must leave the memory alone (:func:`_checkpoint_phase` tells the
runs apart); under ``torch.compile`` the kept state is copied out of the compiled
graph's outputs (:func:`_keep_state`), so that CUDA graphs (``mode="reduce-overhead"``),
which overwrite their outputs at the next replay, never own it.
"""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, cast

import torch
import torch.utils.checkpoint
from torch import nn

from .assumptions import check_assumption
from .neuron import Neuron
from .simulate import BACKENDS, simulate
from .stochastic import check_seed, generator_state
from .validate import finite_float, flag, named

__all__ = ["NeuronLayer"]

_STEP_MODES = ("m", "s")
_MISSING = object()
#: the first, gradient-free run of ``checkpoint(use_reentrant=True)`` runs in this code
_REENTRANT_CODE = getattr(
    getattr(getattr(torch.utils.checkpoint, "CheckpointFunction", None), "forward", None),
    "__code__",
    None,
)
#: frames searched for it (each nn.Module between it and the layer adds three)
_FRAMES = 24
#: checkpointed calls remembered per layer until their recomputation (oldest dropped)
_REPLAYS = 1024
_REENTRANT_FIX = (
    "torch.utils.checkpoint(use_reentrant=True) passes gradients only to the checkpointed "
    "function's inputs, and a NeuronLayer's state is none of them: use use_reentrant=False, "
    "or cut the gradient through the state first (layer.v = layer.v.detach(), and each "
    "tensor of layer.states; truncated backpropagation through time)."
)


def _top_hooks() -> Callable[[], Any]:
    """torch's getter of the innermost saved-tensors hooks, called as this torch takes it."""
    top = torch._C._autograd._top_saved_tensors_default_hooks
    try:
        top(False)
    except TypeError:  # a torch whose function takes no argument
        return top  # type: ignore[return-value]
    return functools.partial(top, False)


#: returns the innermost saved-tensors hooks (pack, unpack), or None (host time: made once)
_TOP_HOOKS = _top_hooks()


def _checkpoint_phase() -> str | None:
    """How ``torch.utils.checkpoint`` runs the current call: ``"recompute"`` (its rerun in
    a backward pass), ``"reentrant"`` (the first, gradient-free run of
    ``use_reentrant=True``), ``"first"`` (the first run of ``use_reentrant=False``), or
    None (not checkpointed)."""
    if torch._C._current_graph_task_id() != -1:
        return "recompute"  # a forward inside a backward pass: only checkpoint reruns one
    if torch.is_grad_enabled():
        hooks = _TOP_HOOKS()
        pack = getattr(hooks[0], "__qualname__", "") if hooks else ""
        return "first" if pack.startswith("_checkpoint_hook") else None
    if torch.is_inference_mode_enabled() or _REENTRANT_CODE is None:
        return None
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_FRAMES):
        if frame is None:
            return None
        if frame.f_code is _REENTRANT_CODE:
            return "reentrant"
        frame = frame.f_back
    return None


@torch.library.custom_op(
    "symneuron::keep_state",
    mutates_args=(),
    tags=tuple(t for t in [getattr(torch.Tag, "cudagraph_unsafe", None)] if t is not None),
)
def _keep_state(values: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of ``values`` in memory of their own. Tagged unsafe for CUDA graphs, so that
    Inductor runs it outside them: the copies are never a graph's (overwritten) outputs."""
    return [value.clone() for value in values]


@_keep_state.register_fake
def _(values: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty_like(value) for value in values]


def _keep_state_backward(ctx: Any, grads: list[torch.Tensor]) -> list[torch.Tensor]:
    return grads


_keep_state.register_autograd(_keep_state_backward)


@torch.library.custom_op("symneuron::rng_snapshot", mutates_args=())
def _snapshot(state: torch.Tensor) -> torch.Tensor:
    """A copy of a layer's generator state: an op, so that a compiled graph saves it for
    the backward instead of recomputing it from the state the layer advances in place."""
    return state.clone()


@_snapshot.register_fake
def _(state: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(state)


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
        Initial values (float, or tensor for per-channel/per-neuron values), each
        checked against its symbol's SymPy assumptions as :func:`symneuron.simulate`
        checks it; so is a value replaced or changed in place later, at the next call.
        Learnable params become ``nn.Parameter`` named after their symbols; the
        others are buffers.
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
    dtype : torch.dtype, optional
        The floating-point dtype of the parameters and buffers (default: torch's
        default dtype; a tensor in ``params`` keeps its own unless ``dtype`` is given).
    device : torch.device or str, optional
        Where the parameters and buffers are created, as for torch's own modules.

    Notes
    -----
    A parameter given as a float (or a neuron's default) keeps the value given, whatever
    the module's dtype: a fixed one that the module's dtype rounds runs as the float
    itself, made in the dtype of each run (its buffer shows it rounded); a cast such as
    ``.double()`` recreates its buffer, and a learnable one's ``nn.Parameter``, from the
    float, as long as the value is still the one given (neither trained nor set since).
    A value that changed is the model's own: a cast converts it as torch converts any
    tensor. Under ``torch.compile`` the call reads the tensors, so give a float64 run a
    float64 layer (``dtype=torch.float64`` or ``.double()``).

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
        place = _placement(dtype, device)
        self._register_params(params or {}, place)
        if seed is not None:
            check_seed(seed)
        if neuron.draws:  # (seed, offset) on the layer's device, advanced on the device
            state = generator_state(seed, torch.device("cpu"))
            self.register_buffer("rng_state", state.to(device) if device is not None else state)
        self.v: torch.Tensor | None = None
        self.v_seq: torch.Tensor | None = None
        #: The extra states' values after the last call (name -> [*shape]), if any.
        self.states: dict[str, torch.Tensor] = {}
        #: (V, states, "recompute", generator state) of each checkpointed call, until its
        #: recomputation (which returns it from :meth:`_start`)
        self._replays: list[tuple[Any, dict[str, torch.Tensor], str, Any]] = []
        #: V as kept by a gradient-free checkpointed run (use_reentrant=True), until replaced
        self._ungraded: torch.Tensor | None = None

    def _register_params(
        self, params: Mapping[Any, float | torch.Tensor], place: dict[str, Any]
    ) -> None:
        """Register each param, created where ``place`` (dtype, device) says, its value
        checked against its symbol's assumptions; keep the floats given (:attr:`_given`)."""
        values: dict[str, float | torch.Tensor] = dict(self.neuron.params)
        values.update(named(params, "parameter", self.neuron.params))
        #: the floats given (the neuron's defaults included), by name: the values a fixed
        #: param runs with and a cast recreates, while its tensor still holds them
        self._given: dict[str, float] = {}
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                if not value.is_floating_point():
                    raise TypeError(
                        f"Parameter {name!r} must be a floating-point tensor, got "
                        f"{value.dtype}; use .float()"
                    )
                tensor = value.detach().to(copy=True, **place)
            else:
                value = self._given[name] = finite_float(value, f"Parameter {name!r}")
                dtype = place.get("dtype", torch.get_default_dtype())
                tensor = torch.tensor(value, dtype=dtype, device=place.get("device"))
            if not bool(torch.isfinite(tensor).all()):
                raise ValueError(f"Parameter {name!r} must be finite, got {value}")
            kinds = self.neuron.param_assumptions.get(name)
            if kinds:  # the value given, and as its dtype holds it (rounded to 0, say)
                check_assumption(name, kinds, value)
                check_assumption(name, kinds, tensor)
            if name in self.neuron.learnable:
                self.register_parameter(name, nn.Parameter(tensor))
            else:
                self.register_buffer(name, tensor)
        self._note_values(checked=True)

    def _note_values(self, checked: bool) -> None:
        """Record the param tensors as they are now, for the calls: each fixed one holding
        its float given rounded (:attr:`_exact`: the call runs with the float itself while
        the tensor and its version stay these), and, ``checked``, those with assumptions
        as checked (:attr:`_checked`: a call checks a value again once it changed)."""
        tensors = {name: getattr(self, name) for name in self._param_names}
        #: fixed param -> (its float given, its tensor, the tensor's version and dtype)
        self._exact: dict[str, tuple[float, torch.Tensor, int, torch.dtype]] = {
            name: (given, tensors[name], _version(tensors[name]), tensors[name].dtype)
            for name, given in self._given.items()
            if name not in self.neuron.learnable and _rounds(tensors[name], given)
        }
        assumed = self.neuron.param_assumptions if checked else {}
        #: param with assumptions -> (its tensor, the tensor's version) when last checked
        self._checked: dict[str, tuple[torch.Tensor, int]] = {
            name: (tensors[name], _version(tensors[name])) for name in assumed
        }

    def _apply(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> NeuronLayer:
        """``nn.Module._apply`` (``.to()``, ``.double()``, ...), after which each param
        still holding its float given holds it again, rounded once to its new dtype
        (not the float32 rounding of it cast to float64); its values are checked again
        at the next call (a cast can round a small value to 0)."""
        given = self.__dict__.get("_given", {})
        kept = {name: value for name, value in given.items() if _holds(getattr(self, name), value)}
        dtypes = {name: getattr(self, name).dtype for name in kept}
        super()._apply(fn, *args, **kwargs)
        for name, value in kept.items():
            tensor = getattr(self, name)
            if tensor.dtype != dtypes[name] and tensor.is_floating_point():
                with torch.no_grad():
                    tensor.fill_(value)
        if "_given" in self.__dict__:
            self._note_values(checked=False)
        return self

    def param_values(self) -> dict[str, torch.Tensor]:
        """Current parameter tensors by name (parameters and buffers)."""
        return {name: getattr(self, name) for name in self._param_names}

    def _param_values(
        self, compiling: bool, dtype: torch.dtype | None = None
    ) -> dict[str, float | torch.Tensor]:
        """Each param's value for a call: its tensor, or for a fixed param whose tensor
        holds the float given rounded, that float (the run makes it in its own dtype),
        unless the run's ``dtype`` is the tensor's; outside compilation, a tensor replaced
        or changed in place since the last call is first checked against its symbol's
        assumptions."""
        if compiling:
            return {name: getattr(self, name) for name in self._param_names}
        # the tables nn.Module.__getattr__ would search, read directly (host time)
        params, buffers, attrs = self._parameters, self._buffers, self.__dict__
        exact, checked = attrs.get("_exact", _NONE), attrs.get("_checked", _NONE)
        assumed = self.neuron.param_assumptions
        out: dict[str, float | torch.Tensor] = {}
        for name in self._param_names:
            value = params[name] if name in params else buffers.get(name, _MISSING)
            if value is _MISSING:
                value = getattr(self, name)
            record = exact.get(name)
            if record is not None:
                if value is not record[1] or _version(value) != record[2]:
                    del exact[name]  # changed: the tensor's value from now on
                elif record[3] is not dtype:
                    out[name] = record[0]  # (a float: simulate checks it)
                    continue
            if name in assumed:
                seen = checked.get(name, _UNCHECKED)
                if value is not seen[0] or _version(value) != seen[1]:
                    self._check_changed(name, value)
            out[name] = value  # type: ignore[assignment]
        return out

    def _check_changed(self, name: str, value: Any) -> None:
        """Check a param's value replaced or changed in place since its last check
        against its symbol's assumptions, and note it checked."""
        if isinstance(value, torch.Tensor):
            check_assumption(name, self.neuron.param_assumptions[name], value)
            self.__dict__.setdefault("_checked", {})[name] = (value, _version(value))

    def _keep(
        self, v: torch.Tensor | None, v_seq: torch.Tensor | None, states: Any, compiling: bool
    ) -> None:
        """Set the memory: plain attributes, set without nn.Module.__setattr__'s search of
        its tables (host time) outside compilation; compiled, copies of the state out of
        the graph's outputs (CUDA graphs overwrite those at their next replay)."""
        if compiling:
            if v is not None:  # v_seq too: a graph output read at the next call fails
                seq = [] if v_seq is None else [v_seq]
                v, *kept = _keep_state([v, *seq, *states.values()])
                if v_seq is not None:
                    v_seq, *kept = kept
                states = dict(zip(states, kept, strict=True))
            self.v, self.v_seq, self.states = v, v_seq, states
        else:
            self.__dict__.update(v=v, v_seq=v_seq, states=states)

    def reset(self) -> None:
        """Forget the membrane state and any extra states (call between sequences)."""
        if torch.compiler.is_compiling():
            self._keep(None, None, {}, True)
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

    def _advance(self, x_seq: torch.Tensor, compiling: bool) -> torch.Tensor | None:
        """The generator state of this call (a copy: its backward reads it later), and the
        kept one advanced by the call's steps (None for a neuron that draws nothing)."""
        if not self.neuron.draws:
            return None
        steps = x_seq.shape[0] if isinstance(x_seq, torch.Tensor) and x_seq.dim() else 0
        state = cast(torch.Tensor, self.rng_state)
        rng = _snapshot(state) if compiling else state.clone()  # (_snapshot: why an op)
        with torch.no_grad():
            state[1] += steps  # in place: a captured CUDA graph advances it at each replay
        return rng

    def _start(self, x_seq: torch.Tensor) -> tuple[Any, dict[str, torch.Tensor], str | None, Any]:
        """The state an eager call starts from (for a checkpoint's recomputation, the state
        its first run started from), how checkpoint runs it (:func:`_checkpoint_phase`)
        and its generator state (:meth:`_advance`; a recomputation reuses the first's)."""
        phase = _checkpoint_phase()
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
                    f"use_reentrant=True) and carries no gradient to it. {_REENTRANT_FIX}"
                )
        if phase is None:  # not checkpointed (the common case)
            return v, states, None, self._advance(x_seq, False)
        if phase == "reentrant" and v is not None and v.requires_grad:
            raise RuntimeError(f"This layer's state carries a gradient. {_REENTRANT_FIX}")
        rng = self._advance(x_seq, False)
        replays = self.__dict__.setdefault("_replays", [])
        replays.append((v, states, "recompute", rng))  # what its recomputation returns
        del replays[:-_REPLAYS]
        return v, states, phase, rng

    def _run(
        self, x_seq: torch.Tensor, v: torch.Tensor | None, states: dict[str, torch.Tensor],
        compiling: bool, rng: torch.Tensor | None = None,
    ) -> Any:  # fmt: skip
        """:func:`simulate` from ``v`` and ``states``, with the hint to reset on a state
        left by a call under torch.inference_mode."""
        try:
            return simulate(
                self.neuron,
                x_seq,
                v,
                self._param_values(compiling, getattr(x_seq, "dtype", None)),
                backend=self.backend,
                store_v_seq=self.store_v_seq and self.step_mode == "m",
                states=states or None,
                check_finite=self.check_finite,
                seed=rng,
            )
        except RuntimeError as exc:
            if isinstance(v, torch.Tensor) and v.is_inference() and "Inference" in str(exc):
                raise RuntimeError(
                    "This layer holds V from a call under torch.inference_mode(), which "
                    "autograd cannot use: call layer.reset() before each new sequence (on "
                    "every NeuronLayer of the model), or run the earlier calls under "
                    "torch.no_grad() instead."
                ) from exc
            raise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_seq = x if self.step_mode == "m" else self._steps(x)
        compiling = torch.compiler.is_compiling()  # (asked once: host time)
        if compiling:
            v, states, phase, rng = self.v, self.states, None, self._advance(x_seq, True)
        else:
            v, states, phase, rng = self._start(x_seq)
        if isinstance(v, torch.Tensor) and isinstance(x_seq, torch.Tensor):
            if v.shape != x_seq.shape[1:] and x_seq.dim() >= 2:
                raise ValueError(
                    f"This layer holds V of shape {tuple(v.shape)} from the last sequence, "
                    f"but the input's shape per step is {tuple(x_seq.shape[1:])}: call "
                    "layer.reset() before each new sequence (on every NeuronLayer of the model)."
                )
        result = self._run(x_seq, v, states, compiling, rng)
        spikes, v_seq = result[0], result[1]
        store = self.store_v_seq and self.step_mode == "m"
        if phase == "recompute":  # the memory stays as the first run left it
            return spikes[0] if self.step_mode == "s" else spikes
        if x_seq.shape[0] == 0:  # no step: the memory stays as it was
            self._keep(self.v, v_seq if store else None, self.states, compiling)
            return spikes
        if len(self.neuron.states):  # (len: Dynamo misreads an empty mappingproxy as true)
            states = {name: seq[-1] for name, seq in result[2].items()}
        self._keep(v_seq[-1], v_seq if store else None, states, compiling)
        if phase == "reentrant":
            self.__dict__["_ungraded"] = self.v
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


#: an empty record (a layer unpickled from before the records existed)
_NONE: dict[str, Any] = {}
#: the record of a value not checked yet (no tensor is it)
_UNCHECKED = (None, -2)


def _placement(dtype: Any, device: Any) -> dict[str, Any]:
    """``dtype`` and ``device`` as keyword arguments of a tensor factory (those given)."""
    place: dict[str, Any] = {}
    if dtype is not None:
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(
                f"dtype must be a floating-point torch.dtype such as torch.float64 (or None "
                f"for torch's default), got {dtype!r}"
            )
        place["dtype"] = dtype
    if device is not None:
        place["device"] = torch.device(device)
    return place


def _version(tensor: torch.Tensor) -> int:
    """The tensor's version counter (bumped by every in-place change); -1 for an
    inference tensor, which keeps none."""
    try:
        return tensor._version
    except RuntimeError:
        return -1


def _rounds(tensor: Any, value: float) -> bool:
    """Whether ``tensor`` holds the float ``value`` rounded to its dtype, not ``value``
    itself (a run in a wider dtype takes the float instead)."""
    return _holds(tensor, value) and float(tensor.detach()) != value


def _holds(tensor: Any, value: float) -> bool:
    """Whether ``tensor`` is one plain value equal to the float ``value`` rounded to the
    tensor's dtype (reads it back: called at construction and casts only)."""
    if type(tensor) not in (torch.Tensor, nn.Parameter) or tensor.numel() != 1:
        return False
    if tensor.device.type == "meta" or not tensor.is_floating_point():
        return False
    return float(tensor.detach()) == float(torch.tensor(value, dtype=tensor.dtype))
