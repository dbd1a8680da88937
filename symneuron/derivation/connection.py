"""A connection's derivation: what one synapse adds to its target, and its transpose.

A connection (docs/architecture.md) feeds spikes of one step into the input of a later one::

    X_eff[t]_c = x[t]_c + Σ_m term(w_cm, s[t−d]_m) + b_c,    term(w, s) = w · s

Its backward needs, per synapse, the partial of the term by the presynaptic spike
(what dL/dX_eff[t]_c sends back to s[t−d]_m: the transposed product) and by the
weight (what makes dL/dR, summed over steps and rows: one matrix product after the
time loop), and the partials of X_eff by x and b. All are derived here with SymPy
from the term, as the neuron's partials are; the code generators print them
(:mod:`symneuron.codegen.connection`) and the binding reads the weight's partial.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sympy as sp

__all__ = ["ConnectionSpec", "derive_connection", "dense", "W", "S_PRE", "G_POST"]

#: One synapse's weight, its presynaptic spike and its target's dL/dX_eff.
W, S_PRE, G_POST = sp.symbols("w_m s_m g_m", real=True)
X_IN, BIAS = sp.symbols("x b", real=True)


@dataclass(frozen=True)
class ConnectionSpec:
    """The derived expressions of one connection's synapse.

    Attributes
    ----------
    term : what one synapse adds to its target's X_eff, in ``w_m`` and ``s_m``.
    spike_term : the term of a presynaptic neuron that spiked (``s_m = 1``): what the
        forward's gather over the spiking neurons adds.
    transpose : the synapse's share of dL/ds[t−d]_m: ``g_m · ∂term/∂s_m``.
    weight_partial : ∂term/∂w_m (dL/dw_cm = Σ_t g_c · weight_partial).
    input_partial, bias_partial : ∂X_eff/∂x and ∂X_eff/∂b.
    """

    term: sp.Expr
    spike_term: sp.Expr
    transpose: sp.Expr
    weight_partial: sp.Expr
    input_partial: sp.Expr
    bias_partial: sp.Expr

    @property
    def weight_gradient_is_product(self) -> bool:
        """Whether dL/dR is g ⊗ s (the partial by the weight is the spike itself), so
        that one matrix product over all steps and rows computes it."""
        return sp.simplify(self.weight_partial - S_PRE) == 0

    @property
    def transpose_is_product(self) -> bool:
        """Whether a synapse's share of dL/ds is g · w, so that a step's transposed
        product is a matrix product (tensor cores can run it)."""
        return sp.simplify(self.transpose - G_POST * W) == 0


def derive_connection(term: sp.Expr = W * S_PRE) -> ConnectionSpec:
    """The connection whose synapse adds ``term`` (in :data:`W` and :data:`S_PRE`) to
    its target's input, with every partial its backward needs."""
    x_eff = X_IN + term + BIAS
    return ConnectionSpec(
        term=term,
        spike_term=term.subs(S_PRE, 1),
        transpose=G_POST * sp.diff(x_eff, S_PRE),
        weight_partial=sp.diff(x_eff, W),
        input_partial=sp.diff(x_eff, X_IN),
        bias_partial=sp.diff(x_eff, BIAS),
    )


@functools.cache
def dense() -> ConnectionSpec:
    """A dense weighted connection: each synapse adds weight · spike. Derived on first
    use, so that importing symneuron does no SymPy arithmetic (SymPy's first sum loads
    its tensor and combinatorics modules, about 40 ms)."""
    return derive_connection()
