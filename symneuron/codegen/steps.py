"""What every pass's printer shares: one spec's streams, lanes and expressions.

A thread owns ``K`` adjacent neurons ("lanes"): at each step it loads and stores
``K`` values as one vector (16 bytes on CUDA), then runs the step body once per
lane from registers. What a pass touches is one table (:class:`StepIO`): the arrays
it reads and writes each step (:class:`Stream`), and the registers it carries to the
next step; loads, stores and declarations are printed from it. The passes' own
printers subclass :class:`StepPrinter`: :mod:`.forward` (t = 0..T−1) and
:mod:`.backward` (t = T−1..0); :mod:`.skeleton` wraps their bodies into kernels, and
:mod:`.connection` adds a connection's stage to them. Random draws: :mod:`.noise`.
"""

from __future__ import annotations

from typing import NamedTuple

import sympy as sp

from ..derivation import Block, K, KernelSpec, grad_symbol
from ..dtypes import DType
from ..signature import Variant
from . import noise
from .dialects import Dialect, indent
from .printer import KernelPrinter

__all__ = ["StepPrinter", "Stream", "StepIO", "T_UNROLL", "Stage"]

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
    order), and the per-lane registers carried to the next step (name -> value);
    ``mutable``: the registers of reads a stage changes before the lanes read them."""

    reads: tuple[Stream, ...]
    writes: tuple[Stream, ...]
    carries: tuple[tuple[str, str], ...]
    mutable: frozenset[str] = frozenset()


def _divisors(spec: KernelSpec) -> dict[sp.Symbol, sp.Symbol]:
    """param symbol -> its reciprocal's symbol (``<param>_rcp``), for each param that some
    kernel expression raises to a negative integer power (divides by)."""
    parts = (spec.charge, spec.surrogate, spec.reset, spec.backward, spec.updates)
    exprs = [spec.threshold, *(line.expr for b in (*parts, spec.state_resets) for line in b)]
    params = set(spec.param_symbols.values())
    pows = (a for e in exprs for a in sp.sympify(e).atoms(sp.Pow))
    found = {a.base for a in pows if a.base in params and a.exp.is_Integer and a.exp < 0}
    return {p: sp.Symbol(f"{p}_rcp", real=True) for p in sorted(found, key=str)}


class Stage(NamedTuple):
    """The lines a stage (a connection) adds to each step of a pass: ``before`` the
    lanes' step (after the step's loads), and ``after`` its stores."""

    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()


#: no stage around the step
NO_STAGE = Stage()


class StepPrinter:
    """The printing one spec's passes share for one dtype and dialect: the streams,
    the lanes' set-up, expressions, loads and stores. A pass's printer subclasses it
    and prints its body (:meth:`body`)."""

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
        self,
        block: Block,
        h: str = "h",
        mutable: bool = False,
        rounded: bool = False,
        declare: bool = True,
    ) -> list[str]:
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

    def read_vector(self, stream: Stream, offset: str = "k", mutable: bool = False) -> str:
        vec, const = self.vec, "" if mutable else "const "
        return f"{const}{vec} {stream.register} = *(const {vec}*)({self.array(stream)} + {offset});"

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

    def final_state(self) -> list[str]:
        """One lane's V and extra states, stored after the last step."""
        last = [f"v_seq[i0 + j] = {self.store('V_l[j]')};"]
        w_out = "w_out[(long long){} * N + i0 + j] = {};"
        return last + [w_out.format(i, self.store(f"w{i}_l[j]")) for i in range(self.k)]

    # -- a pass's body ------------------------------------------------------
    def io(self, variant: Variant) -> StepIO:
        """What ``variant``'s steps read, write and carry."""
        raise NotImplementedError

    def step(self, variant: Variant, io: StepIO, stage: Stage = NO_STAGE) -> list[str]:
        """One step of the time loop for the thread's K lanes, with ``stage``'s lines."""
        raise NotImplementedError

    def body(self, variant: Variant) -> list[str]:
        """The whole body of one thread of ``variant``'s feedforward kernel."""
        raise NotImplementedError
