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

from .binding import Run, _gradients, _save
from .params import compute_dtype, grad_shape, launch_param
from .runtime import recurrent as kernels
from .runtime.kernels import Program, program

__all__ = ["RecurrentBinding", "run"]


class RecurrentBinding(torch.autograd.Function):
    """The recurrent forward and backward kernels of a program (eager autograd)."""

    INPUTS = ("program", "x_seq", "weight", "s_init", "v_init", "w_init", "v_mode", "shape")

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
        *values: float | torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        n = x_seq.shape[1]
        dtype, device = compute_dtype(prog.backend, x_seq.dtype), x_seq.device
        params = [launch_param(value, dtype, device, shape, n) for value in values]
        weight = weight.contiguous()
        out = kernels.forward(
            prog, x_seq, weight.t().contiguous(), s_init, v_init, w_init, params, True, v_mode
        )
        inputs = {"x_seq": out.xeff_seq, "v_init": v_init, "w_init": w_init, "params": params}
        _save(ctx, prog, v_mode, inputs, out, (weight, out.spike_seq, s_init))
        ctx.grad_shapes = [grad_shape(value, shape, n) for value in values]
        spike, v_seq = out.spike_seq, out.v_seq
        return (spike, v_seq) if out.w_out is None else (spike, v_seq, out.w_out)

    @staticmethod
    def backward(ctx: Any, grad_spike: Any, grad_v: Any, grad_w: Any = None) -> tuple[Any, ...]:
        weight, spike_seq, s_init = ctx.saved_tensors[5 + ctx.n_params :]
        if grad_spike is None:
            grad_spike = torch.zeros_like(spike_seq)
        launch = kernels.backward(ctx.program, weight)
        found = _gradients(ctx, grad_spike.contiguous(), grad_v, grad_w, False, launch)
        grad_x = found["x_seq"]  # dL/dX_eff [T, N]
        features = weight.shape[0]
        needs = ctx.needs_input_grad
        grad_weight = grad_s = None
        if needs[2] and grad_x.shape[0] > 0:
            g = grad_x.reshape(-1, features)  # [T·rows, F]
            first = spike_seq.new_zeros(1, spike_seq.shape[1]) if s_init is None else s_init[None]
            before = torch.cat([first, spike_seq[:-1]]).reshape(-1, features)
            grad_weight = g.t() @ before  # Σ_t dL/dX_eff[t]ᵀ s[t−1]: one GEMM
        if needs[3] and grad_x.shape[0] > 0:
            grad_s = (grad_x[0].reshape(-1, features) @ weight).reshape(-1)
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


def run(
    job: Run, weight: torch.Tensor, s_init: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A prepared run with the recurrence ``X_eff[t] = x[t] + weight·s[t−1]`` per row of
    ``weight.shape[0]`` neurons (``s_init`` [N]: s[−1], None for no spike): (spike_seq
    [T, N], v_seq [T or 1, N], w_out [k, T or 1, N] or None)."""
    if job.rng is not None:
        raise NotImplementedError(
            f"symneuron: the fused recurrent kernels do not draw random numbers, and "
            f"{job.neuron.name} does; run this RecurrentNeuronLayer with backend='torch'."
        )
    prog = program(job.neuron, job.backend)
    if job.store_h or (torch.is_grad_enabled() and weight.requires_grad):
        out = RecurrentBinding.apply(prog, job.x_seq, weight, s_init, job.v_init, job.w_init,
                                     job.v_mode, job.shape, *job.params)  # fmt: skip
        return out[0], out[1], out[2] if len(out) > 2 else None
    x_seq, n = job.x_seq, job.x_seq.shape[1]
    dtype, device = compute_dtype(job.backend, x_seq.dtype), x_seq.device
    params = [launch_param(p, dtype, device, job.shape, n) for p in job.params]
    weight_t = weight.detach().t().contiguous()
    got = kernels.forward(prog, x_seq, weight_t, s_init, job.v_init, job.w_init, params,
                          False, job.v_mode)  # fmt: skip
    return got.spike_seq, got.v_seq, got.w_out
