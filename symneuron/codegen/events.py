"""EventProp's kernels as C or CUDA source: a layer's exact forward and its adjoint backward.

A feedforward layer of a linear ODE neuron (its :class:`~symneuron.derivation.events.
EventSpec` has a closed-form flow) runs as two exported functions, one source per
(neuron, synapse target, dtype, whether time-constant gradients are wanted, backend):

* ``sn_events_forward``: each (batch row, neuron) pair, in parallel, takes its arrivals
  (source spike times + delays, continuous) in time order, then runs steps of ``dt``:
  arrivals applied at their exact times inside the step, the closed-form flow between
  breakpoints, a threshold crossing located inside a sub-interval to rounding (split at
  the zero of ġ, then Newton's method kept in its bracket), reset and run on, so a
  neuron may spike several times in a step. Per spike it stores its time, the states
  the derived jump still contains (:attr:`EventSpec.store`) and ġ⁻ (for the grazing
  report).
* ``sn_events_backward``: per neuron, its events in reverse: λ(t − s) = Φ(s)ᵀλ(t) between
  them, the derived jump at a spike with B = −dL/dt_k, and at an arrival dL/dw += λ·∂m/∂w,
  dL/dd −= Q, B_source += Q; ∫λ·∂f/∂θ dt by 8-point Gauss–Legendre on pieces of at most
  ``dt`` when time-constant gradients are wanted (the states between events are then
  replayed from the stored spikes). Batch rows are split into a fixed number of groups,
  each with its own dL/dW, dL/dD and dL/dθ rows (summed by the caller): in C one thread
  runs a group's rows in order, so the result does not depend on the thread count; in
  CUDA each (row, neuron) pair is a thread and adds into its group's rows atomically.
* ``sn_events_peak`` and ``sn_events_peak_backward`` (closed-form flow, two states): a
  readout layer's maximum of V over [0, t_end] (the neuron without its threshold and
  reset), and its adjoint from there back to 0 with λ_V = dL/dy at the maximum
  (:func:`symneuron.eventprop.max_voltage`); ``sn_events_mean`` and
  ``sn_events_mean_backward``: its mean of V weighted by κ(t) = 1 or e^{−t/τ}, and the
  adjoint with the loss as a continuous source in dλ_V/dt
  (:func:`symneuron.eventprop.mean_voltage`).

A neuron's arrivals come in time order through its sample's ``order`` (the runtime's
stable sort of the sample's spike times) where its delays are equal along its row, with
no list and no sorting; else the row sorts its own list in its scratch.

The skeleton (``event_skeleton.c``, beside this module) is the same for every neuron and
both languages; everything model-specific is printed from the spec
(:mod:`.event_functions`), everything language-specific is a word of :data:`LANGUAGES`
defined in the header and the two entry points at the skeleton's end (an OpenMP loop in
C, one thread per pair in CUDA). Its two parameter lists come from :data:`FORWARD_ARGS`
and :data:`BACKWARD_ARGS`, which the runtime packs by name.
"""

from __future__ import annotations

from importlib import resources
from typing import NamedTuple

import numpy as np

from ..definition import Definition
from ..derivation.events import EventSpec
from .event_functions import EventFunctions, event_functions

__all__ = [
    "KernelArg",
    "FORWARD_ARGS",
    "BACKWARD_ARGS",
    "PEAK_ARGS",
    "PEAK_BACKWARD_ARGS",
    "MEAN_ARGS",
    "MEAN_BACKWARD_ARGS",
    "LOOP_FORWARD_ARGS",
    "LOOP_BACKWARD_ARGS",
    "ARGS",
    "PARTS_OF",
    "EventSource",
    "LANGUAGES",
    "render_events",
    "scratch_bytes",
    "loop_bytes",
    "trace_entries",
    "entry_values",
]

#: the C compute type of each dtype the EventProp kernels take
COMPUTE = {"float32": "float", "float64": "double"}
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
    "double until, double step, long long B, long long N, long long n_in, long long k_in, "
    "long long k_out, long long n_steps, const long long* order, const real* ordered, "
    "long long transposed, "
    "unsigned char* scratch, long long slab_bytes, long long row0, long long rows"
)
#: ``pre`` [B, n_in, k_in] (+inf padded), ``weight``/``delay`` [N, n_in], ``params``
#: [NP, N] (the spec's order), ``until`` and ``step`` t_end and dt (values, not a
#: tensor: a host-to-device copy would wait for the stream); ``order`` [B, n_in·k_in]
#: each sample's spikes in time order (a stable sort of ``pre``) and ``ordered``
#: their times in that order, given only where every neuron's delays are equal along its row
#: (null: each row sorts its own arrivals), n_in·k_in < 2³¹; ``transposed`` 1:
#: ``weight``, ``delay`` (and the backward's ``grad_w``, ``grad_d``) laid out
#: [..., n_in, N] instead (CUDA: a warp's neurons then read and add into one line per
#: input);
#: ``scratch`` (CUDA) ``slab_bytes`` bytes per row of the launch (:func:`scratch_bytes`;
#: C takes as many per thread itself); the launch runs rows [row0, row0 + rows) of the
#: B·N (sample, neuron) rows. Out: ``times`` [B, N, k_out] (+inf past the count),
#: ``store`` [B, N, k_out, NSTORE], ``rate`` (ġ⁻) [B, N, k_out], ``counts`` [B, N] (may
#: exceed k_out: run again with more slots), ``status`` [B, N] (1 where a reset did not
#: leave the threshold)
FORWARD_ARGS = _args(
    _SHARED + ", real* times, real* store, real* rate, long long* counts, long long* status"
)
#: the forward's inputs and what it returned, ``grad_t`` [B, N, k_out] (dL/dt_k: B = −dL/dt_k);
#: out (zeroed by the caller): ``grad_w``/``grad_d`` [groups, N, n_in], ``grad_p``
#: [groups, NP, N] (sample b adds into group b mod groups), ``source_b`` [B, n_in, k_in]
#: (Σ Q per presynaptic spike); ``grad_d`` and ``source_b`` may be null (not wanted)
BACKWARD_ARGS = _args(
    _SHARED + ", long long groups, const real* times, const real* store, "
    "const long long* counts, const real* grad_t, real* grad_w, real* grad_d, real* grad_p, "
    "real* source_b"
)


#: a readout's maximum of V (no threshold, no reset), per (sample, neuron) row of the
#: B·N: its ``value``, time ``when``, and where it sits on an arrival that arrival's
#: source slot ``src`` (i·k_in + slot; else −1) and V's ``rate`` just before it
PEAK_ARGS = _args(_SHARED + ", real* value, real* when, real* rate, long long* src")
#: the readout's backward from its maximum: the forward's ``when``, ``src``, ``rate`` and
#: dL/dy ``grad_y`` [B, N]; out as :data:`BACKWARD_ARGS`'
PEAK_BACKWARD_ARGS = _args(
    _SHARED + ", long long groups, const real* when, const long long* src, const real* rate, "
    "const real* grad_y, real* grad_w, real* grad_d, real* grad_p, real* source_b"
)
#: a readout's mean of V, (1/t_end)∫κ(t)V dt with κ = 1 or e^{−t/τ} (``tau_weight`` τ > 0;
#: 0 for κ = 1), per (sample, neuron) row: its ``value``
MEAN_ARGS = _args(_SHARED + ", double tau_weight, real* value")
#: the mean readout's backward, dL/dy ``grad_y`` [B, N] a continuous source (dL/dy·κ/t_end
#: in dλ_V/dt); out as :data:`BACKWARD_ARGS`'
MEAN_BACKWARD_ARGS = _args(
    _SHARED + ", double tau_weight, long long groups, const real* grad_y, real* grad_w, "
    "real* grad_d, real* grad_p, real* source_b"
)
#: a recurrent layer's forward (one sample a block, or a C thread): the feedforward
#: layer's arguments and its ``rec_weight``, ``rec_delay`` [N, N] (target, source; their
#: [source, target] copies where ``transposed``), delays at least one step; ``rows`` and
#: ``row0`` count samples here, ``slab_bytes`` is a sample's scratch: ``head_bytes`` (its
#: spikes' log) then a slab of ``row_bytes`` per neuron (its state, its feedforward list
#: of ``list_bytes``, its queue of ``queue_slots`` recurrent arrivals); ``status`` 2 where
#: a recurrent arrival fell inside its spike's step, 3 where a queue had too little room
#: (run again with more)
LOOP_FORWARD_ARGS = _args(
    _SHARED + ", const real* rec_weight, const real* rec_delay, long long row_bytes, "
    "long long head_bytes, long long list_bytes, long long queue_slots, "
    "real* times, real* store, real* rate, long long* counts, long long* status"
)
#: its backward: :data:`BACKWARD_ARGS`' and ``grad_rw``, ``grad_rd`` [groups, N, N]
#: (laid out as the recurrent tensors; ``grad_rd`` may be null); a sample's
#: ``head_bytes`` hold the spikes' recurrent B, a row's slab its state, its sorted
#: arrivals (:func:`loop_bytes`: ``list_bytes``, room for ``loop_slots`` recurrent ones,
#: the most spikes the layer has in a sample) and ``events`` states before and after
#: each event
LOOP_BACKWARD_ARGS = _args(
    _SHARED + ", const real* rec_weight, const real* rec_delay, long long row_bytes, "
    "long long head_bytes, long long list_bytes, long long events, long long loop_slots, "
    "long long groups, "
    "const real* times, const real* store, const long long* counts, const real* grad_t, "
    "real* grad_w, real* grad_d, real* grad_p, real* source_b, real* grad_rw, real* grad_rd"
)
#: each kernel's arguments, by its name after ``sn_events_``
ARGS = {
    "forward": FORWARD_ARGS,
    "backward": BACKWARD_ARGS,
    "peak": PEAK_ARGS,
    "peak_backward": PEAK_BACKWARD_ARGS,
    "mean": MEAN_ARGS,
    "mean_backward": MEAN_BACKWARD_ARGS,
    "loop_forward": LOOP_FORWARD_ARGS,
    "loop_backward": LOOP_BACKWARD_ARGS,
}
#: which source holds each kernel (:func:`render_events`' ``part``): a layer's compiles
#: its two kernels only, the readouts' and the recurrent layers' on their first launch
PARTS_OF = {
    "forward": "layers",
    "backward": "layers",
    "peak": "readouts",
    "peak_backward": "readouts",
    "mean": "readouts",
    "mean_backward": "readouts",
    "loop_forward": "recurrent",
    "loop_backward": "recurrent",
}


class Language(NamedTuple):
    """The words of one language in the skeleton: its headers, function qualifiers
    (``SN_FN``, ``SN_INLINE``, ``SN_CONST``), +inf, how a row adds into a gradient
    shared with other rows (``SN_ADD``: C's rows of one group run on one thread, CUDA's
    on many), how it reads an input no kernel writes (``SN_LOAD``: CUDA's read-only
    cache, which also frees the compiler to move the load past the atomic adds), how it
    reads what other threads added to atomically (``SN_FRESH``: past CUDA's L1) and how
    it asks for a loop of independent iterations to be unrolled (``SN_UNROLL``: in CUDA,
    so that a thread overlaps their loads and exponentials)."""

    includes: tuple[str, ...]
    fn: str
    inline: str
    const: str
    inf: str
    add: str
    load: str
    fresh: str
    unroll: str


#: backend -> the skeleton's words in its language
LANGUAGES = {
    "cpu": Language(
        ("#include <math.h>", "#include <stdlib.h>"),
        "static",
        "static inline",
        "static const",
        "((real)INFINITY)",
        "((ref) += (value))",
        "(*(ptr))",
        "(*(ptr))",
        "",
    ),
    "cuda": Language(
        (),
        "static __device__",
        "static __device__ __forceinline__",
        "static __device__ const",
        "((real)__int_as_float(0x7f800000))",
        "atomicAdd(&(ref), (value))",
        "__ldg(ptr)",
        "__ldcg(ptr)",
        '_Pragma("unroll 4")',
    ),
}


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


def _names(args: tuple[KernelArg, ...]) -> str:
    return ", ".join(a.name for a in args)


def _limit(value: float) -> str:
    return f"((real){float(value)!r})"


def _header(
    fns: EventFunctions, compute: str, integrals: bool, language: Language, part: str
) -> list[str]:
    limits = np.finfo(np.float32 if compute == "float" else np.float64)
    nodes, weights = np.polynomial.legendre.leggauss(8)
    store = ", ".join(str(i) for i in (*fns.store, 0))
    return [
        *language.includes,
        f"typedef {compute} real;",
        f"#define SN_CUDA {int(language is LANGUAGES['cuda'])}",
        f"#define SN_FN {language.fn}",
        f"#define SN_INLINE {language.inline}",
        f"#define SN_CONST {language.const}",
        f"#define SN_INF {language.inf}",
        f"#define SN_ADD(ref, value) {language.add}",
        f"#define SN_LOAD(ptr) {language.load}",
        f"#define SN_FRESH(ptr) {language.fresh}",
        f"#define SN_UNROLL {language.unroll}",
        f"#define NS {fns.states}",
        f"#define NP {fns.params}",
        f"#define NK {fns.constants}",
        f"#define NSTORE {len(fns.store)}",
        f"#define PARTS {1 if fns.states == 2 else PARTS}",
        f"#define SN_ITERATIONS {ITERATIONS}",
        f'#define SN_OMP_PARALLEL _Pragma("omp parallel if (rows >= {PARALLEL_FROM})")',
        f'#define SN_OMP_SAMPLES _Pragma("omp parallel if (rows * N >= {PARALLEL_FROM})")',
        f"#define SN_EPS {_limit(limits.eps)}",
        f"#define SN_TINY {_limit(limits.tiny)}",
        f"#define SN_INTEGRALS {int(integrals)}",
        f"#define SN_REPLAY {int(integrals or fns.replay)}",
        f"#define SN_RK4 {int(fns.rk4)}",
        f"#define SN_READOUTS {int(part == 'readouts' and not fns.rk4)}",
        f"#define SN_RECURRENT {int(part == 'recurrent')}",
        f"#define SN_LOOP_STATE {loop_state(fns)}",
        f"#define SN_WHOLE {int(fns.whole)}",
        f"#define SN_DIRECT {int(fns.passes and not (fns.rk4 or integrals or fns.replay))}",
        f"#define SN_GAUSS_NODES {_floats(nodes)}",
        f"#define SN_GAUSS_WEIGHTS {_floats(weights)}",
        f"#define SN_FORWARD_PARAMS {_params(FORWARD_ARGS)}",
        f"#define SN_FORWARD_NAMES {_names(FORWARD_ARGS)}",
        f"#define SN_BACKWARD_PARAMS {_params(BACKWARD_ARGS)}",
        f"#define SN_BACKWARD_NAMES {_names(BACKWARD_ARGS)}",
        f"#define SN_PEAK_PARAMS {_params(PEAK_ARGS)}",
        f"#define SN_PEAK_NAMES {_names(PEAK_ARGS)}",
        f"#define SN_PEAK_BACKWARD_PARAMS {_params(PEAK_BACKWARD_ARGS)}",
        f"#define SN_PEAK_BACKWARD_NAMES {_names(PEAK_BACKWARD_ARGS)}",
        f"#define SN_MEAN_PARAMS {_params(MEAN_ARGS)}",
        f"#define SN_MEAN_NAMES {_names(MEAN_ARGS)}",
        f"#define SN_MEAN_BACKWARD_PARAMS {_params(MEAN_BACKWARD_ARGS)}",
        f"#define SN_MEAN_BACKWARD_NAMES {_names(MEAN_BACKWARD_ARGS)}",
        f"#define SN_LOOP_FORWARD_PARAMS {_params(LOOP_FORWARD_ARGS)}",
        f"#define SN_LOOP_FORWARD_NAMES {_names(LOOP_FORWARD_ARGS)}",
        f"#define SN_LOOP_BACKWARD_PARAMS {_params(LOOP_BACKWARD_ARGS)}",
        f"#define SN_LOOP_BACKWARD_NAMES {_names(LOOP_BACKWARD_ARGS)}",
        f"SN_CONST int sn_store[NSTORE + 1] = {{{store}}};",
    ]


def render_events(
    definition: Definition,
    spec: EventSpec,
    dtype: str,
    integrals: bool = False,
    backend: str = "cpu",
    rk4: bool | None = None,
    part: str = "layers",
) -> EventSource:
    """The source of ``spec``'s EventProp kernels in ``dtype`` (``"float32"`` or
    ``"float64"``) for ``backend`` (``"cpu"``: C, ``"cuda"``: CUDA C++ for NVRTC);
    ``integrals``: the backward adds ∫λ·∂f/∂θ dt (time-constant gradients; it then
    replays each neuron's states between events). ``rk4``: the RK4 path (RK4 steps,
    crossings on each step's Hermite interpolant, the adjoint back by RK4) rather than
    the closed-form flow; None picks it where the spec has no closed-form flow (a
    nonlinear neuron: QIF, EIF, AdEx) and the flow where it has one. ``part``: which
    kernels the source holds besides the skeleton's pieces (:data:`PARTS_OF`):
    ``"layers"`` a feedforward layer's two, ``"readouts"`` the readout kernels
    (``sn_events_peak``, ``sn_events_mean`` and their backwards; closed-form flow only),
    ``"recurrent"`` a recurrent layer's two (``sn_events_loop_forward`` and
    ``_backward``, ``event_recurrent.c``; closed-form flow only), each a source of its
    own so that a layer's compiles no more than its two kernels.

    >>> import sympy as sp, symneuron as sn
    >>> tau_m, tau_s, I = sp.symbols("tau_m tau_s I")
    >>> lif = sn.Neuron.from_ode((-sn.V + I) / tau_m, dt=1.0, method="exact",
    ...     params={tau_m: 10.0, tau_s: 5.0}, states={I: sn.ODEState(-I / tau_s + sn.X)})
    >>> src = render_events(lif, lif.events(), "float32")
    >>> "typedef float real;" in src.text and "(sn_events_backward, sn_backward_row" in src.text
    True
    >>> "#define SN_CUDA 1" in render_events(lif, lif.events(), "float32", backend="cuda").text
    True
    >>> "#define SN_RK4 0" in src.text, "#define SN_RK4 1" in render_events(
    ...     lif, lif.events(), "float32", rk4=True).text
    (True, True)
    """
    if dtype not in COMPUTE:
        raise TypeError(f"The EventProp kernels take {sorted(COMPUTE)}, not {dtype!r}.")
    if backend not in LANGUAGES:
        raise ValueError(f"The EventProp kernels run on {sorted(LANGUAGES)}, not {backend!r}.")
    compute = COMPUTE[dtype]
    fns = event_functions(definition, spec, compute, rk4)
    integrals = integrals and fns.integrands
    skeleton = resources.files(__package__).joinpath("event_skeleton.c").read_text()
    if part not in set(PARTS_OF.values()):
        raise ValueError(f"part must be one of {sorted(set(PARTS_OF.values()))}, not {part!r}.")
    if part == "recurrent":
        skeleton += "\n" + resources.files(__package__).joinpath("event_recurrent.c").read_text()
    header = _header(fns, compute, integrals, LANGUAGES[backend], part)
    text = "\n".join([*header, "", fns.source, "", skeleton])
    return EventSource(text, fns, integrals)


def loop_state(fns: EventFunctions) -> int:
    """The bytes a recurrent row's state takes at the start of its slab, at most (the
    kernels check their structs fit): a list's header, the states, λ, params and
    constants (and on the RK4 path dL/dθ summed so far), a few counters."""
    params = 2 * fns.params + 1 if fns.rk4 else fns.params
    return -(-(128 + 8 * (2 * fns.states + params + fns.constants + 4)) // 16) * 16


def arrival_bytes(dtype: str) -> int:
    """The bytes of one ``sn_arrival`` (time, weight, source index)."""
    return 2 * np.dtype(dtype).itemsize + 8


def trace_entries(n_in_slots: int, k_out: int, n_steps: int) -> int:
    """The most entries an RK4 row's replayed forward records: a sub-step per step, per
    arrival and per spike (each cuts one), an event per arrival and per spike, one spare."""
    return n_steps + 2 * (n_in_slots + k_out) + 1


def entry_values(states: int) -> int:
    """The values of one entry of an RK4 replay's trace: its kind, length and time, then a
    sub-step's states at its start, middle and end (an event's state just before it)."""
    return 3 + 3 * states


def scratch_bytes(
    source: EventSource,
    dtype: str,
    n_in_slots: int,
    k_out: int,
    n_steps: int,
    sorting: bool,
    pieces: bool = False,
) -> dict[str, int]:
    """The scratch bytes one row takes in each pass (``"forward"``, ``"backward"``),
    rounded up to 16: a list of 2 (n_in·k_in + 1) arrivals to sort into (``sorting``: no
    ``order`` given), and in the backward the states before and after each event
    (n_in·k_in + k_out + 1 events where the backward replays the forward, else 1) and the
    integral's pieces (n_steps + 3 of NS + 1 values, with time-constant integrals or
    ``pieces``: a mean readout's source). On the
    RK4 path the backward's replay of the forward takes :func:`trace_entries` entries of
    :func:`entry_values` instead."""
    real = np.dtype(dtype).itemsize
    states = source.functions.states
    listed = 2 * (n_in_slots + 1) * arrival_bytes(dtype) if sorting else 0
    if source.functions.rk4:
        backward = listed + trace_entries(n_in_slots, k_out, n_steps) * entry_values(states) * real
        return {"forward": -(-listed // 16) * 16, "backward": -(-backward // 16) * 16}
    replay = source.integrals or source.functions.replay
    events = n_in_slots + k_out + 1 if replay else 1
    cuts = (n_steps + 3 if source.integrals or pieces else 1) * (states + 1)
    backward = listed + (2 * events * states + cuts) * real
    return {"forward": -(-listed // 16) * 16, "backward": -(-backward // 16) * 16}


def _up(n: int) -> int:
    return -(-n // 16) * 16


def loop_bytes(
    source: EventSource,
    dtype: str,
    n: int,
    n_in_slots: int,
    k_out: int,
    n_steps: int,
    sorting: bool,
    loop_slots: int = 0,
    queue_slots: int = 0,
) -> dict[str, dict[str, int]]:
    """A recurrent layer's scratch in each pass (``"forward"``, ``"backward"``) per sample
    of ``n`` neurons (launch values by name, and ``slab_bytes``, a sample's whole): its
    head (the forward's log of N·k_out spikes; the backward's bit a step, set where the
    layer spiked, and the recurrent B of each spike), each
    row's slab of ``row_bytes`` (its state, then the forward's feedforward list where
    ``sorting`` (2 (n_in·k_in + 1) arrivals) and its queue of ``queue_slots`` recurrent
    arrivals (N·k_out where 0: every spike of the layer);
    in the backward, where SN_DIRECT, the feedforward list where ``sorting`` and the
    recurrent arrivals', 2 (``loop_slots`` + 1), ``loop_slots`` the most spikes the layer
    has in a sample, else one list of both, 2 (n_in·k_in + loop_slots + 1), then the
    states before and after each event where the backward replays the forward and the
    integral's pieces; on the RK4 path the replay's trace, :func:`trace_entries` of both
    lists' arrivals), where its lists end (``list_bytes``) and the events a replay
    holds."""
    real, arrival = np.dtype(dtype).itemsize, arrival_bytes(dtype)
    fns = source.functions
    state, spikes = loop_state(fns), n * k_out
    listed = 2 * (n_in_slots + 1) * arrival if sorting else 0
    queue = min(queue_slots or spikes, spikes) + 1
    forward = {"head_bytes": _up((spikes + 1) * arrival), "list_bytes": listed}
    forward.update({"queue_slots": queue, "row_bytes": _up(state + listed + queue * arrival)})
    replay = source.integrals or fns.replay
    if fns.passes and not (fns.rk4 or replay):  # SN_DIRECT
        lists = listed + 2 * (loop_slots + 1) * arrival
        backward = {"list_bytes": listed, "events": 1}
    else:
        lists = 2 * (n_in_slots + loop_slots + 1) * arrival
        backward = {"list_bytes": lists, "events": n_in_slots + loop_slots + k_out + 1}
    cuts = (n_steps + 3 if source.integrals else 1) * (fns.states + 1)
    states = (2 * backward["events"] * fns.states + cuts) * real
    if fns.rk4:  # the replay's trace instead
        entries = trace_entries(n_in_slots + loop_slots, k_out, n_steps)
        states = entries * entry_values(fns.states) * real
    backward.update(
        {
            "head_bytes": _up(4 * -(-n_steps // 32)) + _up(spikes * real),
            "row_bytes": _up(state + lists + states),
            "loop_slots": loop_slots,
        }
    )
    for one in (forward, backward):
        one["slab_bytes"] = one["head_bytes"] + n * one["row_bytes"]
    return {"forward": forward, "backward": backward}
