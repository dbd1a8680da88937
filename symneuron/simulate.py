"""``sn.simulate``: run a neuron over a sequence with the chosen backend."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import sympy as sp
import torch
import torch.autograd.forward_ad as forward_ad

from . import dtypes
from .binding import Run, run
from .definition import Definition
from .inputs import check_x, default_v_init, param_values, v_init_of, w_init_of
from .memo import BoundedTable
from .models import require_neuron
from .reference import simulate_reference
from .runtime import cpu, cuda
from .stochastic import call_state
from .validate import constants_beyond, flag, raise_if_not_finite

__all__ = ["simulate", "prepare", "resolve_backend", "BACKENDS"]

BACKENDS = ("auto", "cuda", "cpu", "torch")


#: fallbacks of backend="auto" already warned about in this process
_WARNED: BoundedTable[str, bool] = BoundedTable(16, "simulate.warned")


def _fallback(device: str, why: str) -> str:
    """backend="auto" runs the torch reference: warn once per device type."""
    if device not in _WARNED and not torch.compiler.is_compiling():
        _WARNED.put(device, True)
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
    seed: int | torch.Tensor | None = None,
) -> Any:
    """Run ``neuron`` over ``x_seq`` and return ``(spike_seq, v_seq)``.

    With extra state variables: ``(spike_seq, v_seq, states)``, ``states`` mapping each
    state's name to its values shaped as ``v_seq``.

    Parameters
    ----------
    neuron : symneuron.Neuron
    x_seq : Tensor [T, *shape]
        Input per step: float32/float64 (cpu), also float16 and bfloat16 (cuda).
    v_init : Tensor or float, optional
        V[0], broadcastable to ``shape``; default the neuron's ``v_init``, else ``v_reset``.
    params : mapping, optional
        Symbol or name -> float or tensor broadcastable to ``shape``; default the neuron's.
    backend : {"auto", "cuda", "cpu", "torch"}
        "auto": the device's kernels, else the reference (one warning; dtype, compiler).
    store_v_seq : bool
        Return V after every step ([T, *shape]); if False only the last ([1, *shape]).
    states : mapping, optional
        Initial values of the extra states (name or symbol -> float or tensor
        broadcastable to ``shape``); omitted ones start at their ``State.init``.
    check_finite : bool
        Raise :class:`~symneuron.validate.NonFiniteError` naming the first step and
        neuron at which V (or an extra state) became NaN or ±inf. Off by default: it
        reads the results back (a device synchronisation; not inside ``torch.compile``).
        Tensor params are checked too. Every backend computes the same NaN and inf.
    seed : int, optional
        A noisy neuron's draws (docs/noise.md): an int in [0, 2**63) fixes them, on every
        backend; None takes a seed from torch's generator (``torch.manual_seed``); an int64
        tensor [seed, offset] is the generator's state itself. Other neurons ignore it.

    Returns
    -------
    spike_seq : Tensor [T, *shape], values 0/1, differentiable through the surrogate
        (once: ``create_graph=True`` through the kernels raises; use backend="torch").
    v_seq : Tensor [T, *shape] or [1, *shape]. Empty inputs give empty outputs; with
        T = 0 and ``store_v_seq=False``, V is the initial one.

    Examples
    --------
    >>> import torch, symneuron as sn
    >>> spikes, v = sn.simulate(sn.models.LIF(), torch.rand(8, 32))
    """
    job, check = prepare(
        neuron,
        x_seq,
        v_init,
        params,
        backend=backend,
        store_v_seq=store_v_seq,
        states=states,
        check_finite=check_finite,
        seed=seed,
    )
    return run_prepared(job, check, x_seq, store_v_seq)


def run_prepared(job: Run | Callable[[], Any], check: bool, x_seq: Any, store_v_seq: bool) -> Any:
    """The results of a call :func:`prepare` validated (its ``job`` and ``check``), as
    :func:`simulate` returns them."""
    result = _shaped(job, *run(job)) if isinstance(job, Run) else job()
    return _finish(result, x_seq, store_v_seq) if check else result


def next_step(
    job: Run,
    x: torch.Tensor,
    v: torch.Tensor,
    states: Mapping[str, torch.Tensor] | None,
    seed: Any = None,
) -> Any:
    """One more step after the step :func:`prepare` validated into ``job`` (a kernels'
    run of one step, unchecked for finite values), of the same neuron, backend, shape,
    dtype and parameters: ``x`` its input ([*shape] or [1, *shape]), ``v`` and ``states``
    (by name) the step before's results, ``seed`` its draw. The results as
    :func:`simulate`'s.

    A loop over steps (a recurrent layer's) validates its first step only: what
    :func:`prepare` checks is the same at every step, and checking it costs host time."""
    n = job.x_seq.shape[1]
    w0 = torch.stack([states[name] for name in job.neuron.states]) if states else None
    rng = call_state(seed, x.device) if job.neuron.draws else None
    flat = x.reshape(1, n)
    step = _kernel_run(job.neuron, job.backend, flat, job.shape, v, w0, job.params, job.v_mode, rng)
    return _shaped(step, *run(step))


def _refuse_tangents(*given: Any) -> None:
    """RuntimeError if any tensor among ``given`` (or in a mapping or sequence of them)
    carries a forward-mode tangent: the fused kernels have no forward-mode rule, and
    their outputs would silently carry none."""
    stack = list(given)
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, torch.Tensor) and forward_ad.unpack_dual(value).tangent is not None:
            raise RuntimeError(
                "symneuron: the fused kernels have no forward-mode AD rule "
                "(torch.autograd.forward_ad, jvp), so a dual input's tangent would be lost. "
                "Pass backend='torch' (the reference, plain torch ops), which propagates "
                "tangents, or take the gradient in reverse mode."
            )


def prepare(
    neuron: Definition,
    x_seq: Any,
    v_init: Any = None,
    params: Mapping[Any, Any] | None = None,
    *,
    backend: str = "auto",
    store_v_seq: bool = True,
    states: Mapping[Any, Any] | None = None,
    check_finite: bool = False,
    seed: Any = None,
) -> tuple[Run | Callable[[], Any], bool]:
    """Validate a call of :func:`simulate` (same arguments) and decide how it runs: a
    :class:`~symneuron.binding.Run` of the kernels, or the torch reference as a call
    with no arguments; and whether the results are checked for non-finite values."""
    if not isinstance(neuron, Definition):
        require_neuron(neuron)
    if store_v_seq is not True and store_v_seq is not False:  # (a bool: no call)
        store_v_seq = flag(store_v_seq, "store_v_seq")
    if check_finite is not True and check_finite is not False:
        check_finite = flag(check_finite, "check_finite")
    x_seq = check_x(x_seq)
    compiling = torch.compiler.is_compiling()  # (asked once: host time)
    if backend != "torch" and not compiling and torch._C._are_functorch_transforms_active():
        raise RuntimeError(
            "symneuron: the fused kernels do not support functorch transforms (vmap, grad, "
            "jacrev, jvp, ...): their autograd Function has no vmap or forward-mode rule. "
            "Pass backend='torch' (the reference, plain torch ops) inside the transform."
        )
    if check_finite and compiling:
        raise RuntimeError(
            "symneuron: check_finite=True reads the results on the host, which "
            "torch.compile(fullgraph=True) cannot trace; check outside the compiled "
            "function (sn.validate.raise_if_not_finite) or drop check_finite."
        )
    shape = x_seq.shape[1:]
    v0 = v_init_of(neuron, v_init, x_seq, shape)
    values = param_values(neuron, params, x_seq, shape)
    if check_finite:  # (reads tensor values back: only when the check is asked for)
        _raise_if_nonfinite_params(values)
    backend = _chosen_backend(neuron, backend, x_seq, compiling)
    if backend != "torch" and forward_ad._current_level >= 0 and not compiling:
        _refuse_tangents(x_seq, v0, values, states)
    check = check_finite and x_seq.shape[0] > 0
    keep = store_v_seq or check  # the check finds the first step: V of every step
    reference = backend == "torch" or x_seq.shape[0] == 0  # no kernel runs no steps
    w0 = w_init_of(neuron, states, x_seq, shape, full=reference)
    rng = call_state(seed, x_seq.device) if neuron.draws else None
    if reference:
        v0 = default_v_init(neuron, x_seq, shape, values) if v0 is None else v0
        w_dict = None if w0 is None else dict(zip(neuron.states, w0, strict=True))
        return partial(
            simulate_reference, neuron, x_seq, v0, values, store_v_seq=keep, w_init=w_dict, rng=rng
        ), check
    if v0 is None and isinstance(neuron.v_start, sp.Expr):
        v0 = default_v_init(neuron, x_seq, shape, values)
    v_mode = "seq" if keep else "last"
    return _kernel_run(  # (rng at construction: Dynamo of torch 2.8 can't trace _replace)
        neuron, backend, x_seq, shape, v0, w0, tuple(values.values()), v_mode, rng
    ), check


def _raise_if_nonfinite_params(values: dict[str, float | torch.Tensor]) -> None:
    for name, value in values.items():
        if isinstance(value, torch.Tensor) and not bool(torch.isfinite(value).all()):
            raise ValueError(
                f"param {name!r} holds NaN or ±inf values; give finite values (as a "
                "NeuronLayer requires of its parameters)"
            )


#: (neuron key, backend as named, device type, dtype) -> the backend that runs, kept once
#: its checks passed and its constants were checked; a backend named by the caller only
#: ("auto" chooses by what is installed, asked each call)
_CHOSEN: BoundedTable[tuple[str, str, str, torch.dtype], str] = BoundedTable(
    4096, "simulate.chosen"
)


def _chosen_backend(neuron: Definition, backend: str, x_seq: torch.Tensor, compiling: bool) -> str:
    """:func:`_kernel_backend`, and :func:`_warn_constants` outside compilation; for a
    named backend one look-up of :data:`_CHOSEN` once that was done (host time)."""
    if compiling or backend == "auto":
        chosen = _kernel_backend(backend, x_seq)
        if not compiling:
            _warn_constants(neuron, x_seq.dtype, chosen)
        return chosen
    key = (neuron.key(), backend, x_seq.device.type, x_seq.dtype)
    found = _CHOSEN.get(key)
    if found is None:
        found = _kernel_backend(backend, x_seq)
        _warn_constants(neuron, x_seq.dtype, found)
        _CHOSEN.put(key, found)
    return found


def _kernel_backend(backend: str, x_seq: torch.Tensor) -> str:
    """The backend that runs: ``"auto"`` resolved, and the torch reference (one warning)
    when the backend it picked lacks the dtype (bfloat16 on the CPU, e.g. under
    ``torch.autocast``); a TypeError naming the dtypes of a backend the user chose."""
    chosen = resolve_backend(backend, x_seq.device)
    if chosen == "torch":
        return chosen
    try:
        dtypes.lookup(chosen, x_seq.dtype)  # (a cached row: host time)
        return chosen
    except TypeError:
        pass
    kernels = f"the {chosen} kernels take {', '.join(dtypes.supported(chosen))}"
    if backend == "auto":
        why = f"{kernels}, not {dtypes.dtype_name(x_seq.dtype)} (run outside torch.autocast)."
        return _fallback(f"{x_seq.device.type} {dtypes.dtype_name(x_seq.dtype)}", why)
    raise TypeError(
        f"backend={chosen!r} supports {dtypes.supported(chosen)}, not "
        f"{x_seq.dtype}; convert x_seq or use backend='torch'."
    )


def _kernel_run(
    neuron: Definition,
    backend: str,
    x_seq: torch.Tensor,
    shape: torch.Size,
    v0: torch.Tensor | None,
    w0: torch.Tensor | None,
    param_list: tuple[float | torch.Tensor, ...],
    v_mode: str,
    rng: torch.Tensor | None = None,
) -> Run:
    """The kernels' run: inputs flattened to [T, N] (already [T, N]: no reshape or view,
    each costs host time), H stored when autograd will need it; ``shape`` the neuron
    shape (``x_seq.shape[1:]``), ``param_list`` every param's value in the neuron's
    order."""
    t_len, n = x_seq.shape[0], math.prod(shape)
    store_h = torch.is_grad_enabled() and (
        x_seq.requires_grad
        or (v0 is not None and v0.requires_grad)
        or (w0 is not None and w0.requires_grad)
        or any(isinstance(p, torch.Tensor) and p.requires_grad for p in param_list)
    )
    flat = x_seq.dim() == 2
    x_flat = x_seq.contiguous() if flat else x_seq.reshape(t_len, n).contiguous()
    v_flat = None if v0 is None else v0.reshape(n).contiguous()
    w_flat = None if w0 is None else w0.reshape(len(neuron.states), n).contiguous()
    return Run(neuron, backend, x_flat, shape, v_flat, w_flat, param_list, store_h, v_mode, rng)


def _shaped(
    job: Run, spike: torch.Tensor, v_out: torch.Tensor, w_out: torch.Tensor | None
) -> tuple[Any, ...]:
    """The kernels' [T, N] outputs in the input's shape; the states as a dict by name."""
    shape = job.shape
    flat = len(shape) == 1
    if flat and w_out is None:
        return spike, v_out
    rows = v_out.shape[0]
    out = (spike, v_out) if flat else (spike.view(spike.shape[0], *shape), v_out.view(rows, *shape))
    if w_out is None:
        return out
    return (*out, {w: w_out[i].view(rows, *shape) for i, w in enumerate(job.neuron.states)})


def _finish(result: Any, x_seq: torch.Tensor, store_v_seq: bool) -> Any:
    """Raise at the first non-finite state, then keep the last step only unless
    ``store_v_seq`` (the run kept every step for the check)."""
    named_seqs = [("V", result[1]), *(result[2].items() if len(result) > 2 else ())]
    raise_if_not_finite(named_seqs, x_seq)
    if store_v_seq:
        return result
    last = (result[0], result[1][-1:])
    if len(result) > 2:
        return (*last, {name: seq[-1:] for name, seq in result[2].items()})
    return last


_CONSTANTS_CHECKED: BoundedTable[tuple[str, torch.dtype, str], bool] = BoundedTable(
    4096, "simulate.constants_checked"
)


def _warn_constants(neuron: Definition, dtype: torch.dtype, backend: str) -> None:
    """Warn (once per neuron, dtype and backend) when a constant of the equations or a
    default param is beyond the range of the dtype the run computes in (called outside
    compilation)."""
    key = (neuron.key(), dtype, backend)
    if key in _CONSTANTS_CHECKED:
        return
    _CONSTANTS_CHECKED.put(key, True)
    compute = dtype if backend == "torch" else dtypes.lookup(backend, dtype).torch_compute
    limit = torch.finfo(compute).max
    exprs = [neuron.step_charge, neuron.v_threshold, neuron.v_reset]
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
