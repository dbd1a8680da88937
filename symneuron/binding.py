"""The autograd binding: a neuron's kernels as differentiable torch operations.

Two bindings over the same :class:`~symneuron.runtime.kernels.Program`:

* eager calls take :class:`EagerBinding`, one generic ``autograd.Function``
  handed the program itself, which skips the custom-op dispatcher's per-call
  Python layers;
* under ``torch.compile``, ``symneuron::forward`` and ``symneuron::backward`` are
  ``torch.library`` custom ops (fake implementations and an autograd formula, so
  compilation traces through them and ``torch.library.opcheck`` passes). Op
  arguments must be plain types, so they name the program by the neuron's key and
  the backend (:func:`symneuron.runtime.kernels.lookup` finds it).

Both save the same tensors and compute gradients with the same helper.
"""

from __future__ import annotations

from typing import Any

import torch

from . import dtypes
from .definition import Definition
from .runtime.kernels import Program, lookup, program

__all__ = [
    "register",
    "program",
    "forward_op",
    "backward_op",
    "EagerBinding",
    "kernel_param",
    "launch_param",
]


def register(neuron: Definition, backend: str) -> str:
    """Create ``neuron``'s program on ``backend`` now; returns the key the ops take.

    Not needed before calling the ops (they find a live neuron by its key); useful to
    compile nothing lazily inside a traced region."""
    return program(neuron, backend).key


#: (backend, dtype) -> the dtype the kernels compute in (a dict lookup, not a str())
_COMPUTE: dict[tuple[str, torch.dtype], torch.dtype] = {}


def compute_dtype(backend: str, dtype: torch.dtype) -> torch.dtype:
    """The torch dtype ``backend``'s kernels compute in for inputs of ``dtype`` (cached)."""
    found = _COMPUTE.get((backend, dtype))
    if found is None:
        found = dtypes.lookup(backend, dtype).torch_compute
        if not torch.compiler.is_compiling():
            _COMPUTE[(backend, dtype)] = found
    return found


_SCALARS: dict[tuple[float, torch.dtype, torch.device], torch.Tensor] = {}


def _scalar(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 0-dim tensor holding ``value``; cached (read-only) outside compilation and capture."""
    if torch.compiler.is_compiling():
        return torch.full((), value, dtype=dtype, device=device)
    key = (value, dtype, device)
    tensor = _SCALARS.get(key)
    if tensor is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return torch.full((), value, dtype=dtype, device=device)
        if len(_SCALARS) > 1024:
            _SCALARS.clear()
        tensor = _SCALARS[key] = torch.full((), value, dtype=dtype, device=device)
    return tensor


def kernel_param(
    value: float | torch.Tensor,
    dtype: torch.dtype,
    device: torch.device,
    shape: tuple[int, ...],
    n: int,
) -> torch.Tensor:
    """A param (float, or tensor broadcastable to ``shape``) as an [n] tensor in
    ``dtype`` (stride 0 when scalar), ``n`` the number of neurons in ``shape``:
    :func:`launch_param`'s value, a single one expanded to [n]."""
    out = launch_param(value, dtype, device, shape, n)
    return out.expand(n) if out.dim() == 0 else out


def launch_param(
    value: float | torch.Tensor,
    dtype: torch.dtype,
    device: torch.device,
    shape: tuple[int, ...],
    n: int,
) -> torch.Tensor:
    """A param as the kernels read it: a 0-dim tensor for one value (stride 0, no view
    made when it already is one in ``dtype``), else as :func:`kernel_param`. The
    launches take only each param's address and stride."""
    if not isinstance(value, torch.Tensor):
        return _scalar(value, dtype, device)
    if value.dtype != dtype:
        value = value.to(dtype)
    if value.dim() == 0:
        return value
    if value.numel() == 1:
        return value.reshape(())
    return value.expand(shape).reshape(n)


def _grad_shape(value: Any, shape: tuple[int, ...], n: int) -> tuple[int, ...] | None:
    """The shape :class:`EagerBinding` gives a param's [n] gradient so that autograd's
    reduction to the param's own shape sums it as :func:`kernel_param`'s views would
    (None for a float)."""
    if not isinstance(value, torch.Tensor):
        return None
    if value.numel() == 1:
        return (1,) * (value.dim() - 1) + (n,) if value.dim() else (n,)
    return shape


def _empty(like: torch.Tensor, value: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
    return like.new_empty(shape) if value is None else value


#: The ops' signatures, written once (the Python functions below take them as given).
FORWARD_SCHEMA = (
    "(str key, str backend, Tensor x_seq, Tensor? v_init, Tensor? w_init, Tensor[] params, "
    "bool store_h, str v_mode) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)
BACKWARD_SCHEMA = (
    "(str key, str backend, Tensor grad_spike, Tensor? grad_v, Tensor? grad_w, "
    "str grad_v_mode, Tensor h_seq, Tensor wt_seq, Tensor? x_seq, Tensor? v_init, "
    "Tensor? w_init, Tensor[] params) -> (Tensor, Tensor, Tensor, Tensor)"
)


@torch.library.custom_op("symneuron::forward", mutates_args=(), schema=FORWARD_SCHEMA)
def forward_op(key: str, backend: str, *args: Any) -> tuple[torch.Tensor, ...]:
    """:meth:`Program.forward` as a custom op (:data:`FORWARD_SCHEMA`): (spike_seq, v_out,
    h_seq or empty, w_out [k, rows, N], wt_seq [k, T, N] or empty)."""
    spike, v_out, h_seq, w_out, wt_seq = lookup(key, backend).forward(*args)
    x_seq = args[0]
    empty_w = (0, v_out.shape[0], x_seq.shape[1])
    return (
        spike,
        v_out,
        _empty(x_seq, h_seq, (0,)),
        _empty(x_seq, w_out, empty_w),
        _empty(x_seq, wt_seq, (0,)),
    )


@forward_op.register_fake
def _(key, backend, x_seq, v_init, w_init, params, store_h, v_mode):
    t_len, n = x_seq.shape
    rows = t_len if v_mode == "seq" else 1
    prog = lookup(key, backend)
    k = prog.k
    return (
        x_seq.new_empty((t_len, n)),
        x_seq.new_empty((rows, n)),
        x_seq.new_empty((t_len, n) if store_h else (0,)),
        x_seq.new_empty((k, rows, n)),
        x_seq.new_empty((k, t_len, n) if store_h and prog.needs_wt else (0,)),
    )


@torch.library.custom_op("symneuron::backward", mutates_args=(), schema=BACKWARD_SCHEMA)
def backward_op(key: str, backend: str, *args: Any) -> tuple[torch.Tensor, ...]:
    """:meth:`Program.backward` as a custom op (:data:`BACKWARD_SCHEMA`): (grad_x,
    grad_v_init or empty, grad_w_init or empty, grad_params [P, N])."""
    values = list(args)
    h_seq = values[4]
    if values[5].dim() != 3:  # wt_seq: an empty placeholder when no W̃ was saved
        values[5] = None
    grad_x, grad_v_init, grad_w_init, grad_params = lookup(key, backend).backward(*values)
    if grad_params is None:
        grad_params = h_seq.new_empty((0, h_seq.shape[1]), dtype=_accum(backend, h_seq))
    return grad_x, _empty(h_seq, grad_v_init, (0,)), _empty(h_seq, grad_w_init, (0,)), grad_params


def _accum(backend: str, h_seq: torch.Tensor) -> torch.dtype:
    return dtypes.lookup(backend, h_seq.dtype).torch_accum


@backward_op.register_fake
def _(key, backend, grad_spike, grad_v, grad_w, mode, h_seq, wt_seq, x_seq, v_init, w_init, params):
    prog = lookup(key, backend)
    n = h_seq.shape[1]
    return (
        h_seq.new_empty(h_seq.shape),
        h_seq.new_empty((0,) if v_init is None else (n,)),
        h_seq.new_empty((0,) if w_init is None else (prog.k, n)),
        h_seq.new_empty((prog.n_learnable, n), dtype=_accum(backend, h_seq)),
    )


def _save(
    ctx: Any,
    prog: Program,
    v_mode: str,
    inputs: tuple[torch.Tensor | None, ...],
    params: list[torch.Tensor] | tuple[torch.Tensor, ...],
    saved: tuple[torch.Tensor | None, torch.Tensor | None],
    outputs: bool,
) -> None:
    """Keep for backward: H and W̃ (extra states only), v_init, w_init, X only when a
    partial needs it, and the params. ``inputs`` = (x_seq, v_init, w_init); ``outputs``:
    H and W̃ are outputs of the op (custom op), not intermediates (eager binding)."""
    x_seq, v_init, w_init = inputs
    h_seq, wt_seq = saved
    ctx.program, ctx.v_mode, ctx.n_params = prog, v_mode, len(params)
    x_kept = x_seq if prog.needs_x else None
    ctx.save_for_backward(h_seq, wt_seq, v_init, w_init, x_kept, *params)
    if outputs:
        ctx.mark_non_differentiable(h_seq, wt_seq)
    ctx.set_materialize_grads(False)


def _gradients(
    ctx: Any, grad_spike: Any, grad_v: Any, grad_w: Any, compiled: bool
) -> tuple[Any, Any, Any, list[Any]]:
    """(grad_x, grad_v_init, grad_w_init, grad per param) from the saved context."""
    h_seq, wt_seq, v_init, w_init, x_seq, *params = ctx.saved_tensors
    prog: Program = ctx.program
    if h_seq.dim() == 1:
        raise RuntimeError(
            "symneuron: the forward ran without saving H (no input required grad at the "
            "time); run it again with grad enabled."
        )
    if grad_spike is None:
        grad_spike = torch.zeros_like(h_seq)
    elif any(grad_spike.stride()):
        grad_spike = grad_spike.contiguous()
    mode = "none" if grad_v is None and grad_w is None else ctx.v_mode
    if mode != "none":
        rows = h_seq.shape[0] if mode == "seq" else 1
        grad_v = h_seq.new_zeros((rows, h_seq.shape[1])) if grad_v is None else grad_v
        grad_w = h_seq.new_zeros((prog.k, rows, h_seq.shape[1])) if grad_w is None else grad_w
        grad_v, grad_w = grad_v.contiguous(), grad_w.contiguous()
    args = (grad_spike, grad_v, grad_w, mode, h_seq, wt_seq, x_seq, v_init, w_init, params)
    if compiled:
        grad_x, grad_v_init, grad_w_init, grad_p = backward_op(prog.key, prog.backend, *args)
    else:
        grad_x, grad_v_init, grad_w_init, grad_p = prog.backward(*args)
    grads: list[torch.Tensor | None] = [None] * ctx.n_params
    for j, index in prog.learnable_rows:
        grads[index] = grad_p[j].to(params[index].dtype)
    return (
        grad_x,
        None if v_init is None else grad_v_init,
        None if w_init is None else grad_w_init,
        grads,
    )


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    key, backend, x_seq, v_init, w_init, params, _store_h, v_mode = inputs
    saved = (output[2], output[4])
    prog = lookup(key, backend)
    _save(ctx, prog, v_mode, (x_seq, v_init, w_init), params, saved, outputs=True)


def _backward(
    ctx: Any, grad_spike: Any, grad_v: Any, _grad_h: Any, grad_w: Any, _grad_wt: Any
) -> tuple[Any, ...]:
    grad_x, grad_v_init, grad_w_init, grads = _gradients(ctx, grad_spike, grad_v, grad_w, True)
    return None, None, grad_x, grad_v_init, grad_w_init, grads, None, None


forward_op.register_autograd(_backward, setup_context=_setup_context)


class EagerBinding(torch.autograd.Function):
    """The same forward/backward launches without the dispatcher's Python layers.

    Outside ``torch.compile`` a custom op pays tens of microseconds per call in
    Python (schema handling, pytree flattening, alias checks); this generic
    binding, shared by every neuron, is handed the program and launches its
    kernels directly. Its outputs are only (spike_seq, v_out) and, for a neuron with
    extra states, w_out: H and W̃ are saved as intermediates, and no placeholder
    tensor is allocated.

    It takes the params as given (floats or tensors broadcastable to ``shape``) and
    makes their [N] kernel views itself, so that no autograd node is recorded per
    param: each gradient is returned as [N] values shaped for autograd's own reduction
    to the param's shape and dtype (the sum and cast the views' nodes would do).
    """

    @staticmethod
    def forward(
        ctx: Any,
        prog: Program,
        x_seq: torch.Tensor,
        v_init: torch.Tensor | None,
        w_init: torch.Tensor | None,
        v_mode: str,
        shape: tuple[int, ...],
        *values: float | torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        n = x_seq.shape[1]
        dtype, device = compute_dtype(prog.backend, x_seq.dtype), x_seq.device
        params = [launch_param(value, dtype, device, shape, n) for value in values]
        spike, v_out, h_seq, w_out, wt_seq = prog.forward(
            x_seq, v_init, w_init, params, True, v_mode
        )
        inputs = (x_seq, v_init, w_init)
        _save(ctx, prog, v_mode, inputs, params, (h_seq, wt_seq), outputs=False)
        ctx.grad_shapes = [_grad_shape(value, shape, n) for value in values]
        return (spike, v_out) if w_out is None else (spike, v_out, w_out)

    @staticmethod
    def backward(ctx: Any, grad_spike: Any, grad_v: Any, grad_w: Any = None) -> tuple[Any, ...]:
        grad_x, grad_v_init, grad_w_init, grads = _gradients(ctx, grad_spike, grad_v, grad_w, False)
        needs = ctx.needs_input_grad
        for i, grad_shape in enumerate(ctx.grad_shapes):
            if grads[i] is not None:
                grads[i] = grads[i].view(grad_shape) if needs[6 + i] else None
        return None, grad_x, grad_v_init, grad_w_init, None, None, *grads
