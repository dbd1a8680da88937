"""``sn.simulate``: run a neuron over a sequence with the chosen backend."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import sympy as sp
import torch

from . import dtypes
from .binding import (
    EagerBinding,
    compute_dtype,
    forward_op,
    kernel_param,
    launch_param,
    program,
)
from .definition import Definition
from .reference import as_tensor, level_value, simulate_reference
from .runtime import cpu, cuda
from .validate import constants_beyond, finite_float, flag, named, raise_if_not_finite

__all__ = ["simulate", "resolve_backend", "BACKENDS"]

BACKENDS = ("auto", "cuda", "cpu", "torch")


#: fallbacks of backend="auto" already warned about in this process
_WARNED: set[str] = set()


def _fallback(device: str, why: str) -> str:
    """backend="auto" runs the torch reference: warn once per device type."""
    if device not in _WARNED and not torch.compiler.is_compiling():
        _WARNED.add(device)
        warnings.warn(
            f"symneuron: backend='auto' runs the (slower) torch reference on {device}: {why} "
            "Pass backend='torch' to choose it without this warning.",
            RuntimeWarning,
            stacklevel=3,
        )
    return "torch"


def resolve_backend(backend: str, device: torch.device) -> str:
    """``"auto"`` -> cuda for CUDA tensors, cpu when a working C compiler exists, else
    torch (with one warning per process naming why)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        if device.type == "cuda":
            if cuda.available():
                return "cuda"
            return _fallback("cuda", "CuPy is missing; pip install 'symneuron[cuda]'.")
        if device.type == "cpu" and cpu.available():
            return "cpu"
        if device.type != "cpu":
            return "torch"
        return _fallback("cpu", str(cpu.problem()))
    if backend == "cuda" and device.type != "cuda":
        raise ValueError(
            f"backend='cuda' needs CUDA tensors, got x_seq on {device}; move it with .cuda()"
        )
    if backend == "cpu" and device.type != "cpu":
        raise ValueError(
            f"backend='cpu' needs CPU tensors, got x_seq on {device}; use backend='auto'"
        )
    return backend


def _check_x(x_seq: Any) -> torch.Tensor:
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


def _default_v_init(
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


def _v_init(
    neuron: Definition, v_init: Any, x_seq: torch.Tensor, shape: torch.Size
) -> torch.Tensor | None:
    """v_init broadcast to ``shape``; None stays None (kernels start from v_reset)."""
    if v_init is None:
        return None
    if not isinstance(v_init, torch.Tensor):
        value = finite_float(v_init, "v_init")
        v_init = torch.full((), value, dtype=x_seq.dtype, device=x_seq.device)
    _check_tensor("v_init", v_init, x_seq, shape)
    return v_init.to(x_seq.dtype).expand(shape)


#: neuron key -> its param names as a set (a dict's keys are checked against it at once)
_NAMES: dict[str, frozenset[str]] = {}


def _given(neuron: Definition, params: Mapping[Any, Any] | None) -> Mapping[str, Any]:
    """``params`` keyed by name: as it is when it is a dict of known names (what
    NeuronLayer passes), else through :func:`~symneuron.validate.named`."""
    if type(params) is dict:
        names = _NAMES.get(neuron.key())
        if names is None:
            if len(_NAMES) > 4096:
                _NAMES.clear()
            names = _NAMES[neuron.key()] = frozenset(neuron.params)
        if params.keys() <= names:  # str keys only (a Symbol never equals a str)
            return params
    return named(params, "parameter", neuron.params)


def _param_values(
    neuron: Definition, params: Mapping[Any, Any] | None, x_seq: torch.Tensor, shape: torch.Size
) -> dict[str, float | torch.Tensor]:
    values: dict[str, float | torch.Tensor] = dict(neuron.params.items())
    for name, value in _given(neuron, params).items():
        if isinstance(value, torch.Tensor):
            _check_tensor(name, value, x_seq, shape, "param")
            if value.requires_grad and name not in neuron.learnable:
                raise ValueError(
                    f"param {name!r} requires grad but is not learnable; add it to "
                    "Neuron(learnable=[...]) or pass value.detach()."
                )
        else:
            value = finite_float(value, f"param {name!r}")
        values[name] = value
    return values


def simulate(
    neuron: Definition,
    x_seq: torch.Tensor,
    v_init: torch.Tensor | float | None = None,
    params: Mapping[Any, float | torch.Tensor] | None = None,
    *,
    backend: str = "auto",
    store_v_seq: bool = True,
    states: Mapping[Any, float | torch.Tensor] | None = None,
    check_finite: bool = False,
) -> Any:
    """Run ``neuron`` over ``x_seq`` and return ``(spike_seq, v_seq)``.

    A neuron with extra state variables returns ``(spike_seq, v_seq, states)``,
    ``states`` mapping each state's name to its values after every step
    ([T, *shape]) or after the last ([1, *shape]), as for ``v_seq``.

    Parameters
    ----------
    neuron : symneuron.Neuron
    x_seq : Tensor [T, *shape]
        Input per step. Floating point: float32/float64 (cpu), also float16 and
        bfloat16 (cuda).
    v_init : Tensor or float, optional
        State before the first step, broadcastable to ``shape``; defaults to
        the neuron's ``v_init``, else ``v_reset`` (0 without one).
    params : mapping, optional
        Symbol or name -> float or tensor broadcastable to ``shape`` (scalar,
        per-channel, per-neuron). Omitted params take the neuron's defaults.
    backend : {"auto", "cuda", "cpu", "torch"}
    store_v_seq : bool
        Return V after every step ([T, *shape]); if False only the last ([1, *shape]).
    states : mapping, optional
        Initial values of the extra states (name or symbol -> float or tensor
        broadcastable to ``shape``); omitted ones start at their ``State.init``.
    check_finite : bool
        Raise :class:`~symneuron.validate.NonFiniteError` naming the first step and
        neuron at which V (or an extra state) became NaN or ±inf. Off by default: it
        reads the results back (a device synchronisation, a graph break under
        ``torch.compile``). Every backend computes the same NaN and inf (spikes stay
        exactly 0 or 1: a NaN charge does not fire).

    Notes
    -----
    An empty input (T = 0 or no neurons) gives empty outputs; with T = 0 and
    ``store_v_seq=False`` the returned V is the initial one.

    Returns
    -------
    spike_seq : Tensor [T, *shape], values 0/1, differentiable through the surrogate.
    v_seq : Tensor [T, *shape] or [1, *shape].

    Examples
    --------
    >>> import torch, symneuron as sn
    >>> spikes, v = sn.simulate(sn.models.LIF(), torch.rand(8, 32))
    """
    if not isinstance(neuron, Definition):
        raise TypeError(f"neuron must be a symneuron.Neuron, got {type(neuron).__name__}")
    if store_v_seq is not True and store_v_seq is not False:  # (a bool: no call)
        store_v_seq = flag(store_v_seq, "store_v_seq")
    if check_finite is not True and check_finite is not False:
        check_finite = flag(check_finite, "check_finite")
    x_seq = _check_x(x_seq)
    shape = x_seq.shape[1:]
    v0 = _v_init(neuron, v_init, x_seq, shape)
    values = _param_values(neuron, params, x_seq, shape)
    backend = resolve_backend(backend, x_seq.device)
    if backend != "torch":
        try:
            dtypes.lookup(backend, x_seq.dtype)
        except TypeError:
            raise TypeError(
                f"backend={backend!r} supports {dtypes.supported(backend)}, not "
                f"{x_seq.dtype}; convert x_seq or use backend='torch'."
            ) from None
    _warn_constants(neuron, x_seq.dtype, backend)
    check = check_finite and x_seq.shape[0] > 0
    keep = store_v_seq or check  # the check finds the first step: V of every step
    reference = backend == "torch" or x_seq.shape[0] == 0  # no kernel runs no steps
    w0 = _w_init(neuron, states, x_seq, shape, full=reference)
    if reference:
        if v0 is None:
            v0 = _default_v_init(neuron, x_seq, shape, values)
        result = simulate_reference(
            neuron,
            x_seq,
            v0,
            values,
            store_v_seq=keep,
            w_init=None if w0 is None else dict(zip(neuron.states, w0, strict=True)),
        )
        return _finish(result, x_seq, store_v_seq, check)
    if v0 is None and isinstance(neuron.v_start, sp.Expr):
        v0 = _default_v_init(neuron, x_seq, shape, values)
    t_len, n = x_seq.shape[0], math.prod(shape)
    param_list = [values[name] for name in neuron.params]
    store_h = torch.is_grad_enabled() and (
        x_seq.requires_grad
        or (v0 is not None and v0.requires_grad)
        or (w0 is not None and w0.requires_grad)
        or any(isinstance(p, torch.Tensor) and p.requires_grad for p in param_list)
    )
    flat = x_seq.dim() == 2  # already [T, N]: no reshape or view (each costs host time)
    x_flat = x_seq.contiguous() if flat else x_seq.reshape(t_len, n).contiguous()
    v_flat = None if v0 is None else v0.reshape(n).contiguous()
    w_flat = None if w0 is None else w0.reshape(len(neuron.states), n).contiguous()
    v_mode = "seq" if keep else "last"
    if store_h and not torch.compiler.is_compiling():
        # the eager binding: no dispatcher layers, no autograd node per param (see
        # symneuron.binding)
        prog = program(neuron, backend)
        out = EagerBinding.apply(prog, x_flat, v_flat, w_flat, v_mode, shape, *param_list)
        spike, v_out, w_out = out[0], out[1], out[2] if len(out) > 2 else None
    else:
        dtype, device = compute_dtype(backend, x_seq.dtype), x_seq.device
        if torch.compiler.is_compiling():  # the custom op, which compilation traces through
            kernel_params = [kernel_param(p, dtype, device, shape, n) for p in param_list]
            key = neuron.key()  # a plain string: the op finds the live neuron by it
            out = forward_op(key, backend, x_flat, v_flat, w_flat, kernel_params, store_h, v_mode)
            spike, v_out, w_out = out[0], out[1], out[3]
        else:  # inference: the kernels alone
            kernel_params = [launch_param(p, dtype, device, shape, n) for p in param_list]
            run = program(neuron, backend).forward(
                x_flat, v_flat, w_flat, kernel_params, False, v_mode
            )
            spike, v_out, w_out = run[0], run[1], run[3]
    rows = v_out.shape[0]
    out = (spike, v_out) if flat else (spike.view(x_seq.shape), v_out.view(rows, *shape))
    if w_out is not None:
        out = (*out, {w: w_out[i].view(rows, *shape) for i, w in enumerate(neuron.states)})
    return _finish(out, x_seq, store_v_seq, check)


def _finish(result: Any, x_seq: torch.Tensor, store_v_seq: bool, check: bool) -> Any:
    """With ``check``: raise at the first non-finite state, then keep the last step only
    unless ``store_v_seq`` (the run kept every step for the check)."""
    if not check:
        return result
    named_seqs = [("V", result[1]), *(result[2].items() if len(result) > 2 else ())]
    raise_if_not_finite(named_seqs, x_seq)
    if store_v_seq:
        return result
    last = (result[0], result[1][-1:])
    if len(result) > 2:
        return (*last, {name: seq[-1:] for name, seq in result[2].items()})
    return last


_CONSTANTS_CHECKED: set[tuple[str, torch.dtype, str]] = set()


def _warn_constants(neuron: Definition, dtype: torch.dtype, backend: str) -> None:
    """Warn (once per neuron, dtype and backend) when a constant of the equations or a
    default param is beyond the range of the dtype the run computes in."""
    key = (neuron.key(), dtype, backend)
    if torch.compiler.is_compiling() or key in _CONSTANTS_CHECKED:
        return
    if len(_CONSTANTS_CHECKED) > 4096:
        _CONSTANTS_CHECKED.clear()
    _CONSTANTS_CHECKED.add(key)
    compute = dtype if backend == "torch" else dtypes.lookup(backend, dtype).torch_compute
    limit = torch.finfo(compute).max
    exprs = [neuron.charge, neuron.v_threshold, neuron.v_reset]
    exprs += [e for st in neuron.states.values() for e in (st.update, st.on_spike)]
    huge = {c for e in exprs if isinstance(e, sp.Basic) for c in constants_beyond(e, limit)}
    huge |= {f"{n}={v:g}" for n, v in neuron.params.items() if not abs(v) <= limit}
    if huge:
        warnings.warn(
            f"symneuron: {neuron.name}'s equations hold {sorted(huge)}, beyond the range of "
            f"{dtypes.dtype_name(compute)} (±{limit:.3g}), which this run computes in: they "
            "become inf and the results NaN. Use float64 inputs or rescale the equations.",
            RuntimeWarning,
            stacklevel=3,
        )


def _w_init(
    neuron: Definition,
    states: Mapping[Any, Any] | None,
    x_seq: torch.Tensor,
    shape: torch.Size,
    full: bool,
) -> torch.Tensor | None:
    """Initial extra states as one [k, *shape] tensor; None when none is given (the
    kernels then start from each State.init) unless ``full``."""
    given = named(states, "state", neuron.states)
    if len(neuron.states) == 0 or (not given and not full):
        return None
    rows = []
    for name, state in neuron.states.items():
        value = given.get(name, state.init)
        if not isinstance(value, torch.Tensor):
            value = torch.full(
                (), finite_float(value, f"state {name!r}"), dtype=x_seq.dtype, device=x_seq.device
            )
        _check_tensor(name, value, x_seq, shape, "state")
        rows.append(value.to(x_seq.dtype).expand(shape))
    return torch.stack(rows)
