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

import functools
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sympy as sp
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


@functools.lru_cache(maxsize=1)
def generator_version() -> str:
    """Hash of symneuron's own sources and SymPy's version.

    Either can change the generated code of an unchanged neuron definition, so the
    on-disk cache of generated text (:func:`_generated`) is keyed by it as well.
    """
    digest = hashlib.sha256(sp.__version__.encode())
    root = Path(__file__).parent
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _generated(parts: tuple[str, ...], suffix: str, make: Callable[[], str]) -> str:
    """Text generated from a neuron, cached on disk under ``cache_dir()/generated``.

    ``parts`` identify it (with :func:`generator_version`); ``make`` produces it on a
    miss. A process that finds it skips SymPy altogether (derivation and printing),
    which is what makes a first call with a warm cache fast. The cache is only an
    optimisation: when the directory cannot be read or written, it is bypassed.
    """
    name = hashlib.sha256("\0".join((generator_version(), *parts)).encode()).hexdigest()[:32]
    try:
        path = runtime.cache_dir() / "generated" / f"{name}{suffix}"
    except OSError:
        return make()
    try:
        return path.read_text()
    except OSError:
        pass
    text = make()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_text(text)
        os.replace(partial, path)
    except OSError:
        pass
    return text


def _module(neuron: Neuron, backend: str, tensor: torch.Tensor, kernel: str) -> Any:
    """The compiled module holding ``kernel`` for (neuron, backend, dtype, device).

    Each kernel is rendered and compiled on first use only, so a first call
    compiles just the forward and backward variants it runs.
    """
    device = tensor.device.index or 0 if tensor.is_cuda else -1
    key = (neuron.key(), backend, tensor.dtype, device, kernel)
    module = _MODULES.get(key)
    if module is None:
        source = _generated(
            (neuron.key(), backend, dtype_name(tensor.dtype), kernel),
            ".cu" if backend == "cuda" else ".c",
            lambda: render_source(neuron.spec(), backend, tensor.dtype, kernel),
        )
        if backend == "cuda":
            from .runtime import cuda

            module = cuda.load(source, device)
        else:
            from .runtime import cpu

            module = cpu.load(source)
        _MODULES[key] = module
    return module


_NEEDS_X: dict[str, bool] = {}


def _needs_x(key: str) -> bool:
    """Whether the backward reads X (then the forward saves it); cached like the sources."""
    needs = _NEEDS_X.get(key)
    if needs is None:
        neuron = _NEURONS[key]
        text = _generated((key, "needs_x"), ".txt", lambda: str(int(neuron.spec().needs_x)))
        needs = _NEEDS_X[key] = text.strip() == "1"
    return needs


#: (neuron key, backend, dtype, device, variant, lanes) -> launch(args, threads)
_LAUNCHERS: dict[tuple[Any, ...], Any] = {}


def _launch(
    key: str,
    backend: str,
    tensor: torch.Tensor,
    variant: tuple[Any, ...],
    lanes: int,
    args: list[runtime.Arg],
    threads: int,
) -> None:
    """Launch kernel ``variant`` (("forward", store_h, v_mode) or ("backward", grad_v_mode))
    with ``lanes`` neurons per thread; the kernel is looked up once per process."""
    lkey = (key, backend, tensor.dtype, tensor.device, variant, lanes)
    launch = _LAUNCHERS.get(lkey)
    if launch is None:
        neuron = _NEURONS[key]
        if variant[0] == "forward":
            name = forward_name(neuron.name, variant[1], variant[2], lanes)
        else:
            name = backward_name(neuron.name, variant[1], lanes)
        module = _module(neuron, backend, tensor, name)
        if backend == "cuda":
            from .runtime import cuda

            launch = cuda.launcher(module, name, tensor.device.index or 0)
        else:
            from .runtime import cpu

            launch = cpu.launcher(module, name)
        _LAUNCHERS[lkey] = launch
    launch(args, threads)


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


def _state_outputs(
    k: int, rows: int, n: int, t_len: int, store_h: bool, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_out [k, rows, N], wt_seq [k, T, N] or empty) for ``k`` extra states."""
    w_out = like.new_empty((k, rows, n))
    wt_seq = like.new_empty((k, t_len, n) if store_h and k else (0,))
    return w_out, wt_seq


def _forward_launch(
    key: str,
    backend: str,
    x_seq: torch.Tensor,
    v_init: torch.Tensor | None,
    w_init: torch.Tensor | None,
    params: list[torch.Tensor] | tuple[torch.Tensor, ...],
    store_h: bool,
    v_mode: str,
) -> tuple[torch.Tensor, torch.Tensor, Any, Any, Any]:
    """The forward launch: (spike_seq, v_out, h_seq, w_out, wt_seq), with None for
    H and W̃ when not stored and for the state outputs of a neuron without states."""
    k = len(_NEURONS[key].states)
    t_len, n = x_seq.shape
    rows = t_len if v_mode == "seq" else 1
    spike = torch.empty_like(x_seq)
    v_out = x_seq.new_empty((rows, n))
    h_seq = x_seq.new_empty((t_len, n)) if store_h else None
    w_out = x_seq.new_empty((k, rows, n)) if k else None
    wt_seq = x_seq.new_empty((k, t_len, n)) if k and store_h else None
    if n == 0:
        return spike, v_out, h_seq, w_out, wt_seq
    ptr = runtime.ptr
    args = [ptr(x_seq), ptr(v_init)]
    if k:
        args.append(ptr(w_init))
    args += [ptr(p) for p in params]
    args += [ptr(spike), ptr(h_seq), ptr(v_out)]
    if k:
        args += [ptr(wt_seq), ptr(w_out)]
    args += [runtime.i64(p.stride(0) if p.dim() else 0) for p in params]
    args += [runtime.i32(t_len), runtime.i64(n)]
    lanes = _lanes(backend, [x_seq, spike, h_seq, v_out, w_out, wt_seq], n)
    _launch(key, backend, x_seq, ("forward", store_h, v_mode), lanes, args, n // lanes)
    return spike, v_out, h_seq, w_out, wt_seq


def forward_impl(
    key: str,
    backend: str,
    x_seq: torch.Tensor,
    v_init: torch.Tensor | None,
    w_init: torch.Tensor | None,
    params: list[torch.Tensor],
    store_h: bool,
    v_mode: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward over ``x_seq`` [T, N].

    Returns (spike_seq, v_seq or v_last, h_seq or empty, w_out [k, rows, N],
    wt_seq [k, T, N] or empty). ``v_init=None`` / ``w_init=None`` start from the
    spec's ``v_start`` / ``state_init`` without a tensor.
    """
    spike, v_out, h_seq, w_out, wt_seq = _forward_launch(
        key, backend, x_seq, v_init, w_init, params, store_h, v_mode
    )
    if w_out is None:
        w_out = x_seq.new_empty((0, v_out.shape[0], x_seq.shape[1]))
    return (
        spike,
        v_out,
        x_seq.new_empty((0,)) if h_seq is None else h_seq,
        w_out,
        x_seq.new_empty((0,)) if wt_seq is None else wt_seq,
    )


@torch.library.custom_op("symneuron::forward", mutates_args=())
def forward_op(
    key: str,
    backend: str,
    x_seq: torch.Tensor,
    v_init: torch.Tensor | None,
    w_init: torch.Tensor | None,
    params: list[torch.Tensor],
    store_h: bool,
    v_mode: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward as a custom op (see :func:`forward_impl`)."""
    return forward_impl(key, backend, x_seq, v_init, w_init, params, store_h, v_mode)


@forward_op.register_fake
def _(key, backend, x_seq, v_init, w_init, params, store_h, v_mode):
    t_len, n = x_seq.shape
    rows = t_len if v_mode == "seq" else 1
    h_shape = (t_len, n) if store_h else (0,)
    k = len(_NEURONS[key].states)
    w_out, wt_seq = _state_outputs(k, rows, n, t_len, store_h, x_seq)
    return (
        x_seq.new_empty((t_len, n)),
        x_seq.new_empty((rows, n)),
        x_seq.new_empty(h_shape),
        w_out,
        wt_seq,
    )


def _backward_launch(
    key: str,
    backend: str,
    grad_spike: torch.Tensor,
    grad_v: torch.Tensor | None,
    grad_w: torch.Tensor | None,
    grad_v_mode: str,
    h_seq: torch.Tensor,
    wt_seq: torch.Tensor | None,
    x_seq: torch.Tensor | None,
    v_init: torch.Tensor | None,
    w_init: torch.Tensor | None,
    params: list[torch.Tensor] | tuple[torch.Tensor, ...],
) -> tuple[torch.Tensor, Any, Any, Any]:
    """The backward launch: (grad_x, grad_v_init, grad_w_init, grad_params [P, N]), with
    None for the initial-state gradients of absent initial states and no learnable params."""
    neuron = _NEURONS[key]
    k = len(neuron.states)
    t_len, n = h_seq.shape
    grad_x = torch.empty_like(h_seq)
    grad_v_init = None if v_init is None else h_seq.new_empty((n,))
    grad_w_init = None if w_init is None else h_seq.new_empty((k, n))
    learnable = len(neuron.learnable)
    grad_params = (
        h_seq.new_empty((learnable, n), dtype=accum_dtype(h_seq.dtype)) if learnable else None
    )
    if n == 0:
        return grad_x, grad_v_init, grad_w_init, grad_params
    spike_scalar = grad_spike.numel() > 1 and not any(grad_spike.stride())
    ptr = runtime.ptr
    args = [ptr(grad_spike), ptr(grad_v)]
    if k:
        args.append(ptr(grad_w))
    args.append(ptr(h_seq))
    if k:
        args.append(ptr(wt_seq))
    args += [ptr(x_seq), ptr(v_init)]
    if k:
        args.append(ptr(w_init))
    args += [ptr(p) for p in params]
    args += [ptr(grad_x), ptr(grad_v_init)]
    if k:
        args.append(ptr(grad_w_init))
    if grad_params is not None:  # one row per learnable param, addressed without views
        base, row = grad_params.data_ptr(), n * grad_params.element_size()
        args += [runtime.address(base + j * row) for j in range(learnable)]
    args += [runtime.i64(p.stride(0) if p.dim() else 0) for p in params]
    args += [runtime.i32(int(spike_scalar)), runtime.i32(t_len), runtime.i64(n)]
    spike_tensor = None if spike_scalar else grad_spike
    lanes = _lanes(backend, [h_seq, grad_x, x_seq, grad_v, grad_w, wt_seq, spike_tensor], n)
    _launch(key, backend, h_seq, ("backward", grad_v_mode), lanes, args, n // lanes)
    return grad_x, grad_v_init, grad_w_init, grad_params


def backward_impl(
    key: str,
    backend: str,
    grad_spike: torch.Tensor,
    grad_v: torch.Tensor | None,
    grad_w: torch.Tensor | None,
    grad_v_mode: str,
    h_seq: torch.Tensor,
    wt_seq: torch.Tensor,
    x_seq: torch.Tensor | None,
    v_init: torch.Tensor | None,
    w_init: torch.Tensor | None,
    params: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward through time.

    Returns (grad_x [T, N], grad_v_init [N] or empty, grad_w_init [k, N] or empty,
    grad_params [P, N]). ``grad_v`` and ``grad_w`` are both given or both None
    (``grad_v_mode`` "none").
    """
    grad_x, grad_v_init, grad_w_init, grad_params = _backward_launch(
        key,
        backend,
        grad_spike,
        grad_v,
        grad_w,
        grad_v_mode,
        h_seq,
        wt_seq if wt_seq.dim() == 3 else None,
        x_seq,
        v_init,
        w_init,
        params,
    )
    if grad_params is None:
        grad_params = h_seq.new_empty((0, h_seq.shape[1]), dtype=accum_dtype(h_seq.dtype))
    return (
        grad_x,
        h_seq.new_empty((0,)) if grad_v_init is None else grad_v_init,
        h_seq.new_empty((0,)) if grad_w_init is None else grad_w_init,
        grad_params,
    )


@torch.library.custom_op("symneuron::backward", mutates_args=())
def backward_op(
    key: str,
    backend: str,
    grad_spike: torch.Tensor,
    grad_v: torch.Tensor | None,
    grad_w: torch.Tensor | None,
    grad_v_mode: str,
    h_seq: torch.Tensor,
    wt_seq: torch.Tensor,
    x_seq: torch.Tensor | None,
    v_init: torch.Tensor | None,
    w_init: torch.Tensor | None,
    params: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward as a custom op (see :func:`backward_impl`)."""
    return backward_impl(
        key,
        backend,
        grad_spike,
        grad_v,
        grad_w,
        grad_v_mode,
        h_seq,
        wt_seq,
        x_seq,
        v_init,
        w_init,
        params,
    )


@backward_op.register_fake
def _(
    key,
    backend,
    grad_spike,
    grad_v,
    grad_w,
    grad_v_mode,
    h_seq,
    wt_seq,
    x_seq,
    v_init,
    w_init,
    params,
):
    neuron = _NEURONS[key]
    n = h_seq.shape[1]
    grad_params = h_seq.new_empty((len(neuron.learnable), n), dtype=accum_dtype(h_seq.dtype))
    grad_v_init = h_seq.new_empty((0,) if v_init is None else (n,))
    grad_w_init = h_seq.new_empty((0,) if w_init is None else (len(neuron.states), n))
    return h_seq.new_empty(h_seq.shape), grad_v_init, grad_w_init, grad_params


#: neuron key -> ((kernel row, param index) for each learnable param)
_LEARNABLE: dict[str, tuple[tuple[int, int], ...]] = {}


def _save(
    ctx: Any,
    key: str,
    backend: str,
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
    ctx.key, ctx.backend, ctx.v_mode = key, backend, v_mode
    ctx.n_params = len(params)
    needs_x = _needs_x(key)
    ctx.save_for_backward(h_seq, wt_seq, v_init, w_init, x_seq if needs_x else None, *params)
    if outputs:
        ctx.mark_non_differentiable(h_seq, wt_seq)
    ctx.set_materialize_grads(False)


def _learnable(key: str) -> tuple[tuple[int, int], ...]:
    rows = _LEARNABLE.get(key)
    if rows is None:  # the kernels' gradient rows follow neuron.learnable, params neuron.params
        neuron = _NEURONS[key]
        params = list(neuron.params)
        rows = _LEARNABLE[key] = tuple(
            (j, params.index(name)) for j, name in enumerate(neuron.learnable)
        )
    return rows


def _gradients(
    ctx: Any, grad_spike: Any, grad_v: Any, grad_w: Any, backward: Any
) -> tuple[Any, Any, Any, list[Any]]:
    """(grad_x, grad_v_init, grad_w_init, grad per param) from the saved context."""
    h_seq, wt_seq, v_init, w_init, x_seq, *params = ctx.saved_tensors
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
        k = len(_NEURONS[ctx.key].states)
        rows = h_seq.shape[0] if mode == "seq" else 1
        grad_v = h_seq.new_zeros((rows, h_seq.shape[1])) if grad_v is None else grad_v
        grad_w = h_seq.new_zeros((k, rows, h_seq.shape[1])) if grad_w is None else grad_w
        grad_v, grad_w = grad_v.contiguous(), grad_w.contiguous()
    grad_x, grad_v_init, grad_w_init, grad_p = backward(
        ctx.key,
        ctx.backend,
        grad_spike,
        grad_v,
        grad_w,
        mode,
        h_seq,
        wt_seq,
        x_seq,
        v_init,
        w_init,
        params,
    )
    grads: list[torch.Tensor | None] = [None] * ctx.n_params
    for j, index in _learnable(ctx.key):
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
    _save(ctx, key, backend, v_mode, (x_seq, v_init, w_init), params, saved, outputs=True)


def _backward(
    ctx: Any, grad_spike: Any, grad_v: Any, _grad_h: Any, grad_w: Any, _grad_wt: Any
) -> tuple[Any, ...]:
    grad_x, grad_v_init, grad_w_init, grads = _gradients(
        ctx, grad_spike, grad_v, grad_w, backward_op
    )
    return None, None, grad_x, grad_v_init, grad_w_init, grads, None, None


forward_op.register_autograd(_backward, setup_context=_setup_context)


class _EagerBinding(torch.autograd.Function):
    """The same forward/backward launches without the dispatcher's Python layers.

    Outside ``torch.compile`` a custom op pays tens of microseconds per call in
    Python (schema handling, pytree flattening, alias checks); this generic
    binding, shared by every neuron, launches the kernels directly. Its outputs are
    only (spike_seq, v_out) and, for a neuron with extra states, w_out: H and W̃ are
    saved as intermediates, and no placeholder tensor is allocated. Under
    compilation the custom ops are used.
    """

    @staticmethod
    def forward(
        ctx: Any,
        key: str,
        backend: str,
        x_seq: torch.Tensor,
        v_init: torch.Tensor | None,
        w_init: torch.Tensor | None,
        v_mode: str,
        *params: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        spike, v_out, h_seq, w_out, wt_seq = _forward_launch(
            key, backend, x_seq, v_init, w_init, params, True, v_mode
        )
        inputs = (x_seq, v_init, w_init)
        _save(ctx, key, backend, v_mode, inputs, params, (h_seq, wt_seq), outputs=False)
        return (spike, v_out) if w_out is None else (spike, v_out, w_out)

    @staticmethod
    def backward(ctx: Any, grad_spike: Any, grad_v: Any, grad_w: Any = None) -> tuple[Any, ...]:
        grad_x, grad_v_init, grad_w_init, grads = _gradients(
            ctx, grad_spike, grad_v, grad_w, _backward_launch
        )
        return None, None, grad_x, grad_v_init, grad_w_init, None, *grads


def run(
    key: str,
    backend: str,
    x_seq: torch.Tensor,
    v_init: torch.Tensor | None,
    w_init: torch.Tensor | None,
    params: list[torch.Tensor],
    store_h: bool,
    v_mode: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Forward with autograd: (spike_seq, v_out, w_out or None for a neuron without
    extra states). The custom op when compiling, else the eager binding."""
    if torch.compiler.is_compiling():
        out = forward_op(key, backend, x_seq, v_init, w_init, params, store_h, v_mode)
        return out[0], out[1], out[3]
    if not store_h:
        spike, v_out, _, w_out, _ = _forward_launch(
            key, backend, x_seq, v_init, w_init, params, False, v_mode
        )
        return spike, v_out, w_out
    out = _EagerBinding.apply(key, backend, x_seq, v_init, w_init, v_mode, *params)
    return out[0], out[1], out[2] if len(out) > 2 else None
