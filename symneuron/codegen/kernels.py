"""KernelSpec -> kernel source: one skeleton, step bodies printed from the spec.

Both dialects (CUDA and C) share this skeleton; a :class:`Dialect` supplies only
the scaffolding (qualifiers, the loop over neurons, vector types, helpers) and
a :class:`DTypeInfo` the storage/compute types and their conversions.

A thread owns ``K`` adjacent neurons ("lanes"): at each step it loads and
stores ``K`` values as one vector (16 bytes on CUDA), then runs the step body
once per lane from registers. The C dialect uses ``K = 1``. Each source holds
every variant of the forward and backward kernels for one dtype:

    <name>_forward_<h|n>_<seq|last>_k<K>   store H for backward or not; V every step or last
    <name>_backward_<none|seq|last>_k<K>   which gradient of V autograd supplies
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from ..derive import GRAD_S, GRAD_V, Assign, H, KernelSpec, grad_symbol
from .printer import KernelPrinter

__all__ = [
    "Dialect",
    "DTypeInfo",
    "render",
    "forward_name",
    "backward_name",
    "V_MODES",
    "GRAD_V_MODES",
]

#: Unroll factor of the loop over t: lets the compiler issue later steps' loads early.
T_UNROLL = "(K == 1 ? 8 : 4)"
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
    lanes: int = 1

    def rounded(self, value: str) -> str:
        """``value`` rounded to the storage type and back (identity for float/double)."""
        if self.load == "{}" and self.store == "{}":
            return value
        return self.load.format(self.store.format(value))


@dataclass(frozen=True)
class Dialect:
    """Scaffolding of one target language around the shared step bodies.

    ``vector`` names the K-lane vector type of a storage type (``{st}``);
    ``template`` says whether the lane count K is a C++ template parameter
    (several exported kernels) or fixed at 1 by the prelude.
    """

    name: str
    prelude: str
    restrict: str
    vector: str
    loop_open: str
    loop_close: str
    template: bool


def _forward_base(name: str, store_h: bool, v_mode: str) -> str:
    return f"{name}_forward_{'h' if store_h else 'n'}_{v_mode}"


def _backward_base(name: str, grad_v_mode: str) -> str:
    return f"{name}_backward_{grad_v_mode}"


def _exported(base: str, lanes: int) -> str:
    return f"{base}_k{lanes}"


def _lane_counts(dtype: DTypeInfo) -> tuple[int, ...]:
    return (1, dtype.lanes) if dtype.lanes > 1 else (1,)


def forward_name(name: str, store_h: bool, v_mode: str, lanes: int) -> str:
    """Exported name of a forward kernel of the neuron called ``name`` (``spec.name``)."""
    return _exported(_forward_base(name, store_h, v_mode), lanes)


def backward_name(name: str, grad_v_mode: str, lanes: int) -> str:
    """Exported name of a backward kernel of the neuron called ``name`` (``spec.name``)."""
    return _exported(_backward_base(name, grad_v_mode), lanes)


def _indent(lines: list[str], depth: int = 1) -> list[str]:
    return [_INDENT * depth + line if line else line for line in lines]


def _lane_loop(lines: list[str]) -> list[str]:
    return ["#pragma unroll", "for (int j = 0; j < K; ++j) {", *_indent(lines), "}"]


class _Body:
    """Prints the step bodies of one spec for one dtype and dialect."""

    def __init__(self, spec: KernelSpec, dtype: DTypeInfo, dialect: Dialect) -> None:
        self.spec = spec
        self.dt = dtype
        self.dialect = dialect
        self.printer = KernelPrinter(dtype.compute)
        self.pnames = dict(spec.param_cnames)
        self.k = len(spec.states)
        self.needs_prev = spec.needs_v or spec.needs_w

    @property
    def vec(self) -> str:
        return self.dialect.vector.format(st=self.dt.storage)

    def expr(self, e: sp.Expr) -> str:
        return str(self.printer.doprint(sp.sympify(e)))

    def lines(
        self, assigns: tuple[Assign, ...], declare_last: bool = True, h: str = "h"
    ) -> list[str]:
        subs = {H: sp.Symbol(h, real=True)}
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
        subs = {H: sp.Symbol(h, real=True)}
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
        ct = self.dt.compute
        return [f"const {ct} u = {h} - v_th;", f"const {ct} s = u >= 0 ? 1 : 0;"]

    def lane_state(self) -> list[str]:
        """Per-lane parameters, threshold and initial state in registers."""
        ct = self.dt.compute
        decl = [f"{ct} {c}_l[K];" for c in self.pnames.values()]
        decl += [f"{ct} V_l[K];"]
        body = [f"{c}_l[j] = {c}_ptr[(i0 + j) * {c}_stride];" for c in self.pnames.values()]
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
        return out + ([] if self.spec.threshold_per_step else [self.v_th_line()])

    def forward(self, store_h: bool, v_mode: str) -> list[str]:
        ct = self.dt.compute
        charge = self.lines(self.spec.charge)
        charge[-1] = f"const {ct} h = {self.dt.rounded(self.expr(self.spec.charge[-1].expr))};"
        states = range(self.k)
        seq = v_mode == "seq"
        lane = [
            *self.lane_params(),
            f"{ct} V = V_l[j];",
            *[f"{ct} w{i} = w{i}_l[j];" for i in states],
            f"const {ct} X = {self.load('x_v.v[j]')};",
            *charge,
            *([f"h_v.v[j] = {self.store('h')};"] if store_h else []),
            *self.targets(self.spec.updates, mutable=False, rounded=True),
            *([f"wt{i}_v.v[j] = {self.store(f'wt{i}')};" for i in states] if store_h else []),
            *([self.v_th_line()] if self.spec.threshold_per_step else []),
            *self.fire("h"),
            f"s_v.v[j] = {self.store('s')};",
            *self.lines(self.spec.reset, declare_last=False),
            *self.targets(self.spec.state_resets, mutable=True),
            *([f"v_v.v[j] = {self.store('V')};"] if seq else []),
            *([f"wo{i}_v.v[j] = {self.store(f'w{i}')};" for i in states] if seq else []),
            "V_l[j] = V;",
            *[f"w{i}_l[j] = w{i};" for i in states],
        ]
        outputs = ["s_v", *(["h_v"] if store_h else []), *(["v_v"] if seq else [])]
        outputs += [f"wt{i}_v" for i in states] if store_h else []
        outputs += [f"wo{i}_v" for i in states] if seq else []
        step = [
            "const long long k = (long long)t * N + i0;",
            self.load_vec("x_v", "x_seq"),
            f"{self.vec} {', '.join(outputs)};",
            *_lane_loop(lane),
            self.store_vec("s_v", "spike_seq"),
            *([self.store_vec("h_v", "h_seq")] if store_h else []),
            *([self.store_vec("v_v", "v_seq")] if seq else []),
            *[self.store_vec(f"wt{i}_v", self.state_block("wt_seq", i)) for i in states if store_h],
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
            *_indent(step),
            "}",
            *(_lane_loop(last) if v_mode == "last" else []),
        ]

    def recompute_v(self) -> list[str]:
        """V[t-1] (and each W[t-1]) of this lane: the resets of step t-1, or the initial
        values at t = 0. Step t-1 is recomputed from H[t-1] and W̃[t-1] alone."""
        ct, states = self.dt.compute, range(self.k)
        inner = [
            f"const {ct} h_prev = {self.load('hp_v.v[j]')};",
            *[f"const {ct} wt{i} = {self.load(f'wtp{i}_v.v[j]')};" for i in states],
            *([self.v_th_line()] if self.spec.threshold_per_step else []),
            *self.fire("h_prev"),
        ]
        inner += self.lines(self.spec.reset, declare_last=False, h="h_prev")
        inner += self.targets(self.spec.state_resets, mutable=True, h="h_prev")
        return [
            f"{ct} V;",
            *[f"{ct} w{i};" for i in states],
            "if (t > 0) {",
            *_indent(inner),
            "} else {",
            f"{_INDENT}V = V_l[j];",
            *[f"{_INDENT}w{i} = w{i}_l[j];" for i in states],
            "}",
        ]

    def grad_v_in(self, mode: str) -> str:
        extra = {
            "none": "",
            "seq": f" + {self.load('gv_v.v[j]')}",
            "last": f" + (t == T - 1 ? {self.load('grad_v_seq[i0 + j]')} : 0)",
        }[mode]
        return f"const {self.dt.compute} {GRAD_V} = carry_l[j]{extra};"

    def grad_w_in(self, mode: str, i: int) -> str:
        last = self.load(f"grad_w_seq[(long long){i} * N + i0 + j]")
        extra = {
            "none": "",
            "seq": f" + {self.load(f'gw{i}_v.v[j]')}",
            "last": f" + (t == T - 1 ? {last} : 0)",
        }[mode]
        return f"const {self.dt.compute} grad_w{i} = carry_w{i}_l[j]{extra};"

    def carries(self) -> bool:
        """Whether H (and W̃) of step t-1 are loaded each step and carried to the next."""
        return self.spec.needs_v or self.k > 0

    def backward_loads(self, grad_v_mode: str) -> list[str]:
        spec, vec = self.spec, self.vec
        if self.carries():
            out = [f"{vec} hp_v;", f"if (t > 0) hp_v = *(const {vec}*)(h_seq + k - N);"]
            for i in range(self.k):
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
        out += _indent(_lane_loop(["gs_v.v[j] = gs_scalar;"]))
        out += ["} else {", f"{_INDENT}gs_v = *(const {vec}*)(grad_spike + k);", "}"]
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
            *[f"const {ct} wt{i} = {self.load(f'wt{i}_v.v[j]')};" for i in states],
            *([f"const {ct} X = {self.load('x_v.v[j]')};"] if spec.needs_x else []),
            *([self.v_th_line()] if spec.threshold_per_step else []),
            *self.fire("h"),
            *self.lines(spec.surrogate),
            f"const {ct} {GRAD_S} = {self.load('gs_v.v[j]')};",
            self.grad_v_in(grad_v_mode),
            *[self.grad_w_in(grad_v_mode, i) for i in states],
            *self.lines(spec.backward),
            f"gx_v.v[j] = {self.store(str(grad_symbol('X')))};",
            *[f"acc_{c}[j] += ({at})grad_{c};" for c in learn],
            f"carry_l[j] = {grad_symbol('V')};",
            *[f"carry_w{i}_l[j] = {grad_symbol(f'W{i}')};" for i in states],
        ]
        carried = ["h_v = hp_v;", *[f"wt{i}_v = wtp{i}_v;" for i in states]]
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
            for i in states
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
            *_indent(step),
            "}",
            *_lane_loop(final),
        ]


def _params(body: _Body) -> list[tuple[str, str, bool]]:
    return [(body.dt.compute, f"{c}_ptr", True) for c in body.pnames.values()]


def _strides(body: _Body) -> list[str]:
    return [f"long long {c}_stride" for c in body.pnames.values()]


def _forward_args(body: _Body) -> list[str]:
    st = body.dt.storage
    states = [(st, "w_init", True)] if body.k else []
    state_out = [(st, "wt_seq", False), (st, "w_out", False)] if body.k else []
    tensors = [
        (st, "x_seq", True),
        (st, "v_init", True),
        *states,
        *_params(body),
        (st, "spike_seq", False),
        (st, "h_seq", False),
        (st, "v_seq", False),
        *state_out,
    ]
    return _pointer_args(body, tensors) + [*_strides(body), "int T", "long long N"]


def _backward_args(body: _Body) -> list[str]:
    st, at = body.dt.storage, body.dt.accum
    learn = [(at, f"grad_{body.pnames[n]}_ptr", False) for n in body.spec.learnable]
    k = body.k
    tensors = [
        (st, "grad_spike", True),
        (st, "grad_v_seq", True),
        *([(st, "grad_w_seq", True)] if k else []),
        (st, "h_seq", True),
        *([(st, "wt_seq", True)] if k else []),
        (st, "x_seq", True),
        (st, "v_init", True),
        *([(st, "w_init", True)] if k else []),
        *_params(body),
        (st, "grad_x_seq", False),
        (st, "grad_v_init", False),
        *([(st, "grad_w_init", False)] if k else []),
        *learn,
    ]
    extra = [*_strides(body), "int grad_spike_scalar", "int T", "long long N"]
    return _pointer_args(body, tensors) + extra


def _pointer_args(body: _Body, tensors: list[tuple[str, str, bool]]) -> list[str]:
    r = body.dialect.restrict
    return [f"{'const ' if const else ''}{ctype}* {r} {n}" for ctype, n, const in tensors]


def _arg_names(args: list[str]) -> list[str]:
    return [a.split()[-1] for a in args]


def _function(
    dialect: Dialect, name: str, args: list[str], lines: list[str], lanes: tuple[int, ...]
) -> str:
    """The body as exported kernels, one per lane count (a template on CUDA)."""
    joined = f",\n{_INDENT}".join(args)
    inner = [
        *dialect.loop_open.splitlines(),
        *_indent(lines, 1 if dialect.loop_close else 0),
        *dialect.loop_close.splitlines(),
    ]
    text = "\n".join(_indent(inner))
    if not dialect.template:
        return f"void {_exported(name, 1)}(\n{_INDENT}{joined}) {{\n{text}\n}}\n"
    call = ", ".join(_arg_names(args))
    out = [
        "template <int K>\n"
        f"__device__ __forceinline__ void {name}(\n{_INDENT}{joined}) {{\n{text}\n}}\n"
    ]
    for k in lanes:
        out.append(
            f'extern "C" __global__ void {_exported(name, k)}(\n{_INDENT}{joined}) {{\n'
            f"{_INDENT}{name}<{k}>({call});\n}}\n"
        )
    return "\n".join(out)


def kernel_names(spec: KernelSpec, dtype: DTypeInfo) -> list[str]:
    """Every exported kernel of a source, in source order."""
    lanes = _lane_counts(dtype)
    name = spec.name
    names = [forward_name(name, h, m, k) for h in (True, False) for m in V_MODES for k in lanes]
    return names + [backward_name(name, m, k) for m in GRAD_V_MODES for k in lanes]


def render(spec: KernelSpec, dialect: Dialect, dtype: DTypeInfo, only: str | None = None) -> str:
    """The source file: prelude, then every forward and backward variant.

    With ``only`` (an exported kernel name), the source holds just that kernel,
    so a first call compiles only what it runs.
    """
    body = _Body(spec, dtype, dialect)
    all_lanes = _lane_counts(dtype)
    header = (
        f"// symneuron {dialect.name} kernels for {spec.name} ({dtype.name}), key {spec.key}\n"
        f"// H = {spec.charge[-1].expr}\n"
    )
    parts = [header, dialect.prelude.replace("{st}", dtype.storage)]
    for store_h in (True, False):
        for v_mode in V_MODES:
            name = _forward_base(spec.name, store_h, v_mode)
            lanes = _selected(name, all_lanes, only)
            if lanes:
                parts.append(
                    _function(
                        dialect, name, _forward_args(body), body.forward(store_h, v_mode), lanes
                    )
                )
    for mode in GRAD_V_MODES:
        name = _backward_base(spec.name, mode)
        lanes = _selected(name, all_lanes, only)
        if lanes:
            parts.append(_function(dialect, name, _backward_args(body), body.backward(mode), lanes))
    if len(parts) == 2:
        raise ValueError(f"No kernel named {only!r}; kernels are {kernel_names(spec, dtype)}")
    return "\n".join(parts)


def _selected(base: str, lanes: tuple[int, ...], only: str | None) -> tuple[int, ...]:
    if only is None:
        return lanes
    return tuple(k for k in lanes if _exported(base, k) == only)
