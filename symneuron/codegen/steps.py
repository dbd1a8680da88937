"""The step bodies: one neuron's forward and backward time loops, printed from its spec.

A thread owns ``K`` adjacent neurons ("lanes"): at each step it loads and stores
``K`` values as one vector (16 bytes on CUDA), then runs the step body once per
lane from registers. The forward runs t = 0..T−1 and stores S (and H, W̃ for the
backward, V every step or the last); the backward runs t = T−1..0, recomputing
V[t−1] (and W[t−1]) from the stored H[t−1] and W̃[t−1] when its partials need
them, and carries dL/dV (and dL/dW) from step to step. Both dialects (CUDA and C)
print these same bodies; :mod:`~symneuron.codegen.skeleton` wraps them into
kernels.
"""

from __future__ import annotations

import sympy as sp

from ..derivation import Assign, K, KernelSpec, grad_symbol
from ..dtypes import DType
from .dialects import Dialect
from .printer import KernelPrinter

__all__ = ["StepPrinter", "T_UNROLL", "INDENT", "indent"]

#: Unroll factor of the loop over t: lets the compiler issue later steps' loads early.
T_UNROLL = "(K == 1 ? 8 : 4)"
INDENT = "    "


def indent(lines: list[str], depth: int = 1) -> list[str]:
    return [INDENT * depth + line if line else line for line in lines]


def _lane_loop(lines: list[str]) -> list[str]:
    return ["#pragma unroll", "for (int j = 0; j < K; ++j) {", *indent(lines), "}"]


def _divisors(spec: KernelSpec) -> dict[sp.Symbol, sp.Symbol]:
    """param symbol -> its reciprocal's symbol (``<param>_rcp``), for each param that some
    kernel expression raises to a negative integer power (divides by)."""
    exprs = [spec.threshold]
    for block in (spec.charge, spec.surrogate, spec.reset, spec.backward, spec.updates,
                  spec.state_resets):  # fmt: skip
        exprs += [line.expr for line in block]
    params = set(spec.param_symbols.values())
    found = {
        a.base
        for e in exprs
        for a in sp.sympify(e).atoms(sp.Pow)
        if a.base in params and a.exp.is_Integer and a.exp < 0
    }
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
        self.needs_prev = spec.needs_v or spec.needs_w
        #: params some expression divides by: each lane keeps 1/p, so that a step
        #: multiplies (an IEEE division is about ten instructions on the serial chain)
        self.rcp = _divisors(spec)

    @property
    def vec(self) -> str:
        return self.dialect.vector.format(st=self.dt.storage)

    def expr(self, e: sp.Expr) -> str:
        e = sp.sympify(e)
        if self.rcp:
            e = e.replace(
                lambda a: a.is_Pow and a.base in self.rcp and a.exp.is_Integer and a.exp < 0,
                lambda a: self.rcp[a.base] ** (-a.exp),
            )
        return str(self.printer.doprint(e))

    def lines(
        self, assigns: tuple[Assign, ...], declare_last: bool = True, h: str = "h"
    ) -> list[str]:
        subs = {K.h: sp.Symbol(h, real=True)}
        out = []
        for i, line in enumerate(assigns):
            target = str(line.target)
            last = i == len(assigns) - 1
            decl = f"const {self.dt.compute} " if (declare_last or not last) else ""
            out.append(f"{decl}{target} = {self.expr(line.expr.xreplace(subs))};")
        return out

    def targets(
        self, assigns: tuple[Assign, ...], mutable: bool, h: str = "h", rounded: bool = False
    ) -> list[str]:
        """A CSE block with several targets: temporaries declared ``const``; each target
        declared (rounded to storage if ``rounded``) or, if ``mutable``, assigned."""
        subs = {K.h: sp.Symbol(h, real=True)}
        names = {line.target for line in assigns[-self.k :]} if self.k else set()
        out = []
        for line in assigns:
            value = self.expr(line.expr.xreplace(subs))
            if line.target not in names:
                out.append(f"const {self.dt.compute} {line.target} = {value};")
            elif mutable:
                out.append(f"{line.target} = {value};")
            else:
                value = self.dt.rounded(value) if rounded else value
                out.append(f"const {self.dt.compute} {line.target} = {value};")
        return out

    def state_block(self, array: str, i: int, rows: str = "T") -> str:
        """Start of state ``i``'s block in a [k, rows, N] array."""
        return f"({array} + (long long){i} * {rows} * N)"

    def v_th_line(self) -> str:
        return f"const {self.dt.compute} v_th = {self.expr(self.spec.threshold)};"

    def load(self, ref: str) -> str:
        return self.dt.load.format(ref)

    def store(self, value: str) -> str:
        return self.dt.store.format(value)

    def load_vec(self, var: str, array: str, offset: str = "k") -> str:
        return f"const {self.vec} {var} = *(const {self.vec}*)({array} + {offset});"

    def store_vec(self, var: str, array: str, offset: str = "k") -> str:
        return f"*({self.vec}*)({array} + {offset}) = {var};"

    def fire(self, h: str) -> list[str]:
        """u = h − v_th and the spike s (crossing firing: gated by [V[t−1] < v_th])."""
        ct = self.dt.compute
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

    def lane_state(self) -> list[str]:
        """Per-lane parameters, threshold and initial state in registers."""
        ct = self.dt.compute
        decl = [f"{ct} {c}_l[K];" for c in self.pnames.values()]
        decl += [f"{ct} V_l[K];"]
        body = [f"{c}_l[j] = {c}_ptr[(i0 + j) * {c}_stride];" for c in self.pnames.values()]
        one = self.expr(sp.Float(1.0))
        decl += [f"{ct} {r}_l[K];" for r in self.rcp.values()]
        body += [f"{r}_l[j] = {one}/{p}_l[j];" for p, r in self.rcp.items()]
        start = self.expr(sp.Float(self.spec.v_start))
        body += [f"V_l[j] = v_init ? {self.load('v_init[i0 + j]')} : {start};"]
        for i, init in enumerate(self.spec.state_init):
            decl.append(f"{ct} w{i}_l[K];")
            first = self.load(f"w_init[(long long){i} * N + i0 + j]")
            body.append(f"w{i}_l[j] = w_init ? {first} : {self.expr(sp.Float(init))};")
        return decl + _lane_loop(body)

    def lane_params(self) -> list[str]:
        ct = self.dt.compute
        out = [f"const {ct} {c} = {c}_l[j];" for c in self.pnames.values()]
        out += [f"const {ct} {r} = {r}_l[j];" for r in self.rcp.values()]
        return out + ([] if self.spec.threshold_per_step else [self.v_th_line()])

    def forward(self, store_h: bool, v_mode: str) -> list[str]:
        ct = self.dt.compute
        charge = self.lines(self.spec.charge)
        charge[-1] = f"const {ct} h = {self.dt.rounded(self.expr(self.spec.charge[-1].expr))};"
        states, saved = range(self.k), range(self.kw)
        seq = v_mode == "seq"
        lane = [
            *self.lane_params(),
            f"{ct} V = V_l[j];",
            *[f"{ct} w{i} = w{i}_l[j];" for i in states],
            f"const {ct} X = {self.load('x_v.v[j]')};",
            *charge,
            *([f"h_v.v[j] = {self.store('h')};"] if store_h else []),
            *self.targets(self.spec.updates, mutable=False, rounded=True),
            *([f"wt{i}_v.v[j] = {self.store(f'wt{i}')};" for i in saved] if store_h else []),
            *([self.v_th_line()] if self.spec.threshold_per_step else []),
            *self.fire("h"),
            f"s_v.v[j] = {self.store('s')};",
            *self.lines(self.spec.reset, declare_last=False),
            *self.positive_zero(),
            *self.targets(self.spec.state_resets, mutable=True),
            *([f"v_v.v[j] = {self.store('V')};"] if seq else []),
            *([f"wo{i}_v.v[j] = {self.store(f'w{i}')};" for i in states] if seq else []),
            "V_l[j] = V;",
            *[f"w{i}_l[j] = w{i};" for i in states],
        ]
        outputs = ["s_v", *(["h_v"] if store_h else []), *(["v_v"] if seq else [])]
        outputs += [f"wt{i}_v" for i in saved] if store_h else []
        outputs += [f"wo{i}_v" for i in states] if seq else []
        step = [
            "const long long k = (long long)t * N + i0;",
            self.load_vec("x_v", "x_seq"),
            f"{self.vec} {', '.join(outputs)};",
            *_lane_loop(lane),
            self.store_vec("s_v", "spike_seq"),
            *([self.store_vec("h_v", "h_seq")] if store_h else []),
            *([self.store_vec("v_v", "v_seq")] if seq else []),
            *[self.store_vec(f"wt{i}_v", self.state_block("wt_seq", i)) for i in saved if store_h],
            *[self.store_vec(f"wo{i}_v", self.state_block("w_out", i)) for i in states if seq],
        ]
        last = [f"v_seq[i0 + j] = {self.store('V_l[j]')};"]
        last += [
            f"w_out[(long long){i} * N + i0 + j] = {self.store(f'w{i}_l[j]')};" for i in states
        ]
        return [
            *self.lane_state(),
            f"#pragma unroll {T_UNROLL}",
            "for (int t = 0; t < T; ++t) {",
            *indent(step),
            "}",
            *(_lane_loop(last) if v_mode == "last" else []),
        ]

    def recompute_v(self) -> list[str]:
        """V[t-1] (and each W[t-1]) of this lane: the resets of step t-1, or the initial
        values at t = 0. Step t-1 is recomputed from H[t-1] and W̃[t-1] alone."""
        ct, states = self.dt.compute, range(self.kw)  # W[t-1] only when W̃ is saved
        inner = [
            f"const {ct} h_prev = {self.load('hp_v.v[j]')};",
            *[f"const {ct} wt{i} = {self.load(f'wtp{i}_v.v[j]')};" for i in states],
            *([self.v_th_line()] if self.spec.threshold_per_step else []),
            # crossing firing has no reset: V[t-1] = H[t-1] needs no spike (nor V[t-2])
            *(self.fire("h_prev") if not self.spec.crossing else []),
        ]
        inner += self.lines(self.spec.reset, declare_last=False, h="h_prev")
        inner += self.positive_zero()
        if self.kw:
            inner += self.targets(self.spec.state_resets, mutable=True, h="h_prev")
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

    def grad_in(self, target: str, carry: str, seq: str, last: str, mode: str) -> str:
        """``target`` = the gradient carried from step t+1 plus, by ``mode``, this step's
        from the loss (``seq``: a vector lane, ``last``: read at t = T − 1 only)."""
        extra = {
            "none": "",
            "seq": f" + {self.load(seq)}",
            "last": f" + (t == T - 1 ? {self.load(last)} : 0)",
        }[mode]
        return f"const {self.dt.compute} {target} = {carry}{extra};"

    def grad_v_in(self, mode: str) -> str:
        return self.grad_in(str(K.grad_v), "carry_l[j]", "gv_v.v[j]", "grad_v_seq[i0 + j]", mode)

    def grad_w_in(self, mode: str, i: int) -> str:
        last = f"grad_w_seq[(long long){i} * N + i0 + j]"
        return self.grad_in(f"grad_w{i}", f"carry_w{i}_l[j]", f"gw{i}_v.v[j]", last, mode)

    def carries(self) -> bool:
        """Whether H (and W̃) of step t-1 are loaded each step and carried to the next."""
        return self.spec.needs_v or self.kw > 0

    def backward_loads(self, grad_v_mode: str) -> list[str]:
        spec, vec = self.spec, self.vec
        if self.carries():
            out = [f"{vec} hp_v;", f"if (t > 0) hp_v = *(const {vec}*)(h_seq + k - N);"]
            for i in range(self.kw):
                block = self.state_block("wt_seq", i)
                out += [
                    f"{vec} wtp{i}_v;",
                    f"if (t > 0) wtp{i}_v = *(const {vec}*)({block} + k - N);",
                ]
        else:
            out = [self.load_vec("h_v", "h_seq")]
        if spec.needs_x:
            out.append(self.load_vec("x_v", "x_seq"))
        out += [f"{vec} gs_v;", "if (grad_spike_scalar) {"]
        out += indent(_lane_loop(["gs_v.v[j] = gs_scalar;"]))
        out += ["} else {", f"{INDENT}gs_v = *(const {vec}*)(grad_spike + k);", "}"]
        if grad_v_mode == "seq":
            out.append(self.load_vec("gv_v", "grad_v_seq"))
            for i in range(self.k):
                out.append(self.load_vec(f"gw{i}_v", self.state_block("grad_w_seq", i)))
        return out

    def backward(self, grad_v_mode: str) -> list[str]:
        ct, at, spec = self.dt.compute, self.dt.accum, self.spec
        learn = [self.pnames[n] for n in spec.learnable]
        states = range(self.k)
        lane = [
            *self.lane_params(),
            *(self.recompute_v() if self.needs_prev else []),
            f"const {ct} h = {self.load('h_v.v[j]')};",
            *[f"const {ct} wt{i} = {self.load(f'wt{i}_v.v[j]')};" for i in range(self.kw)],
            *([f"const {ct} X = {self.load('x_v.v[j]')};"] if spec.needs_x else []),
            *([self.v_th_line()] if spec.threshold_per_step else []),
            *self.fire("h"),
            *self.lines(spec.surrogate),
            f"const {ct} {K.grad_s} = {self.load('gs_v.v[j]')};",
            self.grad_v_in(grad_v_mode),
            *[self.grad_w_in(grad_v_mode, i) for i in states],
            *self.lines(spec.backward),
            f"gx_v.v[j] = {self.store(str(grad_symbol('X')))};",
            *[f"acc_{c}[j] += ({at})grad_{c};" for c in learn],
            f"carry_l[j] = {grad_symbol('V')};",
            *[f"carry_w{i}_l[j] = {grad_symbol(f'W{i}')};" for i in states],
        ]
        carried = ["h_v = hp_v;", *[f"wt{i}_v = wtp{i}_v;" for i in range(self.kw)]]
        step = [
            "const long long k = (long long)t * N + i0;",
            *self.backward_loads(grad_v_mode),
            f"{self.vec} gx_v;",
            *_lane_loop(lane),
            self.store_vec("gx_v", "grad_x_seq"),
            *(carried if self.carries() else []),
        ]
        last_row = "(long long)(T - 1) * N + i0"
        first_h = [f"{self.vec} h_v = *(const {self.vec}*)(h_seq + {last_row});"]
        first_h += [
            f"{self.vec} wt{i}_v = "
            f"*(const {self.vec}*)({self.state_block('wt_seq', i)} + {last_row});"
            for i in range(self.kw)
        ]
        init = ["carry_l[j] = 0;", *[f"carry_w{i}_l[j] = 0;" for i in states]]
        init += [f"acc_{c}[j] = 0;" for c in learn]
        final = [f"if (grad_v_init) grad_v_init[i0 + j] = {self.store('carry_l[j]')};"]
        final += [
            f"if (grad_w_init) grad_w_init[(long long){i} * N + i0 + j] = "
            f"{self.store(f'carry_w{i}_l[j]')};"
            for i in states
        ]
        final += [f"grad_{c}_ptr[i0 + j] = acc_{c}[j];" for c in learn]
        return [
            *self.lane_state(),
            f"{ct} carry_l[K];",
            *[f"{ct} carry_w{i}_l[K];" for i in states],
            *[f"{at} acc_{c}[K];" for c in learn],
            *_lane_loop(init),
            f"const {self.dt.storage} gs_scalar = grad_spike_scalar ? grad_spike[0] : 0;",
            *(first_h if self.carries() else []),
            f"#pragma unroll {T_UNROLL}",
            "for (int t = T - 1; t >= 0; --t) {",
            *indent(step),
            "}",
            *_lane_loop(final),
        ]
