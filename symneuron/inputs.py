"""The checked inputs of a run: ``x_seq``, the initial states and the parameters.

Each check names the problem and the fix; values come back broadcast to the neuron
shape. :func:`symneuron.simulate` (through :func:`symneuron.simulate.prepare`) calls
these before it picks how the run goes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .assumptions import check_values
from .definition import Definition
from .memo import BoundedTable
from .reference import as_tensor, level_value
from .validate import dense, finite_float, in_range, named

__all__ = ["check_x", "v_init_of", "default_v_init", "param_values", "w_init_of"]


def check_x(x_seq: Any) -> torch.Tensor:
    if not isinstance(x_seq, torch.Tensor):
        hint = (
            "; convert it with torch.from_numpy(x_seq)"
            if type(x_seq).__module__.split(".")[0] == "numpy"
            else "; convert it with torch.as_tensor(x_seq)"
        )
        raise TypeError(f"x_seq must be a torch.Tensor, got {type(x_seq).__name__}{hint}")
    if x_seq.dim() < 2:
        raise ValueError(
            f"x_seq must be [T, *shape] with at least 2 dims, got shape {tuple(x_seq.shape)}; "
            "for one step use x.unsqueeze(0) or NeuronLayer(step_mode='s')."
        )
    dense(x_seq, "x_seq")
    if not x_seq.is_floating_point():
        raise TypeError(
            f"x_seq must be a floating-point tensor, got {x_seq.dtype}; use x_seq.float()"
        )
    return x_seq


def _label(name: str, kind: str) -> str:
    return f"{kind} {name!r}" if kind else name


def _check_tensor(
    name: str, value: torch.Tensor, x_seq: torch.Tensor, shape: torch.Size, kind: str = ""
) -> None:
    """Same device as ``x_seq``, floating point, broadcastable to ``shape``; the errors
    name ``kind`` followed by ``name`` quoted, or ``name`` alone without ``kind``."""
    dense(value, _label(name, kind))
    if value.device != x_seq.device:
        raise ValueError(
            f"{_label(name, kind)} is on {value.device} but x_seq is on {x_seq.device}; "
            "move it with .to()"
        )
    if not value.is_floating_point():
        raise TypeError(f"{_label(name, kind)} must be a floating-point tensor, got {value.dtype}")
    # broadcasts to ``shape`` without changing it (torch.broadcast_shapes costs ~10 µs)
    dims = value.shape
    if not dims or dims == shape:  # the common cases: a scalar, one value per neuron
        return
    lead = len(shape) - len(dims)
    ok = lead >= 0
    for i, d in enumerate(dims):  # a loop, not all(...): Dynamo of torch 2.7 inlines it
        ok = ok and (d == 1 or d == shape[lead + i])
    if not ok:
        raise ValueError(
            f"{_label(name, kind)} of shape {tuple(value.shape)} does not broadcast to the "
            f"neuron shape {tuple(shape)}; use a scalar, per-channel (e.g. [C, 1, 1]) or "
            "per-neuron tensor."
        )


def default_v_init(
    neuron: Definition, x_seq: torch.Tensor, shape: torch.Size, values: dict[str, Any]
) -> torch.Tensor:
    """V[0] = the neuron's v_init, else v_reset (0 without one); a param-valued
    v_reset keeps its gradient."""
    start = neuron.v_start
    if isinstance(start, float):
        return torch.full(shape, start, dtype=x_seq.dtype, device=x_seq.device)
    theta = [as_tensor(values[n], x_seq) for n in neuron.params]
    level = level_value(neuron, start, theta, x_seq)
    return torch.as_tensor(level).to(x_seq.dtype).expand(shape)


def v_init_of(
    neuron: Definition, v_init: Any, x_seq: torch.Tensor, shape: torch.Size
) -> torch.Tensor | None:
    """v_init broadcast to ``shape``; None stays None (kernels start from v_reset)."""
    if v_init is None:
        return None
    if not isinstance(v_init, torch.Tensor):
        value = in_range(finite_float(v_init, "v_init"), x_seq.dtype, "v_init")
        v_init = torch.full((), value, dtype=x_seq.dtype, device=x_seq.device)
    _check_tensor("v_init", v_init, x_seq, shape)
    return v_init.to(x_seq.dtype).expand(shape)


#: neuron key -> its param names as a set (a dict's keys are checked against it at once)


_NAMES: BoundedTable[str, frozenset[str]] = BoundedTable(4096, "inputs.param_names")


def _given(neuron: Definition, params: Mapping[Any, Any] | None) -> Mapping[str, Any]:
    """``params`` keyed by name: as it is when it is a dict of known names (what
    NeuronLayer passes), else through :func:`~symneuron.validate.named`."""
    if type(params) is dict:
        names = _NAMES.get(neuron.key())
        if names is None:
            names = _NAMES.put(neuron.key(), frozenset(neuron.params))
        if params.keys() <= names:  # str keys only (a Symbol never equals a str)
            return params
    return named(params, "parameter", neuron.params)


def _compute(x_seq: torch.Tensor) -> torch.dtype:
    """The dtype params are computed in: float64 for float64 inputs, else float32."""
    return torch.float64 if x_seq.dtype == torch.float64 else torch.float32


def param_values(
    neuron: Definition, params: Mapping[Any, Any] | None, x_seq: torch.Tensor, shape: torch.Size
) -> dict[str, float | torch.Tensor]:
    """Every param of ``neuron`` by name, in the neuron's order: the given value
    (checked) or the default (an unknown name is an error)."""
    values: dict[str, float | torch.Tensor] = dict(neuron.params.items())
    if params is None:
        return values
    for name, value in _given(neuron, params).items():
        if isinstance(value, torch.Tensor):
            _check_tensor(name, value, x_seq, shape, "param")
            if value.requires_grad and name not in neuron.learnable:
                raise ValueError(
                    f"param {name!r} requires grad but is not learnable; add it to "
                    "Neuron(learnable=[...]) or pass value.detach()."
                )
        else:
            value = in_range(
                finite_float(value, f"param {name!r}"), _compute(x_seq), f"param {name!r}"
            )
        kinds = neuron.param_assumptions.get(name)
        if kinds:  # a float: float arithmetic; a tensor: once per version, where readable
            check_values(name, kinds, value)
        values[name] = value
    return values


def w_init_of(
    neuron: Definition,
    states: Mapping[Any, Any] | None,
    x_seq: torch.Tensor,
    shape: torch.Size,
    full: bool,
) -> torch.Tensor | None:
    """Initial extra states as one [k, *shape] tensor; None when none is given (the
    kernels then start from each State.init) unless ``full``."""
    given = {} if states is None else named(states, "state", neuron.states)
    if len(neuron.states) == 0 or (not given and not full):
        return None
    rows = []
    for name, state in neuron.states.items():
        value = given.get(name, state.init)
        if not isinstance(value, torch.Tensor):
            value = in_range(finite_float(value, f"state {name!r}"), x_seq.dtype, f"state {name!r}")
            value = torch.full((), value, dtype=x_seq.dtype, device=x_seq.device)
        _check_tensor(name, value, x_seq, shape, "state")
        rows.append(value.to(x_seq.dtype).expand(shape))
    return torch.stack(rows)
