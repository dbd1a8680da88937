"""The recurrent layer's autograd binding: its two kernels as one differentiable op.

The forward kernel runs the whole sequence with the recurrence inside
(:mod:`symneuron.runtime.recurrent`); the backward kernel runs it in reverse with the
transposed product inside, and gives dL/dX_eff for every step. The rest is torch,
after the kernel (DESIGN §3b): dL/dx = dL/dX_eff (the input enters X_eff with weight
1), dL/dR = Σ_t dL/dX_eff[t]ᵀ · s[t−1] as one matrix product over all steps, and
dL/ds[−1] = dL/dX_eff[0] · R. The neuron's parameter and initial-state gradients come
from the kernel as in the feedforward binding (:mod:`symneuron.binding`), whose saving
and gradient helpers this one shares.
"""

from __future__ import annotations

from typing import Any

import torch

from .binding import Run, _absent_as_none, _gradients, _op_args, _placeholders, _save, _schema
from .params import compute_dtype, grad_shape, kernel_param, launch_param
from .runtime import recurrent as kernels
from .runtime.kernels import Program, lookup, program
from .signature import RBACKWARD, RFORWARD

__all__ = ["RecurrentBinding", "run", "rforward_op", "rbackward_op"]


class RecurrentBinding(torch.autograd.Function):
    """The recurrent forward and backward kernels of a program (eager autograd)."""

    INPUTS = (
        "program", "x_seq", "weight", "s_init", "v_init", "w_init", "v_mode", "shape", "rng"
    )  # fmt: skip

    @staticmethod
    def forward(
        ctx: Any,
        prog: Program,
        x_seq: torch.Tensor,
        weight: torch.Tensor,
        s_init: torch.Tensor | None,
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
        weight = weight.contiguous()
        out = kernels.forward(
            prog, x_seq, weight.t().contiguous(), s_init, v_init, w_init, params, True, v_mode, rng
        )
        inputs = {"x_seq": out.xeff_seq, "v_init": v_init, "w_init": w_init, "params": params}
        inputs["rng"] = rng  # the generator's state: the backward draws the same
        _save(ctx, prog, v_mode, inputs, out, (weight, out.spike_seq, s_init))
        ctx.grad_shapes = [grad_shape(value, shape, n) for value in values]
        spike, v_seq = out.spike_seq, out.v_seq
        return (spike, v_seq) if out.w_out is None else (spike, v_seq, out.w_out)

    @staticmethod
    def backward(ctx: Any, grad_spike: Any, grad_v: Any, grad_w: Any = None) -> tuple[Any, ...]:
        saved = ctx.saved_tensors  # (read once: a checkpoint unpacks each tensor once)
        weight, spike_seq, s_init = saved[5 + ctx.n_params :]
        if grad_spike is None:
            grad_spike = torch.zeros_like(spike_seq)
        launch = kernels.backward(ctx.program, weight, ctx.rng)  # the forward's draws
        found = _gradients(ctx, grad_spike.contiguous(), grad_v, grad_w, False, launch, saved)
        grad_x = found["x_seq"]  # dL/dX_eff [T, N]
        needs = ctx.needs_input_grad
        grad_weight, grad_s = _recurrence(grad_x, weight, spike_seq, s_init, needs[2], needs[3])
        grads = [
            g.view(gshape) if g is not None and need else None
            for g, gshape, need in zip(
                found["params"], ctx.grad_shapes, needs[len(RecurrentBinding.INPUTS) :],
                strict=True,
            )
        ]  # fmt: skip
        given = {"x_seq": grad_x, "weight": grad_weight, "s_init": grad_s}
        given.update(v_init=found["v_init"], w_init=found["w_init"])
        return (*[given.get(name) for name in RecurrentBinding.INPUTS], *grads)


def _recurrence(
    grad_x: torch.Tensor, weight: torch.Tensor, spike_seq: torch.Tensor,
    s_init: torch.Tensor | None, need_weight: bool, need_s: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
    """dL/dR = Σ_t dL/dX_eff[t]ᵀ · s[t−1] (one GEMM over all steps and rows) and
    dL/ds[−1] = dL/dX_eff[0] · R, from dL/dX_eff [T, rows·F]."""
    features = weight.shape[0]
    if grad_x.shape[0] == 0:
        return None, None
    grad_weight = grad_s = None
    if need_weight:
        first = spike_seq.new_zeros(1, spike_seq.shape[1]) if s_init is None else s_init[None]
        before = torch.cat([first, spike_seq[:-1]]).reshape(-1, features)
        grad_weight = grad_x.reshape(-1, features).t() @ before
    if need_s:
        grad_s = (grad_x[0].reshape(-1, features) @ weight).reshape(-1)
    return grad_weight, grad_s


# -- the custom ops (what torch.compile traces through) ----------------------------


#: Each op's argument names in schema order (the autograd formula's positions).
R_ARGS = {
    p.name: ("key", "backend", *[name for name, _ in _op_args(p)]) for p in (RFORWARD, RBACKWARD)
}


@torch.library.custom_op("symneuron::rforward", mutates_args=(), schema=_schema(RFORWARD))
def rforward_op(key: str, backend: str, *args: Any) -> tuple[torch.Tensor, ...]:
    """The recurrent forward kernel as a custom op; outputs in :data:`RFORWARD`'s order."""
    given = dict(zip(R_ARGS["rforward"][2:], args, strict=False))  # (rng may be left out)
    return _placeholders(kernels.forward(lookup(key, backend), **given), given["x_seq"])


@rforward_op.register_fake
def _(key: str, backend: str, *args: Any) -> tuple[torch.Tensor, ...]:
    given = dict(zip(R_ARGS["rforward"][2:], args, strict=False))
    x_seq, prog = given["x_seq"], lookup(key, backend)
    layout = prog.forward_layout(x_seq, given["store_h"], given["v_mode"], True)
    return _placeholders(layout.outputs(x_seq), x_seq)


@torch.library.custom_op("symneuron::rbackward", mutates_args=(), schema=_schema(RBACKWARD))
def rbackward_op(key: str, backend: str, *args: Any) -> tuple[torch.Tensor, ...]:
    """The recurrent backward kernel as a custom op; outputs in :data:`RBACKWARD`'s order."""
    given = dict(zip(R_ARGS["rbackward"][2:], args, strict=False))
    launch = kernels.backward(lookup(key, backend), given.pop("weight"), given.pop("rng", None))
    return _placeholders(launch(**given), given["h_seq"])


@rbackward_op.register_fake
def _(key: str, backend: str, *args: Any) -> tuple[torch.Tensor, ...]:
    given = dict(zip(R_ARGS["rbackward"][2:], args, strict=False))
    h_seq = given["h_seq"]
    layout = lookup(key, backend).backward_layout(h_seq, given["v_init"], given["w_init"], True)
    return _placeholders(layout.outputs(h_seq), h_seq)


def _setup_context(
    ctx: Any, inputs: tuple[Any, ...], output: Any, keyword_only_inputs: Any = None
) -> None:
    given = dict(zip(R_ARGS["rforward"], inputs, strict=False))
    prog = lookup(given["key"], given["backend"])
    layout = prog.forward_layout(given["x_seq"], given["store_h"], given["v_mode"], True)
    out = _absent_as_none(RFORWARD, output, layout.present)
    raw = RFORWARD.returns(*output)
    ctx.mark_non_differentiable(raw.h_seq, raw.wt_seq, raw.xeff_seq)
    kept = {"x_seq": out.xeff_seq, "v_init": given["v_init"], "w_init": given["w_init"],
            "params": given["params"], "rng": given.get("rng")}  # fmt: skip
    _save(
        ctx, prog, given["v_mode"], kept, out, (given["weight_t"], raw.spike_seq, given["s_init"])
    )


def _backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
    grad = RFORWARD.returns(*grads)
    saved = ctx.saved_tensors  # (read once: a checkpoint unpacks each tensor once)
    weight_t, spike_seq, s_init = saved[5 + ctx.n_params :]
    weight = weight_t.t().contiguous()
    prog = ctx.program

    def launch(*args: Any) -> Any:
        present = prog.backward_layout(args[3], args[6], args[7]).present
        found = rbackward_op(prog.key, prog.backend, *args[:9], weight, args[9], ctx.rng)
        return _absent_as_none(RBACKWARD, found, present)

    grad_spike = torch.zeros_like(spike_seq) if grad.spike_seq is None else grad.spike_seq
    found = _gradients(ctx, grad_spike, grad.v_seq, grad.w_out, True, launch, saved)
    needs = ctx.needs_input_grad
    grad_weight, grad_s = _recurrence(found["x_seq"], weight, spike_seq, s_init, needs[3], needs[4])
    found.update(weight_t=None if grad_weight is None else grad_weight.t(), s_init=grad_s)
    given = len(ctx.needs_input_grad)  # the call's inputs: without rng when it left it out
    return tuple(found.get(name) for name in R_ARGS["rforward"][:given])


rforward_op.register_autograd(_backward, setup_context=_setup_context)


def run(
    job: Run, weight: torch.Tensor, s_init: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A prepared run with the recurrence ``X_eff[t] = x[t] + weight·s[t−1]`` per row of
    ``weight.shape[0]`` neurons (``s_init`` [N]: s[−1], None for no spike): (spike_seq
    [T, N], v_seq [T or 1, N], w_out [k, T or 1, N] or None)."""
    store = job.store_h or (torch.is_grad_enabled() and weight.requires_grad)
    if torch.compiler.is_compiling():  # the custom op, which compilation traces through
        dtype, device, n = (
            compute_dtype(job.backend, job.x_seq.dtype),
            job.x_seq.device,
            job.x_seq.shape[1],
        )
        params = [kernel_param(p, dtype, device, job.shape, n) for p in job.params]
        args = (job.x_seq, weight.t().contiguous(), s_init, job.v_init, job.w_init, params)
        got = RFORWARD.returns(
            *rforward_op(job.neuron.key(), job.backend, *args, store, job.v_mode, job.rng)
        )
        states = len(job.neuron.states) > 0
        return got.spike_seq, got.v_seq, got.w_out if states else None
    prog = program(job.neuron, job.backend)
    if store:
        out = RecurrentBinding.apply(prog, job.x_seq, weight, s_init, job.v_init, job.w_init,
                                     job.v_mode, job.shape, job.rng, *job.params)  # fmt: skip
        return out[0], out[1], out[2] if len(out) > 2 else None
    x_seq, n = job.x_seq, job.x_seq.shape[1]
    dtype, device = compute_dtype(job.backend, x_seq.dtype), x_seq.device
    params = [launch_param(p, dtype, device, job.shape, n) for p in job.params]
    weight_t = weight.detach().t().contiguous()
    got = kernels.forward(prog, x_seq, weight_t, s_init, job.v_init, job.w_init, params,
                          False, job.v_mode, job.rng)  # fmt: skip
    return got.spike_seq, got.v_seq, got.w_out
