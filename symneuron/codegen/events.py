"""EventProp's kernels as C source: a layer's exact forward and its adjoint backward.

A feedforward layer of a linear ODE neuron (its :class:`~symneuron.derivation.events.
EventSpec` has a closed-form flow) runs as two exported C functions, one source per
(neuron, synapse target, dtype, whether time-constant gradients are wanted):

* ``sn_events_forward``: each (batch row, neuron) pair, in parallel, sorts its arrivals
  (source spike times + delays, continuous), then runs steps of ``dt``: arrivals applied
  at their exact times inside the step, the closed-form flow between breakpoints, a
  threshold crossing located inside a sub-interval to rounding (split at the zero of ġ,
  then Newton's method kept in its bracket), reset and run on, so a neuron may spike
  several times in a step. Per spike it stores its time, the states the derived jump
  still contains (:attr:`EventSpec.store`) and ġ⁻ (for the grazing report).
* ``sn_events_backward``: per neuron, its events in reverse: λ(t − s) = Φ(s)ᵀλ(t) between
  them, the derived jump at a spike with B = −dL/dt_k, and at an arrival dL/dw += λ·∂m/∂w,
  dL/dd −= Q, B_source += Q; ∫λ·∂f/∂θ dt by 8-point Gauss–Legendre on pieces of at most
  ``dt`` when time-constant gradients are wanted (the states between events are then
  replayed from the stored spikes). Batch rows are split into a fixed number of groups,
  each with its own dL/dW, dL/dD and dL/dθ rows (summed by the caller), so the result
  does not depend on the thread count.

The skeleton (``event_skeleton.c``, beside this module) is the same for every neuron;
everything model-specific is printed from the spec (:mod:`.event_functions`). Its two
parameter lists come from :data:`FORWARD_ARGS` and :data:`BACKWARD_ARGS`, which the
runtime packs by name.
"""

from __future__ import annotations

from importlib import resources
from typing import NamedTuple

import numpy as np

from ..definition import Definition
from ..derivation.events import EventSpec
from .event_functions import EventFunctions, event_functions

__all__ = ["KernelArg", "FORWARD_ARGS", "BACKWARD_ARGS", "EventSource", "render_events"]

#: the C compute type of each dtype the EventProp kernels take
COMPUTE = {"float32": "float", "float64": "double"}
_LIMITS = {"float": ("FLT_EPSILON", "FLT_MIN"), "double": ("DBL_EPSILON", "DBL_MIN")}
#: Newton and bisection steps at most per root (far more than rounding needs)
ITERATIONS = 200
#: (batch row, neuron) pairs from which a layer's kernels run on several threads: below,
#: waking the threads costs more than the work (a 2 × 8 layer took 22 ms with two
#: threads on a loaded machine, 0.1 ms with one)
PARALLEL_FROM = 1024
#: parts a crossing search cuts a sub-interval into for more than two states (g along the
#: flow is a sum of n exponentials, ġ has at most n − 1 zeros; each part is taken to hold
#: at most one), as the reference does
PARTS = 8


class KernelArg(NamedTuple):
    """One argument of an EventProp kernel: its name (in C and to the runtime) and its
    C type in terms of ``real`` (the compute type)."""

    name: str
    ctype: str

    @property
    def pointer(self) -> bool:
        return self.ctype.endswith("*")


def _args(text: str) -> tuple[KernelArg, ...]:
    pairs = (part.strip().rsplit(" ", 1) for part in text.split(","))
    return tuple(KernelArg(name, ctype) for ctype, name in pairs)


_SHARED = (
    "const real* pre, const real* weight, const real* delay, const real* params, "
    "const real* scalars, long long B, long long N, long long n_in, long long k_in, "
    "long long k_out, long long n_steps"
)
#: ``pre`` [B, n_in, k_in] (+inf padded), ``weight``/``delay`` [N, n_in], ``params``
#: [NP, N] (the spec's order), ``scalars`` (t_end, dt); out: ``times`` [B, N, k_out]
#: (+inf past the count), ``store`` [B, N, k_out, NSTORE], ``rate`` (ġ⁻) [B, N, k_out],
#: ``counts`` [B, N] (may exceed k_out: run again with more slots), ``status`` [B, N]
#: (1 where a reset did not leave the threshold)
FORWARD_ARGS = _args(
    _SHARED + ", real* times, real* store, real* rate, long long* counts, long long* status"
)
#: the forward's inputs and what it returned, ``own_b`` [B, N, k_out] (B = −dL/dt_k);
#: out (zeroed by the caller): ``grad_w``/``grad_d`` [groups, N, n_in], ``grad_p``
#: [groups, NP, N], ``source_b`` [B, n_in, k_in] (Σ Q per presynaptic spike)
BACKWARD_ARGS = _args(
    _SHARED + ", long long groups, const real* times, const real* store, "
    "const long long* counts, const real* own_b, real* grad_w, real* grad_d, real* grad_p, "
    "real* source_b"
)


class EventSource(NamedTuple):
    """A rendered EventProp source and the facts its runtime needs."""

    text: str
    functions: EventFunctions
    integrals: bool

    @property
    def store(self) -> tuple[int, ...]:
        return self.functions.store


def _params(args: tuple[KernelArg, ...]) -> str:
    return ", ".join(f"{a.ctype} {a.name}" for a in args)


def _floats(values: np.ndarray) -> str:
    return "{" + ", ".join(repr(float(v)) for v in values) + "}"


def _header(fns: EventFunctions, compute: str, integrals: bool) -> list[str]:
    eps, tiny = _LIMITS[compute]
    nodes, weights = np.polynomial.legendre.leggauss(8)
    store = ", ".join(str(i) for i in (*fns.store, 0))
    return [
        "#include <float.h>",
        "#include <math.h>",
        "#include <stdlib.h>",
        "#include <string.h>",
        f"typedef {compute} real;",
        f"#define NS {fns.states}",
        f"#define NP {fns.params}",
        f"#define NSTORE {len(fns.store)}",
        f"#define PARTS {1 if fns.states == 2 else PARTS}",
        f"#define SN_ITERATIONS {ITERATIONS}",
        f"#define SN_PARALLEL_FROM {PARALLEL_FROM}",
        f"#define SN_EPS {eps}",
        f"#define SN_TINY {tiny}",
        f"#define SN_INTEGRALS {int(integrals)}",
        f"#define SN_REPLAY {int(integrals or fns.replay)}",
        f"#define SN_GAUSS_NODES {_floats(nodes)}",
        f"#define SN_GAUSS_WEIGHTS {_floats(weights)}",
        f"#define SN_FORWARD_PARAMS {_params(FORWARD_ARGS)}",
        f"#define SN_BACKWARD_PARAMS {_params(BACKWARD_ARGS)}",
        f"static const int sn_store[NSTORE + 1] = {{{store}}};",
    ]


def render_events(
    definition: Definition, spec: EventSpec, dtype: str, integrals: bool = False
) -> EventSource:
    """The C source of ``spec``'s EventProp kernels in ``dtype`` (``"float32"`` or
    ``"float64"``); ``integrals``: the backward adds ∫λ·∂f/∂θ dt (time-constant
    gradients; it then replays each neuron's states between events).

    >>> import sympy as sp, symneuron as sn
    >>> tau_m, tau_s, I = sp.symbols("tau_m tau_s I")
    >>> lif = sn.Neuron.from_ode((-sn.V + I) / tau_m, dt=1.0, method="exact",
    ...     params={tau_m: 10.0, tau_s: 5.0}, states={I: sn.ODEState(-I / tau_s + sn.X)})
    >>> src = render_events(lif, lif.events(), "float32")
    >>> "typedef float real;" in src.text and "void sn_events_backward(" in src.text
    True
    """
    if dtype not in COMPUTE:
        raise TypeError(f"The EventProp kernels take {sorted(COMPUTE)}, not {dtype!r}.")
    compute = COMPUTE[dtype]
    fns = event_functions(definition, spec, compute)
    integrals = integrals and fns.integrands
    skeleton = resources.files(__package__).joinpath("event_skeleton.c").read_text()
    text = "\n".join([*_header(fns, compute, integrals), "", fns.source, "", skeleton])
    return EventSource(text, fns, integrals)
