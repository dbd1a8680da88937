"""The torch binding: generated kernels as ``torch.library`` custom ops.

:func:`forward_impl` and :func:`backward_impl` allocate outputs and launch the
generated kernels. ``symneuron::forward`` and ``symneuron::backward`` wrap them
as custom ops (with fake implementations and an autograd formula, so
``torch.compile`` traces through them and ``torch.library.opcheck`` passes).
Eager calls take :class:`_EagerBinding`, one generic ``autograd.Function`` over
the same two functions and the same save/gradient helpers, which skips the
custom-op dispatcher's per-call Python layers. A neuron reaches the kernels
through its key in a process-wide registry, since op arguments must be plain types.
"""

from __future__ import annotations

from typing import Any

import torch

from . import runtime
from .codegen import DIALECTS, dtype_name, render_source
from .codegen.kernels import backward_name, forward_name
from .neuron import Neuron

__all__ = [
    "register",
    "run",
    "forward_op",
    "backward_op",
    "forward_impl",
    "backward_impl",
    "compute_dtype",
    "accum_dtype",
]

_NEURONS: dict[str, Neuron] = {}
_COMPUTE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


@torch.compiler.assume_constant_result
def register(neuron: Neuron) -> str:
    """Make ``neuron`` reachable from the ops; returns its key."""
    key = neuron.key()
    _NEURONS.setdefault(key, neuron)
    return key


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of parameters and arithmetic inside kernels for storage ``dtype``."""
    return _COMPUTE.get(dtype, dtype)


def accum_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


_MODULES: dict[tuple[str, str, torch.dtype, int, str], Any] = {}
#: Fewest threads for which a CUDA launch packs several neurons per thread:
#: below this, one neuron per thread keeps more of the GPU busy.
MIN_VECTOR_THREADS = 64 * 1024


def _module(neuron: Neuron, backend: str, tensor: torch.Tensor, kernel: str) -> Any:
    """The compiled module holding ``kernel`` for (neuron, backend, dtype, device).

    Each kernel is rendered and compiled on first use only, so a first call
    compiles just the forward and backward variants it runs.
    """
    device = tensor.device.index or 0 if tensor.is_cuda else -1
    key = (neuron.key(), backend, tensor.dtype, device, kernel)
    module = _MODULES.get(key)
    if module is None:
        source = render_source(neuron.spec(), backend, tensor.dtype, kernel)
        if backend == "cuda":
            from .runtime import cuda

            module = cuda.load(source, device)
        else:
            from .runtime import cpu

            module = cpu.load(source)
        _MODULES[key] = module
    return module


def _lanes(backend: str, tensors: list[torch.Tensor | None], n: int) -> int:
    """Neurons per thread: the dtype's vector width when sizes and alignment allow."""
    if backend != "cuda":
        return 1
    lanes = DIALECTS["cuda"][1][dtype_name(tensors[0].dtype)].lanes  # type: ignore[union-attr]
    if n % lanes or n < lanes * MIN_VECTOR_THREADS:
        return 1
    if any(t is not None and t.numel() > 1 and t.data_ptr() % 16 for t in tensors):
        return 1
    return lanes


def _launch(
    backend: str,
    module: Any,
    name: str,
    args: list[runtime.Arg],
    threads: int,
    device: torch.device,
) -> None:
    if backend == "cuda":
        from .runtime import cuda

        cuda.launch(module, name, args, threads, device.index or 0)
    else:
        from .runtime import cpu

        cpu.launch(module, name, args, threads)


def _param_args(params: list[torch.Tensor]) -> tuple[list[runtime.Arg], list[runtime.Arg]]:
    pointers = [runtime.ptr(p) for p in params]
    strides = [runtime.i64(p.stride(0) if p.dim() else 0) for p in params]
    return pointers, strides


def forward_impl(
    key: str,
    backend: str,
    x_seq: torch.Tensor,
    v_init: torch.Tensor | None,
    params: list[torch.Tensor],
    store_h: bool,
    v_mode: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward over ``x_seq`` [T, N]: (spike_seq, v_seq or v_last, h_seq or empty).

    ``v_init=None`` starts every neuron at the spec's ``v_start`` without a tensor.
    """
    neuron = _NEURONS[key]
    t_len, n = x_seq.shape
    spike = torch.empty_like(x_seq)
    v_out = torch.empty(
        (t_len if v_mode == "seq" else 1, n), dtype=x_seq.dtype, device=x_seq.device
    )
    h_seq = torch.empty((t_len, n) if store_h else (0,), dtype=x_seq.dtype, device=x_seq.device)
    if n == 0:
        return spike, v_out, h_seq
    pointers, strides = _param_args(params)
    args = [
        runtime.ptr(x_seq),
        runtime.ptr(v_init),
        *pointers,
        runtime.ptr(spike),
        runtime.ptr(h_seq if store_h else None),
        runtime.ptr(v_out),
        *strides,
        runtime.i32(t_len),
        runtime.i64(n),
    ]
    lanes = _lanes(backend, [x_seq, spike, h_seq, v_out], n)
    name = forward_name(neuron.spec(), store_h, v_mode, lanes)
    _launch(backend, _module(neuron, backend, x_seq, name), name, args, n // lanes, x_seq.device)
    return spike, v_out, h_seq


@torch.library.custom_op("symneuron::forward", mutates_args=())
def forward_op(
    key: str,
    backend: str,
    x_seq: torch.Tensor,
    v_init: torch.Tensor | None,
    params: list[torch.Tensor],
    store_h: bool,
    v_mode: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward as a custom op (see :func:`forward_impl`)."""
    return forward_impl(key, backend, x_seq, v_init, params, store_h, v_mode)


@forward_op.register_fake
def _(key, backend, x_seq, v_init, params, store_h, v_mode):
    t_len, n = x_seq.shape
    v_rows = t_len if v_mode == "seq" else 1
    h_shape = (t_len, n) if store_h else (0,)
    return (x_seq.new_empty((t_len, n)), x_seq.new_empty((v_rows, n)), x_seq.new_empty(h_shape))


def backward_impl(
    key: str,
    backend: str,
    grad_spike: torch.Tensor,
    grad_v: torch.Tensor | None,
    grad_v_mode: str,
    h_seq: torch.Tensor,
    x_seq: torch.Tensor | None,
    v_init: torch.Tensor | None,
    params: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward through time: (grad_x [T, N], grad_v_init [N] or empty, grad_params [P, N])."""
    neuron = _NEURONS[key]
    t_len, n = h_seq.shape
    grad_x = torch.empty_like(h_seq)
    grad_v_init = h_seq.new_empty((0,) if v_init is None else (n,))
    learnable = len(neuron.learnable)
    acc = accum_dtype(h_seq.dtype)
    grad_params = torch.empty((learnable, n), dtype=acc, device=h_seq.device)
    if n == 0:
        return grad_x, grad_v_init, grad_params
    pointers, strides = _param_args(params)
    spike_scalar = grad_spike.numel() > 1 and all(st == 0 for st in grad_spike.stride())
    args = [
        runtime.ptr(grad_spike),
        runtime.ptr(grad_v),
        runtime.ptr(h_seq),
        runtime.ptr(x_seq),
        runtime.ptr(v_init),
        *pointers,
        runtime.ptr(grad_x),
        runtime.ptr(None if v_init is None else grad_v_init),
        *[runtime.ptr(grad_params[j]) for j in range(learnable)],
        *strides,
        runtime.i32(int(spike_scalar)),
        runtime.i32(t_len),
        runtime.i64(n),
    ]
    lanes = _lanes(backend, [h_seq, grad_x, x_seq, grad_v, None if spike_scalar else grad_spike], n)
    name = backward_name(neuron.spec(), grad_v_mode, lanes)
    _launch(backend, _module(neuron, backend, h_seq, name), name, args, n // lanes, h_seq.device)
    return grad_x, grad_v_init, grad_params


@torch.library.custom_op("symneuron::backward", mutates_args=())
def backward_op(
    key: str,
    backend: str,
    grad_spike: torch.Tensor,
    grad_v: torch.Tensor | None,
    grad_v_mode: str,
    h_seq: torch.Tensor,
    x_seq: torch.Tensor | None,
    v_init: torch.Tensor | None,
    params: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward as a custom op (see :func:`backward_impl`)."""
    return backward_impl(
        key, backend, grad_spike, grad_v, grad_v_mode, h_seq, x_seq, v_init, params
    )


@backward_op.register_fake
def _(key, backend, grad_spike, grad_v, grad_v_mode, h_seq, x_seq, v_init, params):
    learnable = len(_NEURONS[key].learnable)
    acc = accum_dtype(h_seq.dtype)
    grad_params = h_seq.new_empty((learnable, h_seq.shape[1]), dtype=acc)
    grad_v_init = h_seq.new_empty((0,) if v_init is None else (h_seq.shape[1],))
    return h_seq.new_empty(h_seq.shape), grad_v_init, grad_params


def _save(
    ctx: Any,
    key: str,
    backend: str,
    v_mode: str,
    x_seq: torch.Tensor,
    v_init: torch.Tensor | None,
    params: list[torch.Tensor] | tuple[torch.Tensor, ...],
    h_seq: torch.Tensor,
) -> None:
    """Keep for backward: H, v_init, X only when a partial needs it, and the params."""
    ctx.key, ctx.backend, ctx.v_mode = key, backend, v_mode
    ctx.n_params = len(params)
    needs_x = _NEURONS[key].spec().needs_x
    ctx.save_for_backward(h_seq, v_init, x_seq if needs_x else None, *params)
    ctx.mark_non_differentiable(h_seq)
    ctx.set_materialize_grads(False)


def _gradients(ctx: Any, grad_spike: Any, grad_v: Any, backward: Any) -> tuple[Any, Any, list[Any]]:
    """(grad_x, grad_v_init, grad per param) from the saved context, via ``backward``."""
    h_seq, v_init, x_seq, *params = ctx.saved_tensors
    if h_seq.dim() == 1:
        raise RuntimeError(
            "symneuron: the forward ran without saving H (no input required grad at the "
            "time); run it again with grad enabled."
        )
    if grad_spike is None:
        grad_spike = torch.zeros_like(h_seq)
    elif not all(st == 0 for st in grad_spike.stride()):
        grad_spike = grad_spike.contiguous()
    mode = "none" if grad_v is None else ctx.v_mode
    grad_v = None if grad_v is None else grad_v.contiguous()
    grad_x, grad_v_init, grad_p = backward(
        ctx.key, ctx.backend, grad_spike, grad_v, mode, h_seq, x_seq, v_init, params
    )
    spec = _NEURONS[ctx.key].spec()
    grads: list[torch.Tensor | None] = [None] * ctx.n_params
    for j, name in enumerate(spec.learnable):
        index = spec.params.index(name)
        grads[index] = grad_p[j].to(params[index].dtype)
    return grad_x, None if v_init is None else grad_v_init, grads


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    key, backend, x_seq, v_init, params, _store_h, v_mode = inputs
    _save(ctx, key, backend, v_mode, x_seq, v_init, params, output[2])


def _backward(ctx: Any, grad_spike: Any, grad_v: Any, _grad_h: Any) -> tuple[Any, ...]:
    grad_x, grad_v_init, grads = _gradients(ctx, grad_spike, grad_v, backward_op)
    return None, None, grad_x, grad_v_init, grads, None, None


forward_op.register_autograd(_backward, setup_context=_setup_context)


class _EagerBinding(torch.autograd.Function):
    """The same forward/backward implementations without the dispatcher's Python layers.

    Outside ``torch.compile`` a custom op pays tens of microseconds per call in
    Python (schema handling, pytree flattening, alias checks); this generic
    binding, shared by every neuron, calls :func:`forward_impl` and
    :func:`backward_impl` directly. Under compilation the custom ops are used.
    """

    @staticmethod
    def forward(
        ctx: Any,
        key: str,
        backend: str,
        x_seq: torch.Tensor,
        v_init: torch.Tensor | None,
        v_mode: str,
        *params: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        out = forward_impl(key, backend, x_seq, v_init, list(params), True, v_mode)
        _save(ctx, key, backend, v_mode, x_seq, v_init, params, out[2])
        return out

    @staticmethod
    def backward(ctx: Any, grad_spike: Any, grad_v: Any, _grad_h: Any) -> tuple[Any, ...]:
        grad_x, grad_v_init, grads = _gradients(ctx, grad_spike, grad_v, backward_impl)
        return None, None, grad_x, grad_v_init, None, *grads


def run(
    key: str,
    backend: str,
    x_seq: torch.Tensor,
    v_init: torch.Tensor | None,
    params: list[torch.Tensor],
    store_h: bool,
    v_mode: str,
) -> tuple[torch.Tensor, ...]:
    """Forward with autograd: the custom op when compiling, else the eager binding."""
    if torch.compiler.is_compiling():
        return forward_op(key, backend, x_seq, v_init, params, store_h, v_mode)
    if not store_h:
        return forward_impl(key, backend, x_seq, v_init, params, False, v_mode)
    return _EagerBinding.apply(key, backend, x_seq, v_init, v_mode, *params)
