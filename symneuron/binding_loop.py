"""The recurrent connection's binding in the loop over steps: R·s[t−D] a step, dL/dR once.

A plain loop sums dL/dR a step at a time: each step's product adds its own
dL/dX_eff[t]ᵀ · s[t−D], one matrix product of K = batch rows and one pass over R a step.
The connection's derived partials (:func:`symneuron.derivation.connection.dense`: the
input partial is 1, the weight's is the spike) let the sum wait: each step's product
(:class:`_StepProduct`) passes on dL/ds = dL/dX_eff · R and keeps dL/dX_eff; after the
last of them, one product over every step and row gives dL/dR (:class:`_WeightGradient`),
as the fused kernels' binding does (:mod:`symneuron.binding_recurrent`). A backward
taken with create_graph=True raises, as the fused kernels' does, instead of missing R's
second-order terms.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["LoopProducts"]


class LoopProducts:
    """The recurrent products of one call of the loop over steps: the spikes each step
    read and, in the backward, each step's dL/dX_eff; :meth:`of` gives the steps'
    product. It holds no tensor of the autograd graph (the spikes detached, the token
    with the steps' product), so the graph holds it without a reference cycle."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.feds: dict[int, torch.Tensor] = {}
        self.grads: dict[int, torch.Tensor] = {}
        self.weight = weight.detach()

    @staticmethod
    def of(weight: torch.Tensor) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """``product(t, fed)``: R·fed of step t (``fed`` the spikes it reads, [..., F]).
        Where R takes a gradient, each step's product is a :class:`_StepProduct`, all
        tied to one :class:`_WeightGradient` of R, which autograd runs after every step's
        backward; else a plain matrix product."""
        if not (torch.is_grad_enabled() and weight.requires_grad):
            return lambda t, fed: torch.nn.functional.linear(fed, weight)
        products = LoopProducts(weight)
        token = _WeightGradient.apply(weight, products)
        return lambda t, fed: _StepProduct.apply(fed, token, products, t)

    def weight_gradient(self, like: torch.Tensor) -> torch.Tensor:
        """Σ_t dL/dX_eff[t]ᵀ · s[t−D] over the steps that read spikes, one product."""
        steps = sorted(self.grads)
        if not steps:
            return torch.zeros_like(like)
        grads = torch.stack([self.grads[t] for t in steps])
        feds = torch.stack([self.feds[t] for t in steps]).to(grads.dtype)
        self.grads = {}  # (a backward with retain_graph fills them again)
        features = like.shape[1]
        product = grads.reshape(-1, grads.shape[-1]).t() @ feds.reshape(-1, features)
        return product.to(like.dtype)


class _WeightGradient(torch.autograd.Function):
    """R → a token every step's product takes: its backward, run after theirs, is dL/dR."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, products: LoopProducts) -> torch.Tensor:
        ctx.products = products
        ctx.like = weight.detach()
        return weight.new_empty(0)

    @staticmethod
    def backward(ctx: Any, _token: torch.Tensor) -> tuple[Any, ...]:
        _refuse_a_graph()
        return ctx.products.weight_gradient(ctx.like), None


class _StepProduct(torch.autograd.Function):
    """R·fed of step t; its backward: dL/dfed = dL/dX_eff · R, and dL/dX_eff kept."""

    @staticmethod
    def forward(
        ctx: Any, fed: torch.Tensor, token: torch.Tensor, products: LoopProducts, t: int
    ) -> torch.Tensor:
        products.feds[t] = fed.detach()
        ctx.products, ctx.t = products, t
        return torch.nn.functional.linear(fed, products.weight)  # (under autocast: cast)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        _refuse_a_graph()
        ctx.products.grads[ctx.t] = grad
        weight = ctx.products.weight
        grad_fed = grad @ weight.to(grad.dtype) if ctx.needs_input_grad[0] else None
        return grad_fed, None, None, None


def _refuse_a_graph() -> None:
    """A backward taken with create_graph=True raises: the deferred dL/dR is summed
    outside autograd, so its second-order terms would be missing."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            "symneuron: the recurrent layer's loop over steps sums dL/dR once over the "
            "sequence, outside autograd, so a gradient taken with create_graph=True "
            "(double backward: gradient penalties, meta-learning, Hessian-vector products) "
            "would miss its second-order terms. Run this part with backend='torch' (the "
            "reference, plain torch ops), which differentiates twice."
        )
