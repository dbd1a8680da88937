"""KernelSpec -> kernel source: one skeleton, step bodies printed from the spec.

Both dialects (CUDA and C) share this skeleton; a :class:`Dialect` supplies only
the scaffolding (qualifiers, the loop over neurons, helpers) and a
:class:`DTypeInfo` the storage/compute types and their conversions. Each source
holds every variant of the forward and backward kernels for one dtype:

    <name>_forward_<h|n>_<seq|last>   store H for backward or not; V every step or last
    <name>_backward_<none|seq|last>   which gradient of V autograd supplies
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sympy as sp

from ..derive import GRAD_S, GRAD_V, H, Assign, KernelSpec, grad_symbol
from .printer import KernelPrinter

__all__ = ["Dialect", "DTypeInfo", "render", "forward_name", "backward_name", "V_MODES", "GRAD_V_MODES"]

V_MODES = ("seq", "last")
GRAD_V_MODES = ("none", "seq", "last")
_INDENT = "    "


@dataclass(frozen=True)
class DTypeInfo:
    """How one torch dtype is stored, computed and accumulated in a dialect."""

    name: str
    storage: str
    compute: str
    accum: str
    load: str = "{}"
    store: str = "{}"

    def rounded(self, value: str) -> str:
        """``value`` rounded to the storage type and back (identity for float/double)."""
        if self.load == "{}" and self.store == "{}":
            return value
        return self.load.format(self.store.format(value))


@dataclass(frozen=True)
class Dialect:
    """Scaffolding of one target language around the shared step bodies."""

    name: str
    prelude: str
    qualifier: str
    restrict: str
    loop_open: str
    loop_close: str


def forward_name(spec: KernelSpec, store_h: bool, v_mode: str) -> str:
    return f"{spec.name}_forward_{'h' if store_h else 'n'}_{v_mode}"


def backward_name(spec: KernelSpec, grad_v_mode: str) -> str:
    return f"{spec.name}_backward_{grad_v_mode}"


def c_identifier(name: str, index: int) -> str:
    clean = re.sub(r"\W", "_", name.encode("ascii", "replace").decode())
    return f"p{index}_{clean}"


class _Body:
    """Prints the step bodies of one spec for one dtype."""

    def __init__(self, spec: KernelSpec, dtype: DTypeInfo) -> None:
        self.spec = spec
        self.dt = dtype
        self.printer = KernelPrinter(dtype.compute)
        self.pnames = {n: c_identifier(n, i) for i, n in enumerate(spec.params)}
        self.rename: dict[sp.Symbol, sp.Symbol] = {
            spec.param_symbols[n]: sp.Symbol(c, real=True) for n, c in self.pnames.items()
        }
        for n in spec.learnable:
            self.rename[grad_symbol(n)] = sp.Symbol(f"grad_{self.pnames[n]}", real=True)

    def expr(self, e: sp.Expr) -> str:
        return str(self.printer.doprint(sp.sympify(e).xreplace(self.rename)))

    def lines(
        self, assigns: tuple[Assign, ...], declare_last: bool = True, h: str = "h"
    ) -> list[str]:
        subs = {H: sp.Symbol(h, real=True)}
        out = []
        for i, line in enumerate(assigns):
            target = str(line.target.xreplace(self.rename))
            last = i == len(assigns) - 1
            decl = f"const {self.dt.compute} " if (declare_last or not last) else ""
            out.append(f"{decl}{target} = {self.expr(line.expr.xreplace(subs))};")
        return out

    def load(self, ref: str) -> str:
        return self.dt.load.format(ref)

    def store(self, value: str) -> str:
        return self.dt.store.format(value)

    def fire(self, h: str) -> list[str]:
        ct = self.dt.compute
        return [f"const {ct} u = {h} - v_th;", f"const {ct} s = u >= 0 ? 1 : 0;"]

    def prologue(self) -> list[str]:
        ct = self.dt.compute
        out = [f"const {ct} {c} = {c}_ptr[i * {c}_stride];" for c in self.pnames.values()]
        out.append(f"const {ct} v_th = {self.expr(self.spec.threshold)};")
        return out

    def forward(self, store_h: bool, v_mode: str) -> list[str]:
        ct = self.dt.compute
        charge = self.lines(self.spec.charge)
        charge[-1] = f"const {ct} h = {self.dt.rounded(self.expr(self.spec.charge[-1].expr))};"
        step = [
            "const long long k = (long long)t * N + i;",
            f"const {ct} X = {self.load('x_seq[k]')};",
            *charge,
            *([f"h_seq[k] = {self.store('h')};"] if store_h else []),
            *self.fire("h"),
            f"spike_seq[k] = {self.store('s')};",
            *self.lines(self.spec.reset, declare_last=False),
            *([f"v_seq[k] = {self.store('V')};"] if v_mode == "seq" else []),
        ]
        return [
            *self.prologue(),
            f"{ct} V = {self.load('v_init[i]')};",
            "for (int t = 0; t < T; ++t) {",
            *_indent(step),
            "}",
            *([f"v_seq[i] = {self.store('V')};"] if v_mode == "last" else []),
        ]

    def recompute_v(self) -> list[str]:
        ct = self.dt.compute
        inner = [f"h_prev = {self.load('h_seq[k - N]')};", *self.fire("h_prev")]
        inner += self.lines(self.spec.reset, declare_last=False, h="h_prev")
        return [
            f"{ct} V;",
            f"{ct} h_prev = 0;",
            "if (t > 0) {",
            *_indent(inner),
            "} else {",
            f"{_INDENT}V = {self.load('v_init[i]')};",
            "}",
        ]

    def grad_v_in(self, mode: str) -> str:
        extra = {
            "none": "",
            "seq": f" + {self.load('grad_v_seq[k]')}",
            "last": f" + (t == T - 1 ? {self.load('grad_v_seq[i]')} : 0)",
        }[mode]
        return f"const {self.dt.compute} {GRAD_V} = carry{extra};"

    def backward(self, grad_v_mode: str) -> list[str]:
        ct, at, spec = self.dt.compute, self.dt.accum, self.spec
        learn = [self.pnames[n] for n in spec.learnable]
        h_now = [] if spec.needs_v else [f"const {ct} h = {self.load('h_seq[k]')};"]
        step = [
            "const long long k = (long long)t * N + i;",
            *(self.recompute_v() if spec.needs_v else []),
            *h_now,
            *([f"const {ct} X = {self.load('x_seq[k]')};"] if spec.needs_x else []),
            *self.fire("h"),
            *self.lines(spec.surrogate),
            f"const {ct} {GRAD_S} = {self.load('grad_spike[k]')};",
            self.grad_v_in(grad_v_mode),
            *self.lines(spec.backward),
            f"grad_x_seq[k] = {self.store(str(grad_symbol('X')))};",
            *[f"acc_{c} += ({at})grad_{c};" for c in learn],
            f"carry = {grad_symbol('V')};",
            *(["h = h_prev;"] if spec.needs_v else []),
        ]
        first_h = [f"{ct} h = {self.load('h_seq[(long long)(T - 1) * N + i]')};"]
        return [
            *self.prologue(),
            f"{ct} carry = 0;",
            *[f"{at} acc_{c} = 0;" for c in learn],
            *(first_h if spec.needs_v else []),
            "for (int t = T - 1; t >= 0; --t) {",
            *_indent(step),
            "}",
            f"grad_v_init[i] = {self.store('carry')};",
            *[f"grad_{c}_ptr[i] = acc_{c};" for c in learn],
        ]


def _indent(lines: list[str], depth: int = 1) -> list[str]:
    return [_INDENT * depth + line if line else line for line in lines]


def _signature(dialect: Dialect, body: _Body, name: str, tensors: list[tuple[str, str, bool]],
               extra: list[str]) -> str:
    r = dialect.restrict
    args = [f"{'const ' if const else ''}{ctype}* {r} {n}" for ctype, n, const in tensors]
    return f"{dialect.qualifier} void {name}(\n{_INDENT}" + f",\n{_INDENT}".join(args + extra) + ")"


def _param_args(body: _Body) -> list[tuple[str, str, bool]]:
    return [(body.dt.compute, f"{c}_ptr", True) for c in body.pnames.values()]


def _function(dialect: Dialect, signature: str, lines: list[str]) -> str:
    depth = 1 if dialect.loop_close else 0
    inner = [*dialect.loop_open.splitlines(), *_indent(lines, depth), *dialect.loop_close.splitlines()]
    return signature + " {\n" + "\n".join(_indent(inner)) + "\n}\n"


def render_forward(dialect: Dialect, body: _Body, store_h: bool, v_mode: str) -> str:
    st = body.dt.storage
    tensors = [(st, "x_seq", True), (st, "v_init", True), *_param_args(body),
               (st, "spike_seq", False), (st, "h_seq", False), (st, "v_seq", False)]
    strides = [f"long long {c}_stride" for c in body.pnames.values()]
    sig = _signature(dialect, body, forward_name(body.spec, store_h, v_mode), tensors,
                     [*strides, "int T", "long long N"])
    return _function(dialect, sig, body.forward(store_h, v_mode))


def render_backward(dialect: Dialect, body: _Body, grad_v_mode: str) -> str:
    st, at = body.dt.storage, body.dt.accum
    learn = [(at, f"grad_{body.pnames[n]}_ptr", False) for n in body.spec.learnable]
    tensors = [(st, "grad_spike", True), (st, "grad_v_seq", True), (st, "h_seq", True),
               (st, "x_seq", True), (st, "v_init", True), *_param_args(body),
               (st, "grad_x_seq", False), (st, "grad_v_init", False), *learn]
    strides = [f"long long {c}_stride" for c in body.pnames.values()]
    sig = _signature(dialect, body, backward_name(body.spec, grad_v_mode), tensors,
                     [*strides, "int T", "long long N"])
    return _function(dialect, sig, body.backward(grad_v_mode))


def render(spec: KernelSpec, dialect: Dialect, dtype: DTypeInfo) -> str:
    """The whole source file: prelude, then every forward and backward variant."""
    body = _Body(spec, dtype)
    header = (
        f"// symneuron {dialect.name} kernels for {spec.name} ({dtype.name}), key {spec.key}\n"
        f"// H = {spec.charge[-1].expr}\n"
    )
    parts = [header, dialect.prelude]
    for store_h in (True, False):
        for v_mode in V_MODES:
            parts.append(render_forward(dialect, body, store_h, v_mode))
    for mode in GRAD_V_MODES:
        parts.append(render_backward(dialect, body, mode))
    return "\n".join(parts)

