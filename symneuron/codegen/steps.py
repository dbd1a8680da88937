"""The step bodies: one neuron's forward and backward time loops, printed from its spec.

A thread owns ``K`` adjacent neurons ("lanes"): at each step it loads and stores
``K`` values as one vector (16 bytes on CUDA), then runs the step body once per
lane from registers. The forward runs t = 0..T−1 and stores S (and H, W̃ for the
backward, V every step or the last); the backward runs t = T−1..0, recomputing
V[t−1] (and W[t−1]) from the stored H[t−1] and W̃[t−1] when its partials need
them, and carries dL/dV (and dL/dW) from step to step. Random draws: :mod:`.noise`.
What a pass touches is one table (:class:`StepIO`): the arrays it reads and writes
each step (:class:`Stream`), and the registers it carries to the next step; loads,
stores and declarations are printed from it. :mod:`~symneuron.codegen.skeleton` (and
:mod:`~symneuron.codegen.recurrent`, around the same lane bodies) wraps them.
"""

from __future__ import annotations

from typing import NamedTuple

import sympy as sp

from ..derivation import Block, K, KernelSpec, grad_symbol
from ..dtypes import DType
from . import noise
from .dialects import INDENT, Dialect, indent
from .printer import KernelPrinter

__all__ = ["StepPrinter", "Stream", "StepIO", "T_UNROLL"]

#: Unroll factor of the loop over t (NVRTC honours it: later steps' loads issue early).
T_UNROLL = "(K == 1 ? 8 : 4)"


class Stream(NamedTuple):
    """An array a step reads or writes K values of: the kernel argument, the vector
    register holding this step's K values, the value's name in the step body, and the
    state's block of a [k, rows, N] array (None for a [rows, N] one)."""

    array: str
    register: str
    value: str
    state: int | None = None


class StepIO(NamedTuple):
    """What one pass touches each step: arrays read and written (in declaration
    order), and the per-lane registers carried to the next step (name -> value)."""

    reads: tuple[Stream, ...]
    writes: tuple[Stream, ...]
    carries: tuple[tuple[str, str], ...]


def _divisors(spec: KernelSpec) -> dict[sp.Symbol, sp.Symbol]:
    """param symbol -> its reciprocal's symbol (``<param>_rcp``), for each param that some
    kernel expression raises to a negative integer power (divides by)."""
    parts = (spec.charge, spec.surrogate, spec.reset, spec.backward, spec.updates)
    exprs = [spec.threshold, *(line.expr for b in (*parts, spec.state_resets) for line in b)]
    params = set(spec.param_symbols.values())
    pows = (a for e in exprs for a in sp.sympify(e).atoms(sp.Pow))
    found = {a.base for a in pows if a.base in params and a.exp.is_Integer and a.exp < 0}
    return {p: sp.Symbol(f"{p}_rcp", real=True) for p in sorted(found, key=str)}


class StepPrinter:
    """Prints the bodies of one spec's kernels for one dtype and dialect: the lane
    set-up, the time loop with one step per iteration, and the final stores."""

    def __init__(self, spec: KernelSpec, dtype: DType, dialect: Dialect) -> None:
        self.spec = spec
        self.dt = dtype
        self.dialect = dialect
        self.printer = KernelPrinter(dtype.compute)
        self.pnames = dict(spec.param_cnames)
        self.k = len(spec.states)
        #: W̃ rows the training forward saves and the backward reads (all or none)
        self.kw = spec.saved_states
        #: params some expression divides by: each lane keeps 1/p, so that a step
        #: multiplies (an IEEE division is about ten instructions on the serial chain)
        self.rcp = _divisors(spec)
        self.vec = dialect.vector(dtype)

    # -- the tables ---------------------------------------------------------
    def streams(self, name: str) -> list[Stream]:
        """Every stream of one kind, one per state for the per-state kinds."""
        states = range(self.k)
        table = {
            "x": [Stream("x_seq", "x_v", "X")],
            "spike": [Stream("spike_seq", "s_v", "s")],
            "h": [Stream("h_seq", "h_v", "h")],
            "h_prev": [Stream("h_seq", "hp_v", "h_prev")],
            "v": [Stream("v_seq", "v_v", "V")],
            "wt": [Stream("wt_seq", f"wt{i}_v", f"wt{i}", i) for i in range(self.kw)],
            "wt_prev": [Stream("wt_seq", f"wtp{i}_v", f"wt{i}", i) for i in range(self.kw)],
            "w_out": [Stream("w_out", f"wo{i}_v", f"w{i}", i) for i in states],
            "grad_spike": [Stream("grad_spike", "gs_v", str(K.grad_s))],
            "grad_v": [Stream("grad_v_seq", "gv_v", str(K.grad_v))],
            "grad_w": [Stream("grad_w_seq", f"gw{i}_v", f"grad_w{i}", i) for i in states],
            "grad_x": [Stream("grad_x_seq", "gx_v", str(grad_symbol("X")))],
        }
        return table[name]

    def forward_io(self, store_h: bool, v_mode: str) -> StepIO:
        seq = v_mode == "seq"
        writes = [*self.streams("spike"), *(self.streams("h") if store_h else [])]
        writes += [*(self.streams("v") if seq else []), *(self.streams("wt") if store_h else [])]
        writes += self.streams("w_out") if seq else []
        carries = (("V_l", "V"), *[(f"w{i}_l", f"w{i}") for i in range(self.k)])
        return StepIO(tuple(self.streams("x")), tuple(writes), carries)

    def backward_io(self, grad_v_mode: str) -> StepIO:
        carried = self.carries()
        reads = [*self.streams("h_prev" if carried else "h"), *self.streams("wt_prev")]
        reads += [*(self.streams("x") if self.spec.needs_x else []), *self.streams("grad_spike")]
        if grad_v_mode == "seq":
            reads += [*self.streams("grad_v"), *self.streams("grad_w")]
        grads = [("carry_l", "V"), *((f"carry_w{i}_l", f"W{i}") for i in range(self.k))]
        carries = tuple((carry, str(grad_symbol(name))) for carry, name in grads)
        return StepIO(tuple(reads), tuple(self.streams("grad_x")), carries)

    # -- printing helpers ---------------------------------------------------
    def expr(self, e: sp.Expr) -> str:
        e = sp.sympify(e)
        if self.rcp:
            e = e.replace(
                lambda a: a.is_Pow and a.base in self.rcp and a.exp.is_Integer and a.exp < 0,
                lambda a: self.rcp[a.base] ** (-a.exp),
            )
        return str(self.printer.doprint(e))

    def block(
        self, block: Block, h: str = "h", mutable: bool = False, rounded: bool = False,
        declare: bool = True,
    ) -> list[str]:  # fmt: skip
        """A CSE block: temporaries declared ``const``; each target declared (rounded to
        storage if ``rounded``), or assigned when ``mutable`` or not ``declare``."""
        subs = {K.h: sp.Symbol(h, real=True)}
        out = []
        for line in block:
            value = self.expr(line.expr.xreplace(subs))
            if line.target not in block.targets:
                out.append(f"const {self.dt.compute} {line.target} = {value};")
            elif mutable or not declare:
                out.append(f"{line.target} = {value};")
            else:
                value = self.dt.rounded(value) if rounded else value
                out.append(f"const {self.dt.compute} {line.target} = {value};")
        return out

    def array(self, stream: Stream, rows: str = "T") -> str:
        """Start of a stream's [rows, N] block (a state's block of a [k, rows, N] array)."""
        if stream.state is None:
            return stream.array
        return f"({stream.array} + (long long){stream.state} * {rows} * N)"

    def v_th_line(self) -> str:
        return f"const {self.dt.compute} v_th = {self.expr(self.spec.threshold)};"

    def load(self, ref: str) -> str:
        return self.dt.load.format(ref)

    def store(self, value: str) -> str:
        return self.dt.store.format(value)

    def read_vector(self, stream: Stream, offset: str = "k") -> str:
        vec = self.vec
        return f"const {vec} {stream.register} = *(const {vec}*)({self.array(stream)} + {offset});"

    def write_vector(self, stream: Stream) -> str:
        return f"*({self.vec}*)({self.array(stream)} + k) = {stream.register};"

    def read_lane(self, stream: Stream) -> str:
        return f"const {self.dt.compute} {stream.value} = {self.load(f'{stream.register}.v[j]')};"

    def write_lane(self, stream: Stream) -> str:
        return f"{stream.register}.v[j] = {self.store(stream.value)};"

    def fire(self, h: str) -> list[str]:
        """u = h − v_th and the spike s (crossing: gated by [V[t−1] < v_th]; escape: s =
        [uniform < p(h)] at the step of ``h``)."""
        ct = self.dt.compute
        if self.spec.probability is not None:
            return noise.escape(self, ct, h, "t - 1" if h == "h_prev" else "t")
        if self.spec.crossing:
            return [
                f"const {ct} u = {h} - v_th;",
                f"const {ct} {K.gate} = V < v_th ? 1 : 0;",
                f"const {ct} s = u >= 0 ? {K.gate} : 0;",
            ]
        return [f"const {ct} u = {h} - v_th;", f"const {ct} s = u >= 0 ? 1 : 0;"]

    def positive_zero(self) -> list[str]:
        """After a hard reset: −0.0 + 0 = +0.0, as the reference's ``+ V_reset·S`` gives
        (SymPy folds V_reset = 0 away; compilers keep ``+ 0`` without fast-math)."""
        return ["V += 0;"] if self.spec.hard_reset else []

    def lane_arrays(self) -> list[tuple[str, str]]:
        """(type, name) of each per-lane register array every pass keeps: parameters,
        their reciprocals, V and each extra state."""
        ct = self.dt.compute
        arrays = [(ct, f"{c}_l") for c in self.pnames.values()] + [(ct, "V_l")]
        arrays += [(ct, f"{r}_l") for r in self.rcp.values()]
        return arrays + [(ct, f"w{i}_l") for i in range(self.k)]

    def lane_init(self) -> list[str]:
        """One lane's parameters, reciprocals and initial state, loaded into its arrays."""
        body = [f"{c}_l[j] = {c}_ptr[(i0 + j) * {c}_stride];" for c in self.pnames.values()]
        body += [f"{r}_l[j] = {self.expr(sp.Float(1.0))}/{p}_l[j];" for p, r in self.rcp.items()]
        start, first_v = self.expr(sp.Float(self.spec.v_start)), self.load("v_init[i0 + j]")
        body += [f"V_l[j] = v_init ? {first_v} : {start};"]
        for i, init in enumerate(self.spec.state_init):
            first = self.load(f"w_init[(long long){i} * N + i0 + j]")
            body.append(f"w{i}_l[j] = w_init ? {first} : {self.expr(sp.Float(init))};")
        return body

    def lane_state(self) -> list[str]:
        """Per-lane parameters, threshold and initial state in registers."""
        decl = [f"{ct} {name}[K];" for ct, name in self.lane_arrays()]
        return decl + self.dialect.lane_loop(self.lane_init())

    def lane_params(self) -> list[str]:
        ct = self.dt.compute
        out = [f"const {ct} {c} = {c}_l[j];" for c in self.pnames.values()]
        out += [f"const {ct} {r} = {r}_l[j];" for r in self.rcp.values()]
        return out + ([] if self.spec.threshold_per_step else [self.v_th_line()])

    def time_loop(self, head: str, step: list[str]) -> list[str]:
        return [*self.dialect.unroll(T_UNROLL), head, *indent(step), "}"]

    # -- the forward --------------------------------------------------------
    def forward_lane(self, io: StepIO) -> list[str]:
        """One lane's step: charge, updates, spike, resets; each written value stored
        into its vector register right after it is computed."""
        ct, spec = self.dt.compute, self.spec
        written = {s.value: s for s in io.writes}

        def put(*values: str) -> list[str]:
            return [self.write_lane(written[v]) for v in values if v in written]

        charge = self.block(spec.charge)
        charge[-1] = f"const {ct} h = {self.dt.rounded(self.expr(spec.charge[-1].expr))};"
        return [
            *self.lane_params(),
            *[f"{ct} {value} = {carry}[j];" for carry, value in io.carries],
            *[self.read_lane(s) for s in io.reads],
            *noise.normals(spec.noise_streams, ct),
            *charge,
            *put("h"),
            *self.block(spec.updates, rounded=True),
            *put(*[f"wt{i}" for i in range(self.k)]),
            *([self.v_th_line()] if spec.threshold_per_step else []),
            *self.fire("h"),
            *put("s"),
            *self.block(spec.reset, declare=False),
            *self.positive_zero(),
            *self.block(spec.state_resets, mutable=True),
            *put("V", *[f"w{i}" for i in range(self.k)]),
            *[f"{carry}[j] = {value};" for carry, value in io.carries],
        ]

    def forward(self, store_h: bool, v_mode: str) -> list[str]:
        io = self.forward_io(store_h, v_mode)
        step = [
            "const long long k = (long long)t * N + i0;",
            *[self.read_vector(s) for s in io.reads],
            f"{self.vec} {', '.join(s.register for s in io.writes)};",
            *noise.step_draws(self, self.spec.noise_streams),
            *self.dialect.lane_loop(self.forward_lane(io)),
            *[self.write_vector(s) for s in io.writes],
        ]
        last = [f"v_seq[i0 + j] = {self.store('V_l[j]')};"]
        w_out = "w_out[(long long){} * N + i0 + j] = {};"
        last += [w_out.format(i, self.store(f"w{i}_l[j]")) for i in range(self.k)]
        return [
            *noise.state(self.spec),
            *self.lane_state(),
            *self.time_loop("for (int t = 0; t < T; ++t) {", step),
            *(self.dialect.lane_loop(last) if v_mode == "last" else []),
        ]

    # -- the backward -------------------------------------------------------
    def recompute_v(self) -> list[str]:
        """V[t-1] (and each W[t-1]) of this lane: the resets of step t-1, or the initial
        values at t = 0. Step t-1 is recomputed from H[t-1] and W̃[t-1] alone."""
        ct, states = self.dt.compute, range(self.kw)  # W[t-1] only when W̃ is saved
        inner = [
            self.read_lane(self.streams("h_prev")[0]),
            *[self.read_lane(s) for s in self.streams("wt_prev")],
            *([self.v_th_line()] if self.spec.threshold_per_step else []),
            # crossing firing has no reset: V[t-1] = H[t-1] needs no spike (nor V[t-2])
            *(self.fire("h_prev") if not self.spec.crossing else []),
        ]
        inner += self.block(self.spec.reset, h="h_prev", declare=False)
        inner += self.positive_zero()
        if self.kw:
            inner += self.block(self.spec.state_resets, mutable=True, h="h_prev")
        return [
            f"{ct} V;",
            *[f"{ct} w{i};" for i in states],
            "if (t > 0) {",
            *indent(inner),
            "} else {",
            f"{INDENT}V = V_l[j];",
            *[f"{INDENT}w{i} = w{i}_l[j];" for i in states],
            "}",
        ]

    def grad_in(self, stream: Stream, carry: str, mode: str) -> str:
        """A gradient carried from step t+1 plus, by ``mode``, this step's from the loss
        (``seq``: its vector lane, ``last``: read at t = T − 1 only)."""
        state = "" if stream.state is None else f"(long long){stream.state} * N + "
        extra = {
            "none": "",
            "seq": f" + {self.load(f'{stream.register}.v[j]')}",
            "last": f" + (t == T - 1 ? {self.load(f'{stream.array}[{state}i0 + j]')} : 0)",
        }[mode]
        return f"const {self.dt.compute} {stream.value} = {carry}[j]{extra};"

    def carries(self) -> bool:
        """Whether H (and W̃) of step t-1 are loaded each step and carried to the next."""
        return self.spec.needs_v or self.kw > 0

    def backward_loads(self, io: StepIO) -> list[str]:
        out, previous = [], {*self.streams("h_prev"), *self.streams("wt_prev")}
        for s in io.reads:
            if s in previous:  # step t-1's values, carried to the next iteration
                out += [f"{self.vec} {s.register};", f"if (t > 0) {s.register} = "
                        f"*(const {self.vec}*)({self.array(s)} + k - N);"]  # fmt: skip
            elif s.array == "grad_spike":
                out += [f"{self.vec} gs_v;", "if (grad_spike_scalar) {"]
                out += indent(self.dialect.lane_loop(["gs_v.v[j] = gs_scalar;"]))
                out += ["} else {", f"{INDENT}gs_v = *(const {self.vec}*)(grad_spike + k);", "}"]
            else:
                out.append(self.read_vector(s))
        return out

    def backward_lane(self, io: StepIO, grad_v_mode: str) -> list[str]:
        at, spec = self.dt.accum, self.spec
        # H and W̃ of step t from their registers (loaded, or carried from step t+1)
        plain = [*self.streams("h"), *self.streams("wt")]
        plain += self.streams("x") if spec.needs_x else []
        (grad_v, *grad_w), carries = self.streams("grad_v") + self.streams("grad_w"), io.carries
        return [
            *self.lane_params(),
            *(self.recompute_v() if spec.needs_v or spec.needs_w else []),
            *[self.read_lane(s) for s in plain],
            *noise.normals(noise.read_by(spec, spec.backward.reads), self.dt.compute),
            *([self.v_th_line()] if spec.threshold_per_step else []),
            *self.fire("h"),
            *self.block(spec.surrogate),
            self.read_lane(self.streams("grad_spike")[0]),
            *[
                self.grad_in(s, c, grad_v_mode)
                for s, (c, _) in zip([grad_v, *grad_w], carries, strict=True)
            ],
            *self.block(spec.backward),
            *[self.write_lane(s) for s in io.writes],
            *[f"acc_{c}[j] += ({at})grad_{c};" for c in self.learnable()],
            *[f"{carry}[j] = {value};" for carry, value in carries],
        ]

    def learnable(self) -> list[str]:
        return [self.pnames[n] for n in self.spec.learnable]

    def backward(self, grad_v_mode: str) -> list[str]:
        ct, at = self.dt.compute, self.dt.accum
        io, learn, vec = self.backward_io(grad_v_mode), self.learnable(), self.vec
        carried = ["h_v = hp_v;", *[f"wt{i}_v = wtp{i}_v;" for i in range(self.kw)]]
        step = [
            "const long long k = (long long)t * N + i0;",
            *self.backward_loads(io),
            f"{vec} {', '.join(s.register for s in io.writes)};",
            *noise.backward_draws(self),
            *self.dialect.lane_loop(self.backward_lane(io, grad_v_mode)),
            *[self.write_vector(s) for s in io.writes],
            *(carried if self.carries() else []),
        ]
        last_row = "(long long)(T - 1) * N + i0"
        first = [self.streams("h")[0], *self.streams("wt")]
        first_h = [f"{vec} {s.register} = *(const {vec}*)({self.array(s)} + {last_row});"
                   for s in first]  # fmt: skip
        init = [f"{carry}[j] = 0;" for carry, _ in io.carries]
        init += [f"acc_{c}[j] = 0;" for c in learn]
        final = [f"if (grad_v_init) grad_v_init[i0 + j] = {self.store('carry_l[j]')};"]
        final += [
            f"if (grad_w_init) grad_w_init[(long long){i} * N + i0 + j] = "
            f"{self.store(f'carry_w{i}_l[j]')};"
            for i in range(self.k)
        ]
        final += [f"grad_{c}_ptr[i0 + j] = acc_{c}[j];" for c in learn]
        return [
            *noise.state(self.spec),
            *self.lane_state(),
            *[f"{ct} {carry}[K];" for carry, _ in io.carries],
            *[f"{at} acc_{c}[K];" for c in learn],
            *self.dialect.lane_loop(init),
            f"const {self.dt.storage} gs_scalar = grad_spike_scalar ? grad_spike[0] : 0;",
            *(first_h if self.carries() else []),
            *self.time_loop("for (int t = T - 1; t >= 0; --t) {", step),
            *self.dialect.lane_loop(final),
        ]
