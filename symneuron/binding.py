"""The autograd binding: a neuron's kernels as differentiable torch operations.

:func:`run` takes a prepared run (:class:`Run`, made by :func:`symneuron.simulate`)
and dispatches it one of three ways:

* training, eager: :class:`EagerBinding`, one generic ``autograd.Function`` handed
  the program itself, which skips the custom-op dispatcher's per-call Python layers;
* under ``torch.compile``: ``symneuron::forward`` and ``symneuron::backward``,
  ``torch.library`` custom ops (fake implementations and an autograd formula, so
  compilation traces through them and ``torch.library.opcheck`` passes). Op
  arguments must be plain types, so they name the program by the neuron's key and
  the backend (:func:`symneuron.runtime.kernels.lookup` finds it);
* inference: the forward kernel alone, no autograd node.

The ops' schemas, fake outputs and autograd positions are computed from the named
arguments of :mod:`symneuron.signature`; both bindings save the same tensors and
compute gradients with the same helper. Parameter views live in
:mod:`symneuron.params`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch._C._functorch import unwrap_if_dead

from .definition import Definition
from .params import compute_dtype, grad_shape, kernel_param, launch_param
from .runtime.kernels import Program, lookup, program
from .signature import BACKWARD, FORWARD, Arg, Pass

__all__ = ["Run", "run", "register", "program", "forward_op", "backward_op", "EagerBinding"]


def register(neuron: Definition, backend: str) -> str:
    """Create ``neuron``'s program on ``backend`` now; returns the key the ops take.

    Not needed before calling the ops (they find a live neuron by its key); useful to
    compile nothing lazily inside a traced region."""
    return program(neuron, backend).key


class Run(NamedTuple):
    """A validated run of a neuron's kernels (made by :func:`symneuron.simulate`):
    ``x_seq`` [T, N] contiguous, ``shape`` the neuron shape N was flattened from (so a
    kernel that needs the [B, F] split keeps it), ``params`` each param's value in the
    neuron's order (a float or a tensor broadcastable to ``shape``)."""

    neuron: Definition
    backend: str
    x_seq: torch.Tensor
    shape: torch.Size
    v_init: torch.Tensor | None
    w_init: torch.Tensor | None
    params: tuple[float | torch.Tensor, ...]
    store_h: bool
    v_mode: str
    #: the generator's state (int64 [seed, offset]) of a neuron that draws, else None
    rng: torch.Tensor | None = None


def _schema_input(arg: Arg) -> str:
    """``Tensor x_seq``, ``Tensor? v_init``, ``Tensor[] params``, ``int seed=0``, ..."""
    if arg.each:
        return f"Tensor[] {arg.name}"
    if not arg.pointer:
        return f"int {arg.name}" + ("" if arg.default is None else f"={arg.default}")
    late = arg.default is not None or arg.noise  # keyword-only, or last with a default
    optional = arg.when is not None or late
    return f"Tensor{'?' if optional else ''} {arg.name}" + ("=None" if late else "")


def _op_args(pass_: Pass) -> list[tuple[str, str]]:
    """A pass's positional op arguments after key and backend, (name, schema text) in
    schema order: the inputs without a default, the variant options, then the generator's
    state (``rng``, None by default). Inputs with a default are keyword-only
    (:func:`_op_kwargs`): not differentiable, and callers may leave them out."""
    given = [(a.name, _schema_input(a)) for a in pass_.inputs if a.default is None]
    options = [(o.name, f"{o.schema} {o.name}") for o in pass_.options]
    late = [(a.name, _schema_input(a)) for a in pass_.inputs if a.noise]
    return [g for g in given if g not in late] + options + late


def _op_kwargs(pass_: Pass) -> list[str]:
    """The schema text of a pass's keyword-only op arguments (its inputs with a default)."""
    return [_schema_input(a) for a in pass_.inputs if a.default is not None]


def _schema(pass_: Pass) -> str:
    """A pass's op schema: its inputs and options by name, one Tensor per output."""
    kwargs = _op_kwargs(pass_)
    args = ", ".join([text for _, text in _op_args(pass_)] + (["*", *kwargs] if kwargs else []))
    outputs = ", ".join("Tensor" for _ in pass_.outputs)
    return f"(str key, str backend, {args}) -> ({outputs})"


def _placeholders(out: tuple[Any, ...], like: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """An op's outputs: each absent one as an empty tensor (an op returns no None)."""
    return tuple(like.new_empty((0,)) if t is None else t for t in out)


def absent_as_none(pass_: Pass, out: tuple[Any, ...], present: dict[str, bool]) -> Any:
    """An op's outputs as the pass's named tuple, None where an output does not exist."""
    return pass_.returns(
        *[t if a.exists(present) else None for a, t in zip(pass_.outputs, out, strict=True)]
    )


def op_names(pass_: Pass) -> tuple[str, ...]:
    """A pass's op's argument names in schema order (the autograd formula's names)."""
    return ("key", "backend", *[name for name, _ in _op_args(pass_)])


def define_op(
    pass_: Pass,
    like: str,
    launch: Callable[[Program, dict[str, Any]], Any],
    layout: Callable[[Program, dict[str, Any]], Any],
) -> Any:
    """``pass_``'s kernels as the custom op ``symneuron::<pass name>``: ``launch`` runs
    them on a program with the op's arguments by name, ``layout`` gives their outputs'
    :class:`~symneuron.runtime.kernels.Layout` (the fake implementation), ``like`` names
    the input the outputs are allocated like. Its schema, outputs and argument names
    all come from the pass's named arguments."""
    names = op_names(pass_)[2:]

    def given(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        return {**dict(zip(names, args, strict=False)), **kwargs}  # (rng may be left out)

    def run(key: str, backend: str, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        values = given(args, kwargs)
        return _placeholders(launch(lookup(key, backend), values), values[like])

    op = torch.library.custom_op(
        f"symneuron::{pass_.name}", run, mutates_args=(), schema=_schema(pass_)
    )

    @op.register_fake
    def _(key: str, backend: str, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        values = given(args, kwargs)
        return _placeholders(
            layout(lookup(key, backend), values).outputs(values[like]), values[like]
        )

    return op


#: Each op's argument names in schema order (the autograd formula's positions).
OP_ARGS = {p.name: op_names(p) for p in (FORWARD, BACKWARD)}

#: :meth:`Program.forward` as a custom op; its outputs in :data:`FORWARD`'s order.
forward_op = define_op(
    FORWARD,
    "x_seq",
    lambda prog, values: prog.forward(**values),
    lambda prog, values: prog.forward_layout(values["x_seq"], values["store_h"], values["v_mode"]),
)
#: :meth:`Program.backward` as a custom op; its outputs in :data:`BACKWARD`'s order.
backward_op = define_op(
    BACKWARD,
    "h_seq",
    lambda prog, values: prog.backward(**values),
    lambda prog, values: prog.backward_layout(values["h_seq"], values["v_init"], values["w_init"]),
)


def save(
    ctx: Any,
    prog: Program,
    v_mode: str,
    inputs: dict[str, Any],
    out: Any,
    extra: dict[str, Any] | None = None,
) -> None:
    """Keep for backward, by name: H and W̃ (extra states only), v_init, w_init, X only
    when a partial needs it, each param (``inputs`` by name, ``out`` the forward's), then
    ``extra`` (what a connection's binding adds)."""
    ctx.program, ctx.v_mode, ctx.n_params = prog, v_mode, len(inputs["params"])
    ctx.rng = inputs.get("rng")  # the generator's state: the backward draws the same
    kept = (out.h_seq, out.wt_seq, inputs["v_init"], inputs["w_init"])
    x_kept = inputs["x_seq"] if prog.needs_x else None
    more = () if extra is None else tuple(extra)
    ctx.saved_names = _saved_names(ctx.n_params, more)
    ctx.save_for_backward(*kept, x_kept, *inputs["params"], *(extra or {}).values())
    ctx.set_materialize_grads(False)


#: what :func:`save` keeps before the params and a connection's own tensors, in order
_SAVED = ("h_seq", "wt_seq", "v_init", "w_init", "x_seq")


@functools.cache
def _param_names(count: int) -> tuple[str, ...]:
    """The saved names of ``count`` params."""
    return tuple(f"param {i}" for i in range(count))


@functools.cache
def _saved_names(count: int, extra: tuple[str, ...]) -> tuple[str, ...]:
    """The names of what :func:`save` keeps, in order: :data:`_SAVED`, ``count``
    params, then ``extra``."""
    return (*_SAVED, *_param_names(count), *extra)


def saved(ctx: Any) -> dict[str, Any]:
    """What :func:`save` kept, by name (``ctx.saved_tensors`` read once: a checkpoint
    unpacks each saved tensor once)."""
    return dict(zip(ctx.saved_names, ctx.saved_tensors, strict=True))


def gradients(
    ctx: Any,
    grad_spike: Any,
    grad_v: Any,
    grad_w: Any,
    compiled: bool,
    launch: Callable[..., Any] | None = None,
    kept: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """dL/dX, dL/dV[0], dL/dW[0] and each param's gradient (None unless learnable), by
    the forward's input names, from the saved context. ``launch`` runs the backward
    kernel on the backward pass's inputs by name (default: the program's
    :meth:`~Program.backward`, or its op when ``compiled``); ``kept``: the context's
    saved tensors where the caller has read them (:func:`saved`)."""
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        raise RuntimeError(
            "symneuron: the fused kernels' backward is not differentiable, so a gradient "
            "taken with create_graph=True (double backward: gradient penalties, "
            "meta-learning, Hessian-vector products) would miss its second-order terms. "
            "Run this part with backend='torch' (the reference, plain torch ops), which "
            "differentiates twice."
        )
    kept = saved(ctx) if kept is None else kept
    h_seq = kept["h_seq"]
    params = [kept[name] for name in _param_names(ctx.n_params)]
    prog: Program = ctx.program
    if h_seq is None:
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
        rows, n = (h_seq.shape[0] if mode == "seq" else 1), h_seq.shape[1]
        grad_v = (h_seq.new_zeros(rows, n) if grad_v is None else grad_v).contiguous()
        if prog.k:  # (without extra states the kernels take no dL/dW: none is made)
            grad_w = (h_seq.new_zeros(prog.k, rows, n) if grad_w is None else grad_w).contiguous()
    rng = getattr(ctx, "rng", None)
    wt_seq, x_seq, v_init, w_init = kept["wt_seq"], kept["x_seq"], kept["v_init"], kept["w_init"]
    # the backward pass's inputs in its argument order (Program.backward's, the op's)
    args = (grad_spike, grad_v, grad_w, h_seq, wt_seq, x_seq, v_init, w_init, params, mode)
    if launch is not None:  # a connection's kernels (given the forward's rng by their caller)
        out = launch(*args)
    elif compiled:
        present = prog.backward_layout(h_seq, v_init, w_init).present
        out = absent_as_none(BACKWARD, backward_op(prog.key, prog.backend, *args, rng), present)
    else:
        out = prog.backward(*args, rng=rng)
    grads: list[torch.Tensor | None] = [None] * ctx.n_params
    for j, index in prog.learnable_rows:
        grads[index] = out.grad_params[j].to(params[index].dtype)
    return {
        "x_seq": out.grad_x_seq,
        "v_init": out.grad_v_init,
        "w_init": out.grad_w_init,
        "params": grads,
    }


def _setup_context(
    ctx: Any, inputs: tuple[Any, ...], output: Any, keyword_only_inputs: Any = None
) -> None:
    given = dict(zip(OP_ARGS["forward"], inputs, strict=False))
    prog = lookup(given["key"], given["backend"])
    present = prog.forward_layout(given["x_seq"], given["store_h"], given["v_mode"]).present
    out = absent_as_none(FORWARD, output, present)
    raw = FORWARD.returns(*output)
    ctx.mark_non_differentiable(raw.h_seq, raw.wt_seq)
    save(ctx, prog, given["v_mode"], given, out)


def _backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
    grad = FORWARD.returns(*grads)
    found = gradients(ctx, grad.spike_seq, grad.v_seq, grad.w_out, True)
    given = len(ctx.needs_input_grad)  # the call's inputs: without rng when it left it out
    return tuple(found.get(name) for name in OP_ARGS["forward"][:given])


forward_op.register_autograd(_backward, setup_context=_setup_context)


class EagerBinding(torch.autograd.Function):
    """The same forward/backward launches without the dispatcher's Python layers.

    Outside ``torch.compile`` a custom op pays tens of microseconds per call in
    Python (schema handling, pytree flattening, alias checks); this generic
    binding, shared by every neuron, is handed the program and launches its
    kernels directly. Its outputs are only (spike_seq, v_seq) and, for a neuron with
    extra states, w_out: H and W̃ are saved as intermediates, and no placeholder
    tensor is allocated.

    It takes the params as given (floats or tensors broadcastable to ``shape``) and
    makes their [N] kernel views itself, so that no autograd node is recorded per
    param: each gradient is returned as [N] values shaped for autograd's own reduction
    to the param's shape and dtype (the sum and cast the views' nodes would do).
    """

    #: the names of ``apply``'s arguments before the params (autograd positions)
    INPUTS = ("program", "x_seq", "v_init", "w_init", "v_mode", "shape", "rng")

    @staticmethod
    def forward(
        ctx: Any,
        prog: Program,
        x_seq: torch.Tensor,
        v_init: torch.Tensor | None,
        w_init: torch.Tensor | None,
        v_mode: str,
        shape: tuple[int, ...],
        rng: torch.Tensor | None,
        *values: float | torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        n = x_seq.shape[1]
        dtype, device = compute_dtype(prog.backend, x_seq.dtype), x_seq.device
        params = [launch_param(value, dtype, device, shape, n) for value in values]
        out = prog.forward(x_seq, v_init, w_init, params, True, v_mode, rng=rng)
        inputs = {"x_seq": x_seq, "v_init": v_init, "w_init": w_init, "params": params, "rng": rng}
        save(ctx, prog, v_mode, inputs, out)
        ctx.grad_shapes = [grad_shape(value, shape, n) for value in values]
        spike, v_seq = out.spike_seq, out.v_seq
        return (spike, v_seq) if out.w_out is None else (spike, v_seq, out.w_out)

    @staticmethod
    def backward(ctx: Any, grad_spike: Any, grad_v: Any, grad_w: Any = None) -> tuple[Any, ...]:
        found = gradients(ctx, grad_spike, grad_v, grad_w, False)
        grads = found["params"]
        for i, gshape in enumerate(ctx.grad_shapes):
            if grads[i] is not None:  # a learnable param's (ctx.needs_input_grad: host time)
                needed = ctx.needs_input_grad[len(EagerBinding.INPUTS) + i]
                grads[i] = grads[i].view(gshape) if needed else None
        return (*map(found.get, EagerBinding.INPUTS), *grads)


#: ``EagerBinding.apply`` without ``Function.apply``'s Python layer (2.4 µs a call), which
#: binds ``setup_context``'s defaults (EagerBinding has no setup_context), routes functorch
#: transforms (:func:`symneuron.simulate.prepare` refuses them) and unwraps each argument
#: that is a dead functorch wrapper (:func:`_live`, on the values that can be tensors)
_APPLY = super(torch.autograd.Function, EagerBinding).apply


def _live(values: tuple[Any, ...]) -> list[Any]:
    """``values`` with each tensor left by an exited functorch transform (a dead wrapper,
    which has no storage) unwrapped, as torch's own ops and ``Function.apply`` do."""
    return [unwrap_if_dead(v) if isinstance(v, torch.Tensor) else v for v in values]


def run(job: Run) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Run a prepared job on its backend's kernels: (spike_seq [T, N], v_seq [T or 1, N],
    w_out [k, T or 1, N] or None), through the binding the call needs."""
    x_seq, shape = job.x_seq, job.shape
    compiling = torch.compiler.is_compiling()
    if job.store_h and not compiling:
        prog = program(job.neuron, job.backend)
        live = _live((x_seq, job.v_init, job.w_init, job.rng, *job.params))
        out = _APPLY(prog, *live[:3], job.v_mode, shape, *live[3:])
        spike, v_seq, *w_out = out  # (w_out only for a neuron with extra states)
        return spike, v_seq, w_out[0] if w_out else None
    n, dtype, device = x_seq.shape[1], compute_dtype(job.backend, x_seq.dtype), x_seq.device
    if compiling:  # the custom op, which compilation traces through
        params = [kernel_param(p, dtype, device, shape, n) for p in job.params]
        key = job.neuron.key()  # a plain string: the op finds the live neuron by it
        args = (x_seq, job.v_init, job.w_init, params, job.store_h, job.v_mode)
        got = FORWARD.returns(*forward_op(key, job.backend, *args, job.rng))
        states = len(job.neuron.states) > 0  # (len: Dynamo misreads a mappingproxy's truth)
        return got.spike_seq, got.v_seq, got.w_out if states else None
    params = [launch_param(p, dtype, device, shape, n) for p in job.params]
    got = program(job.neuron, job.backend).forward(
        x_seq, job.v_init, job.w_init, params, False, job.v_mode, rng=job.rng
    )
    return got.spike_seq, got.v_seq, got.w_out
