"""A recurrent connection's autograd binding: its two kernels as one differentiable op.

The forward kernel runs the whole sequence with the connection inside
(:mod:`symneuron.runtime.rows`); the backward kernel runs it in reverse with the
connection's derived transpose inside, and gives dL/dX_eff for every step. The rest
comes from the connection's other partials (:func:`symneuron.derivation.connection.dense`;
a test checks that they are what this binding computes) after the kernel (docs/architecture.md):
dL/dx = dL/dX_eff · ∂X_eff/∂x, dL/dR = Σ_t dL/dX_eff[t]ᵀ · s[t−D] as one matrix product
over all steps (∂term/∂w is the spike), and dL/ds of the D steps before the first,
dL/dX_eff[0..D−1] · R. The neuron's parameter and
initial-state gradients come from the kernel as in the feedforward binding
(:mod:`symneuron.binding`), whose op factory, saving and gradient helpers this one uses.
"""

from __future__ import annotations

from typing import Any

import torch

from .binding import Run, absent_as_none, define_op, gradients, op_names, save, saved
from .params import compute_dtype, grad_shape, kernel_param, launch_param
from .runtime import rows
from .runtime.kernels import Program, lookup, program
from .signature import BACKWARD, RBACKWARD, RFORWARD

__all__ = ["RecurrentBinding", "run", "rforward_op", "rbackward_op"]


class RecurrentBinding(torch.autograd.Function):
    """The recurrent forward and backward kernels of a program (eager autograd)."""

    INPUTS = (
        "program",
        "x_seq",
        "weight",
        "s_init",
        "v_init",
        "w_init",
        "v_mode",
        "shape",
        "delay",
        "rng",
    )

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
        delay: int,
        rng: torch.Tensor | None,
        *values: float | torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        n = x_seq.shape[1]
        dtype, device = compute_dtype(prog.backend, x_seq.dtype), x_seq.device
        params = [launch_param(value, dtype, device, shape, n) for value in values]
        weight = weight.contiguous()
        out = rows.forward(
            prog,
            x_seq,
            weight.t().contiguous(),
            s_init,
            v_init,
            w_init,
            params,
            True,
            v_mode,
            delay,
            rng,
        )
        inputs = {"x_seq": out.xeff_seq, "v_init": v_init, "w_init": w_init, "params": params}
        inputs["rng"] = rng  # the generator's state: the backward draws the same
        extra = {"weight": weight, "spike_seq": out.spike_seq, "s_init": s_init}
        save(ctx, prog, v_mode, inputs, out, extra)
        ctx.delay = delay
        ctx.grad_shapes = [grad_shape(value, shape, n) for value in values]
        spike, v_seq = out.spike_seq, out.v_seq
        return (spike, v_seq) if out.w_out is None else (spike, v_seq, out.w_out)

    @staticmethod
    def backward(ctx: Any, grad_spike: Any, grad_v: Any, grad_w: Any = None) -> tuple[Any, ...]:
        kept = saved(ctx)
        weight, spike_seq = kept["weight"], kept["spike_seq"]
        if grad_spike is None:
            grad_spike = torch.zeros_like(spike_seq)
        launch = rows.backward(ctx.program, weight, ctx.delay, ctx.rng)  # the forward's draws
        found = gradients(ctx, grad_spike.contiguous(), grad_v, grad_w, False, launch, kept)
        needs = dict(zip(RecurrentBinding.INPUTS, ctx.needs_input_grad, strict=False))
        grad_weight, grad_s = _connection_grads(
            found["x_seq"],
            weight,
            spike_seq,
            kept["s_init"],
            ctx.delay,
            needs["weight"],
            needs["s_init"],
        )
        needed = ctx.needs_input_grad[len(RecurrentBinding.INPUTS) :]
        grads = [
            g.view(gshape) if g is not None and need else None
            for g, gshape, need in zip(found["params"], ctx.grad_shapes, needed, strict=True)
        ]
        given = {"x_seq": found["x_seq"], "weight": grad_weight, "s_init": grad_s}
        given.update(v_init=found["v_init"], w_init=found["w_init"])
        return (*[given.get(name) for name in RecurrentBinding.INPUTS], *grads)


def _connection_grads(
    grad_x: torch.Tensor,
    weight: torch.Tensor,
    spike_seq: torch.Tensor,
    s_init: torch.Tensor | None,
    delay: int,
    need_weight: bool,
    need_s: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """dL/dR = Σ_t dL/dX_eff[t]ᵀ · s[t−D] (one GEMM over all steps and rows) and dL/ds
    of the D steps before the first, dL/dX_eff[t] · R for t < D ([D, N]), from dL/dX_eff
    [T, rows·F]."""
    features, t_len = weight.shape[0], grad_x.shape[0]
    if t_len == 0:
        return None, None
    grad_weight = grad_s = None
    if need_weight and (s_init is not None or t_len > delay):  # (else no step read R)
        first = spike_seq.new_zeros(delay, spike_seq.shape[1]) if s_init is None else s_init
        before = torch.cat([first, spike_seq])[:t_len]  # s[t − D] for t = 0..T−1
        grad_weight = grad_x.reshape(-1, features).t() @ before.reshape(-1, features)
    if need_s:
        reach = grad_x[:delay].reshape(-1, features) @ weight  # the steps that read s_init
        grad_s = reach.new_zeros(delay * grad_x.shape[1]).view(delay, -1)
        grad_s[: min(delay, t_len)] = reach.view(min(delay, t_len), -1)
    return grad_weight, grad_s


# -- the custom ops (what torch.compile traces through) ----------------------------


#: Each op's argument names in schema order (the autograd formula's positions).
R_ARGS = {p.name: op_names(p) for p in (RFORWARD, RBACKWARD)}

#: The recurrent forward kernel as a custom op; outputs in :data:`RFORWARD`'s order.
rforward_op = define_op(
    RFORWARD,
    "x_seq",
    lambda prog, values: rows.forward(prog, **values),
    lambda prog, values: prog.forward_layout(
        values["x_seq"], values["store_h"], values["v_mode"], RFORWARD
    ),
)


def _rbackward(prog: Program, values: dict[str, Any]) -> Any:
    launch = rows.backward(prog, values.pop("weight"), values.pop("D"), values.pop("rng", None))
    return launch(**values)


#: The recurrent backward kernel as a custom op; outputs in :data:`RBACKWARD`'s order.
rbackward_op = define_op(
    RBACKWARD,
    "h_seq",
    _rbackward,
    lambda prog, values: prog.backward_layout(
        values["h_seq"], values["v_init"], values["w_init"], RBACKWARD
    ),
)


def _setup_context(
    ctx: Any, inputs: tuple[Any, ...], output: Any, keyword_only_inputs: Any = None
) -> None:
    given = dict(zip(R_ARGS["rforward"], inputs, strict=False))
    prog = lookup(given["key"], given["backend"])
    layout = prog.forward_layout(given["x_seq"], given["store_h"], given["v_mode"], RFORWARD)
    out = absent_as_none(RFORWARD, output, layout.present)
    raw = RFORWARD.returns(*output)
    ctx.mark_non_differentiable(raw.h_seq, raw.wt_seq, raw.xeff_seq)
    kept = {
        "x_seq": out.xeff_seq,
        "v_init": given["v_init"],
        "w_init": given["w_init"],
        "params": given["params"],
        "rng": given.get("rng"),
    }
    extra = {"weight_t": given["weight_t"], "spike_seq": raw.spike_seq, "s_init": given["s_init"]}
    save(ctx, prog, given["v_mode"], kept, out, extra)
    ctx.delay = given["D"]


def _backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
    grad = RFORWARD.returns(*grads)
    kept = saved(ctx)
    spike_seq = kept["spike_seq"]
    weight = kept["weight_t"].t().contiguous()
    prog = ctx.program

    def launch(*given: Any) -> Any:
        values = dict(zip(op_names(BACKWARD)[2:], given, strict=False))  # (by name; no rng)
        present = prog.backward_layout(values["h_seq"], values["v_init"], values["w_init"]).present
        values.update(weight=weight, D=ctx.delay, rng=ctx.rng)
        args = [values[name] for name in R_ARGS["rbackward"][2:]]
        return absent_as_none(RBACKWARD, rbackward_op(prog.key, prog.backend, *args), present)

    grad_spike = torch.zeros_like(spike_seq) if grad.spike_seq is None else grad.spike_seq
    found = gradients(ctx, grad_spike, grad.v_seq, grad.w_out, True, launch, kept)
    needs = dict(zip(R_ARGS["rforward"], ctx.needs_input_grad, strict=False))
    grad_weight, grad_s = _connection_grads(
        found["x_seq"],
        weight,
        spike_seq,
        kept["s_init"],
        ctx.delay,
        needs["weight_t"],
        needs["s_init"],
    )
    found.update(weight_t=None if grad_weight is None else grad_weight.t(), s_init=grad_s)
    given = len(ctx.needs_input_grad)  # the call's inputs: without rng when it left it out
    return tuple(found.get(name) for name in R_ARGS["rforward"][:given])


rforward_op.register_autograd(_backward, setup_context=_setup_context)


def run(
    job: Run, weight: torch.Tensor, s_init: torch.Tensor | None, delay: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A prepared run with the recurrence ``X_eff[t] = x[t] + weight·s[t−delay]`` per row
    of ``weight.shape[0]`` neurons (``s_init`` [delay, N]: the spikes of the steps before
    the first, oldest first; None for no spike): (spike_seq [T, N], v_seq [T or 1, N],
    w_out [k, T or 1, N] or None)."""
    store = job.store_h or (torch.is_grad_enabled() and weight.requires_grad)
    x_seq, n = job.x_seq, job.x_seq.shape[1]
    dtype, device = compute_dtype(job.backend, x_seq.dtype), x_seq.device
    if torch.compiler.is_compiling():  # the custom op, which compilation traces through
        params = [kernel_param(p, dtype, device, job.shape, n) for p in job.params]
        values = {
            "x_seq": x_seq,
            "weight_t": weight.t().contiguous(),
            "s_init": s_init,
            "v_init": job.v_init,
            "w_init": job.w_init,
            "params": params,
            "store_h": store,
            "v_mode": job.v_mode,
            "D": delay,
            "rng": job.rng,
        }
        args = [values[name] for name in R_ARGS["rforward"][2:]]
        got = RFORWARD.returns(*rforward_op(job.neuron.key(), job.backend, *args))
        states = len(job.neuron.states) > 0
        return got.spike_seq, got.v_seq, got.w_out if states else None
    prog = program(job.neuron, job.backend)
    if store:
        out = RecurrentBinding.apply(
            prog,
            x_seq,
            weight,
            s_init,
            job.v_init,
            job.w_init,
            job.v_mode,
            job.shape,
            delay,
            job.rng,
            *job.params,
        )
        spike, v_seq, *w_out = out  # (w_out only for a neuron with extra states)
        return spike, v_seq, w_out[0] if w_out else None
    params = [launch_param(p, dtype, device, job.shape, n) for p in job.params]
    weight_t = weight.detach().t().contiguous()
    got = rows.forward(
        prog,
        x_seq,
        weight_t,
        s_init,
        job.v_init,
        job.w_init,
        params,
        False,
        job.v_mode,
        delay,
        job.rng,
    )
    return got.spike_seq, got.v_seq, got.w_out
