"""The kernel calling convention, written once: named arguments, variants, geometry.

Each pass (forward, backward) is one ordered tuple of :class:`Arg` (:data:`FORWARD`,
:data:`BACKWARD`). Everything that depends on the convention is computed from it:

* the C parameter list of every generated kernel (:mod:`symneuron.codegen.skeleton`);
* the packing of a launch's values, by name (:mod:`symneuron.runtime.kernels`);
* the outputs a pass allocates, with their shapes, and the named tuple it returns;
* the custom ops' schemas, their fake outputs and the autograd positions
  (:mod:`symneuron.binding`).

So a new kernel argument is one new entry here. Exported kernel names:

    <name>_forward_<h|n>_<seq|last>_k<K>   store H for backward or not; V every step or last
    <name>_backward_<none|seq|last>_k<K>   which gradient of V (and W) autograd supplies

``K`` is the number of adjacent neurons one thread owns ("lanes"): 1, or the dtype's
vector width (:attr:`symneuron.dtypes.DType.lanes`). This module uses no SymPy.
"""

from __future__ import annotations

import math
import re
from collections import namedtuple
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

__all__ = [
    "Arg",
    "Option",
    "Pass",
    "FORWARD",
    "BACKWARD",
    "RFORWARD",
    "RBACKWARD",
    "GFORWARD",
    "GBACKWARD",
    "PRODUCTS",
    "V_MODES",
    "GRAD_V_MODES",
    "Variant",
    "Geometry",
    "param_cnames",
    "lane_counts",
]

#: How V (and each extra state) is returned: after every step, or only after the last.
V_MODES = ("seq", "last")
#: Which gradient of V (and W) the backward receives: none, one per step, or the last only.
GRAD_V_MODES = ("none", "seq", "last")
_POINTERS = ("storage", "compute", "accum", "int64")


@dataclass(frozen=True)
class Arg:
    """One named kernel argument.

    Attributes
    ----------
    name : the argument's name in Python (and in C unless ``each`` expands it).
    role : ``"storage"``, ``"compute"`` or ``"accum"`` for a pointer to that dtype role
        (:class:`symneuron.dtypes.DType`), ``"int64"`` for a pointer to ``long long``,
        ``"int"`` or ``"long long"`` for a scalar.
    const : a pointer the kernel only reads (an input); a non-const pointer is an output.
    shape : an output's dims by name (``T``, ``N``, ``rows``, ``k``, ``P``).
    when : an output is allocated only when this condition of the call holds (else the
        kernel gets NULL); an input with ``when`` may be None.
    each : ``"param"`` or ``"learnable"``: one C argument per (learnable) parameter,
        named ``cname.format(<param's kernel name>)``.
    derived : the runtime computes the value from the others (sizes, strides, flags);
        callers never pass it.
    scratch : a pointer the kernel writes that the runtime allocates (zeroed) and
        discards: no output, never passed by a caller (with ``derived``).
    states : present only in the kernels of neurons with extra states.
    noise : present only in the kernels of neurons that draw random numbers; the last
        positional op argument, None by default (custom ops take no keyword-only tensor).
    default : the value of an input its callers do not pass (None: they must, or NULL).
    """

    name: str
    role: str
    const: bool = False
    shape: tuple[str, ...] = ()
    when: str | None = None
    each: str | None = None
    cname: str = "{}"
    derived: bool = False
    scratch: bool = False
    states: bool = False
    noise: bool = False
    default: Any = None

    @property
    def pointer(self) -> bool:
        return self.role in _POINTERS

    @property
    def output(self) -> bool:
        return self.pointer and not self.const and not self.scratch

    @property
    def pack(self) -> str:
        """The ``struct`` format character of the value: pointer, int or long long."""
        return "P" if self.pointer else ("i" if self.role == "int" else "q")

    def exists(self, present: dict[str, bool]) -> bool:
        """Whether this argument has a value in a call whose conditions are ``present``
        (``"states"``: the neuron has extra states; each ``when`` name)."""
        return (not self.states or present["states"]) and (self.when is None or present[self.when])

    def c_names(self, cnames: Sequence[str], learn: Sequence[str]) -> list[str]:
        """The C parameter names this argument stands for."""
        if self.each is None:
            return [self.name]
        return [self.cname.format(c) for c in (cnames if self.each == "param" else learn)]


@dataclass(frozen=True)
class Option:
    """One named option of a pass: its values, the type its custom op's schema gives it,
    and the token each value puts into the exported kernel name."""

    name: str
    schema: str
    values: tuple[Any, ...]
    #: the name token of each value, in :attr:`values`' order (default: ``str(value)``)
    tokens: tuple[str, ...] | None = None

    def token(self, value: Any) -> str:
        if self.tokens is None:
            return str(value)
        return self.tokens[self.values.index(value)]


@dataclass(frozen=True, eq=False)
class Pass:
    """One kind of kernel: its arguments in C order and its named options.

    ``kind`` names the printer of its body (:mod:`symneuron.codegen.skeleton` keeps the
    table of printers by kind); ``name`` prefixes its exported kernels (unique). A pass
    with ``rows`` runs one block per batch row of ``F`` neurons, which exchange values
    each step (a connection stage, :mod:`symneuron.codegen.connection`); with ``grid``
    too, a grid of blocks that each own a slice of a row's neurons for many batch rows
    runs the sequence, exchanging the values through global memory and a barrier of
    the whole grid each step.

    The facts derived from the arguments are fields computed once at construction:
    launches read them every call, also inside ``torch.compile`` (Dynamo cannot enter
    the lock of a ``functools.cached_property``).

    Attributes
    ----------
    inputs : what a caller passes, by name: every argument neither derived nor an output.
    defaults : the inputs that have a default, with it.
    outputs : the output pointers, in order.
    returns : the named tuple a pass returns: one field per output, None where absent.
    """

    name: str
    kind: str
    args: tuple[Arg, ...]
    options: tuple[Option, ...]
    rows: bool = False
    grid: bool = False
    inputs: tuple[Arg, ...] = field(init=False)
    defaults: dict[str, Any] = field(init=False)
    outputs: tuple[Arg, ...] = field(init=False)
    returns: type = field(init=False)
    #: existence of each output -> its :meth:`allocator` (made on first use)
    _allocators: dict[tuple[bool, ...], Any] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        inputs = tuple(a for a in self.args if not a.derived and not a.output)
        outputs = tuple(a for a in self.args if a.output)
        derived = {
            "inputs": inputs,
            "defaults": {a.name: a.default for a in inputs if a.default is not None},
            "outputs": outputs,
            "returns": namedtuple(f"{self.name.capitalize()}Outputs", [a.name for a in outputs]),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    def of(self, states: bool, noise: bool = False) -> tuple[Arg, ...]:
        """The arguments of a neuron with (or without) extra states and random draws."""
        return tuple(a for a in self.args if (states or not a.states) and (noise or not a.noise))

    def extended(
        self,
        name: str,
        after: str,
        *new: Arg,
        tail: tuple[Arg, ...] = (),
        rows: bool = True,
        grid: bool = False,
        options: tuple[Option, ...] = (),
    ) -> Pass:
        """This pass with ``new`` arguments inserted after argument ``after``, ``tail``
        appended and ``options`` after its own, named ``name``: a connection's pass is its
        neuron's pass plus the connection's arguments."""
        args = list(self.args)
        at = [a.name for a in args].index(after) + 1
        new_args = (*args[:at], *new, *args[at:], *tail)
        return Pass(name, self.kind, new_args, (*self.options, *options), rows, grid)

    def variant(self, lanes: int = 1, **options: Any) -> Variant:
        """The variant with these option values (by name) and ``lanes``."""
        unknown = set(options) - {o.name for o in self.options}
        if unknown:
            raise ValueError(f"pass {self.name!r} has no options {sorted(unknown)}")
        return Variant(self, tuple(options[o.name] for o in self.options), lanes)

    def variants(self, lanes: int) -> list[Variant]:
        """Every exported kernel of this pass for a dtype of vector width ``lanes``, in
        source order (the lane counts of one option set together)."""
        combos: list[tuple[Any, ...]] = [()]
        for option in self.options:
            combos = [(*c, v) for c in combos for v in option.values]
        return [Variant(self, c, k) for c in combos for k in lane_counts(lanes)]

    def allocate(
        self, like: Any, dims: dict[str, int], present: dict[str, bool], accum: Any
    ) -> Any:
        """The outputs (:attr:`returns`) as new tensors like ``like`` (the pass's [T, N]
        input), ``accum`` the dtype of accumulator rows; None where an output does not
        exist (:meth:`Arg.exists`)."""
        return self.allocator(present)(like, dims, accum)

    def allocator(self, present: dict[str, bool]) -> Callable[[Any, dict[str, int], Any], Any]:
        """:meth:`allocate` for the calls whose conditions are ``present``, as a function
        of ``(like, dims, accum)``: one generated expression that allocates the outputs
        which exist (a loop over the outputs cost as much host time as the allocations).
        Made once per set of existing outputs; the kernels' callers keep it."""
        exists = tuple(a.exists(present) for a in self.outputs)
        found = self._allocators.get(exists)
        if found is None:
            found = self._allocators[exists] = _allocator(self.outputs, exists, self.returns)
        return found


def _allocation(arg: Arg) -> str:
    """The expression that allocates output ``arg`` (``like`` the pass's [T, N] input):
    ``empty_like(like)`` for a [T, N] storage output, else ``new_empty`` with the sizes
    as separate ints (torch parses those faster than a tuple)."""
    if arg.shape == ("T", "N") and arg.role == "storage":
        return "empty_like(like)"
    sizes = ", ".join(f"dims[{d!r}]" for d in arg.shape)
    return f"like.new_empty({sizes}{', dtype=accum' if arg.role == 'accum' else ''})"


def _allocator(outputs: tuple[Arg, ...], exists: tuple[bool, ...], returns: type) -> Any:
    """A function ``(like, dims, accum) -> returns(...)`` that allocates the outputs
    that exist (None for the others), generated as :func:`collections.namedtuple`
    generates its class."""
    items = [_allocation(a) if there else "None" for a, there in zip(outputs, exists, strict=True)]
    source = f"def allocate(like, dims, accum):\n    return new(returns, ({', '.join(items)},))\n"
    namespace: dict[str, Any] = {
        "new": tuple.__new__,
        "returns": returns,
        "empty_like": torch.empty_like,
    }
    exec(source, namespace)  # noqa: S102 (text built above from the signature's names)
    return namespace["allocate"]


def _tensor(name: str, **kw: Any) -> Arg:
    return Arg(name, "storage", const=True, **kw)


def _out(name: str, shape: str, **kw: Any) -> Arg:
    return Arg(name, "storage", shape=tuple(shape.split()), **kw)


def _params() -> Arg:
    return Arg("params", "compute", const=True, each="param", cname="{}_ptr")


def _rng() -> Arg:
    """The generator's state (seed, offset): an int64 [2] tensor on the device, read by
    the kernel (so a captured CUDA graph reads the values of each replay)."""
    return Arg("rng", "int64", const=True, noise=True)


def _strides() -> Arg:
    return Arg("param_strides", "long long", each="param", cname="{}_stride", derived=True)


def _sizes() -> tuple[Arg, Arg]:
    return Arg("T", "int", derived=True), Arg("N", "long long", derived=True)


#: The options of the forward: store H (and W̃) for the backward or not ("h", "n"), and
#: V (and W) every step or the last (:data:`V_MODES`).
FORWARD_OPTIONS = (
    Option("store_h", "bool", (True, False), ("h", "n")),
    Option("v_mode", "str", V_MODES),
)
#: The option of the backward: which gradient of V (and W) autograd supplies.
BACKWARD_OPTIONS = (Option("grad_v_mode", "str", GRAD_V_MODES),)

#: The forward kernels: X in, S (H, W̃ for the backward) and V (W) out.
FORWARD = Pass(
    "forward",
    "forward",
    (
        _tensor("x_seq"),
        _tensor("v_init", when="v_init"),
        _tensor("w_init", when="w_init", states=True),
        _params(),
        _rng(),
        _out("spike_seq", "T N"),
        _out("h_seq", "T N", when="store_h"),
        _out("v_seq", "rows N"),
        _out("wt_seq", "k T N", when="store_wt", states=True),
        _out("w_out", "k rows N", states=True),
        _strides(),
        *_sizes(),
    ),
    FORWARD_OPTIONS,
)

#: The accumulated gradient rows of the learnable parameters: one [N] row each.
_GRAD_PARAMS = Arg(
    "grad_params",
    "accum",
    shape=("P", "N"),
    when="learnable",
    each="learnable",
    cname="grad_{}_ptr",
)

#: The backward kernels: the loss's gradients and what the forward saved in, dL/dX,
#: dL/dV[0] (dL/dW[0]) and one accumulated row per learnable parameter out.
BACKWARD = Pass(
    "backward",
    "backward",
    (
        _tensor("grad_spike"),
        _tensor("grad_v_seq", when="grad_v"),
        _tensor("grad_w_seq", when="grad_v", states=True),
        _tensor("h_seq"),
        _tensor("wt_seq", when="store_wt", states=True),
        _tensor("x_seq", when="needs_x"),
        _tensor("v_init", when="v_init"),
        _tensor("w_init", when="w_init", states=True),
        _params(),
        _rng(),
        _out("grad_x_seq", "T N"),
        _out("grad_v_init", "N", when="v_init"),
        _out("grad_w_init", "k N", when="w_init", states=True),
        _GRAD_PARAMS,
        _strides(),
        Arg("grad_spike_scalar", "int", derived=True),
        *_sizes(),
    ),
    BACKWARD_OPTIONS,
)

#: The neurons of one batch row (N = rows · F) and the connection's delay in steps.
_FEATURES = Arg("F", "long long", derived=True)
_DELAY = Arg("D", "int")

#: The recurrent forward (a connection stage, docs/architecture.md): FORWARD plus the transposed
#: effective weight (row m: what neuron m's spike adds to each neuron of its batch row),
#: the spikes of the D steps before the first ([D, N], oldest first; None: no spike),
#: X_eff for a backward that reads X, the delay D and the neurons per batch row F.
RFORWARD = FORWARD.extended(
    "rforward",
    "x_seq",
    _tensor("weight_t"),
    _tensor("s_init", when="s_init"),
    tail=(_out("xeff_seq", "T N", when="store_x"), _DELAY, _FEATURES),
)
#: The recurrent backward: BACKWARD plus the effective weight, whose transposed product
#: with dL/dX_eff[t+D] adds to dL/dS[t] inside the reverse time loop.
RBACKWARD = BACKWARD.extended("rbackward", "params", _tensor("weight"), tail=(_DELAY, _FEATURES))

#: A grid kernel's working memory in global memory (zeroed by the runtime): its barrier's
#: counter, then the values exchanged each step; the neurons of a row each block owns;
#: the neurons of a row whose values the backward stages at a time (its tile).
_GRID = (
    Arg("scratch", "int64", derived=True, scratch=True),
    Arg("S", "long long", derived=True),
    Arg("TK", "long long", derived=True),
)
#: The recurrent passes as grid kernels: the same arguments plus :data:`_GRID`. The
#: runtime takes them for layers whose weight is too large for one block per row to
#: read each step (:mod:`symneuron.runtime.rows`); the caller sees RFORWARD/RBACKWARD.
#: The grid passes' option: how a block sums the step's product (the forward's s · Rᵀ,
#: the backward's transposed product), by ``fma`` (the forward: a gather over the
#: spiking neurons; the backward: one multiply-add a term, in the compute type) or on
#: tensor cores (``mma``: :mod:`symneuron.codegen.mma`).
PRODUCTS = ("fma", "mma")
GFORWARD = RFORWARD.extended(
    "gforward", "F", tail=_GRID, grid=True, options=(Option("product", "str", PRODUCTS),)
)
GBACKWARD = RBACKWARD.extended(
    "gbackward", "F", tail=_GRID, grid=True, options=(Option("product", "str", PRODUCTS),)
)

#: The built-in passes by name.
PASSES = {p.name: p for p in (FORWARD, BACKWARD, RFORWARD, RBACKWARD, GFORWARD, GBACKWARD)}


def param_cnames(params: Sequence[str]) -> tuple[str, ...]:
    """The kernel-side names of the parameters, in order: ``p<index>_<name>`` (ASCII).

    Parameters are renamed before derivation, so no user name can clash with the step
    map's own symbols (h, s, sg, grad_v, CSE temporaries, ...).
    """
    ascii_names = (name.encode("ascii", "replace").decode() for name in params)
    return tuple(f"p{i}_{re.sub(r'[^0-9A-Za-z_]', '_', a)}" for i, a in enumerate(ascii_names))


class Geometry(NamedTuple):
    """How a variant is launched: blocks, threads per block, shared memory bytes, and
    whether its blocks wait for each other (a cooperative launch: all resident at once)."""

    grid: int
    block: int
    shared: int = 0
    cooperative: bool = False


@dataclass(frozen=True)
class Variant:
    """One exported kernel: its pass, option values (in the pass's option order) and
    lanes. Its name is printed from the pass's name and each option's token."""

    pass_: Pass
    options: tuple[Any, ...]
    lanes: int = 1

    def option(self, name: str) -> Any:
        """The value of option ``name``."""
        names = [o.name for o in self.pass_.options]
        return self.options[names.index(name)]

    @property
    def settings(self) -> dict[str, Any]:
        """The option values by name."""
        return {o.name: v for o, v in zip(self.pass_.options, self.options, strict=True)}

    @property
    def base(self) -> str:
        """The variant's name without the neuron's name and the lane count."""
        tokens = [o.token(v) for o, v in zip(self.pass_.options, self.options, strict=True)]
        return "_".join([self.pass_.name, *tokens])

    def function(self, neuron: str) -> str:
        """The name of the function the variant's kernels share (a template on CUDA)."""
        return f"{neuron}_{self.base}"

    def exported(self, neuron: str) -> str:
        """The exported kernel name."""
        return f"{self.function(neuron)}_k{self.lanes}"

    def geometry(self, n: int, block: int) -> Geometry:
        """One thread per ``lanes`` adjacent neurons of ``n``, ``block`` threads a block."""
        threads = math.ceil(n / self.lanes)
        return Geometry(math.ceil(threads / block), block)


def variants(lanes: int, passes: Sequence[Pass] = (FORWARD, BACKWARD)) -> list[Variant]:
    """Every exported kernel of a source of ``passes`` for a dtype of vector width
    ``lanes``, in source order."""
    return [v for p in passes for v in p.variants(lanes)]


def lane_counts(lanes: int) -> tuple[int, ...]:
    """The lane counts a source exports for a dtype of vector width ``lanes``."""
    return (1, lanes) if lanes > 1 else (1,)
