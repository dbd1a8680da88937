"""What a layer's memory needs when a call runs again or compiled: checkpoint phases,
kept state, generator snapshots.

``torch.utils.checkpoint`` reruns a call in the backward pass, which must start from
the state the first run started from and must leave the memory alone:
:func:`checkpoint_phase` tells the runs apart. Under ``torch.compile`` the kept state
is copied out of the compiled graph's outputs (:func:`keep_state`), so that CUDA
graphs (``mode="reduce-overhead"``), which overwrite their outputs at the next
replay, never own it; :func:`snapshot` copies a generator state as an op.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
import torch.utils.checkpoint

__all__ = ["REPLAYS", "REENTRANT_FIX", "checkpoint_phase", "keep_state", "snapshot"]

#: the first, gradient-free run of ``checkpoint(use_reentrant=True)`` runs in this code
_REENTRANT_CODE = getattr(
    getattr(getattr(torch.utils.checkpoint, "CheckpointFunction", None), "forward", None),
    "__code__",
    None,
)
#: frames searched for it (each nn.Module between it and the layer adds three)
_FRAMES = 24
#: checkpointed calls remembered per layer until their recomputation (oldest dropped)
REPLAYS = 1024
REENTRANT_FIX = (
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


def checkpoint_phase() -> str | None:
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
def keep_state(values: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of ``values`` in memory of their own. Tagged unsafe for CUDA graphs, so that
    Inductor runs it outside them: the copies are never a graph's (overwritten) outputs."""
    return [value.clone() for value in values]


@keep_state.register_fake
def _(values: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty_like(value) for value in values]


def _keep_state_backward(ctx: Any, grads: list[torch.Tensor]) -> list[torch.Tensor]:
    return grads


keep_state.register_autograd(_keep_state_backward)


@torch.library.custom_op("symneuron::rng_snapshot", mutates_args=())
def snapshot(state: torch.Tensor) -> torch.Tensor:
    """A copy of a layer's generator state: an op, so that a compiled graph saves it for
    the backward instead of recomputing it from the state the layer advances in place."""
    return state.clone()


@snapshot.register_fake
def _(state: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(state)
