"""A neuron's kernels on one backend: compiled on first use, launched by name.

:func:`program` returns the :class:`Program` of a (definition, backend) pair,
one per process. A program renders, compiles and looks up each kernel variant
the first time it runs (so a first call compiles only what it uses), packs each
launch's values by name in the order of the pass's named arguments
(:mod:`symneuron.signature`), and launches it with the variant's geometry on the
backend of the :data:`BACKENDS` table. It needs no derivation when the cache
(:mod:`symneuron.runtime.cache`) already holds the generated sources: names,
parameter order and state count come from the definition itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NamedTuple

import torch

from .. import derivation, dtypes
from ..codegen import render_source
from ..definition import Definition, find
from ..memo import BoundedTable
from ..signature import BACKWARD, FORWARD, Arg, Geometry, Pass, Variant, param_cnames
from . import Kinds, cache, cpu, cuda, settings

__all__ = ["Backend", "BACKENDS", "Program", "program", "lookup"]


class Backend(NamedTuple):
    """How one backend compiles, loads and launches (see :mod:`~symneuron.runtime.cpu`
    and :mod:`~symneuron.runtime.cuda`)."""

    runtime: ModuleType
    suffix: str  # of generated source files in the cache
    #: one GPU thread per K neurons: the wide variant only with enough threads to fill
    #: the device and 16-byte-aligned tensors (its vector loads); on the CPU K neurons
    #: per loop iteration need neither
    simt: bool


#: backend name -> :class:`Backend`
BACKENDS: dict[str, Backend] = {
    "cpu": Backend(cpu, ".c", simt=False),
    "cuda": Backend(cuda, ".cu", simt=True),
}

Launch = Callable[[Kinds, list[int], Geometry | None], None]


class Layout(NamedTuple):
    """A pass's outputs for one call: dims by name, which exist, the accumulator dtype,
    and the pass's allocator for them (:meth:`~symneuron.signature.Pass.allocator`)."""

    dims: dict[str, int]
    present: dict[str, bool]
    accum: torch.dtype | None
    allocate: Callable[[Any, dict[str, int], Any], Any]

    def outputs(self, like: torch.Tensor) -> Any:
        """The pass's outputs (its named tuple) allocated like ``like``."""
        return self.allocate(like, self.dims, self.accum)


#: a named tuple made without the Python frame of its ``__new__`` (host time)
_new = tuple.__new__


def _is_flag(text: str) -> bool:
    return text in ("0", "1")


def _rows(value: torch.Tensor | None) -> list[int]:
    """Each row's address of an [rows, N] tensor (none for None)."""
    if value is None:
        return []
    row = value.shape[1] * value.element_size()
    return [value.data_ptr() + j * row for j in range(value.shape[0])]


def _address(arg: Arg) -> str:
    """The packed value of pointer ``arg`` (a local of the packer): its address, or NULL
    for None; for an expanded argument, each parameter's address (an input) or each
    row's of the [rows, N] output."""
    name = arg.name
    if arg.each:
        return f"*_rows({name})" if arg.output else f"*map(_data_ptr, {name})"
    return f"(0 if {name} is None else {name}.data_ptr())"


def _packer(pass_: Pass, states: bool, draws: bool) -> Callable[[Any, dict[str, Any]], list[int]]:
    """Packs a pass's values in its arguments' order: ``out`` the outputs (the pass's
    named tuple), ``values`` the others by name (those with a default may be left out);
    pointers as addresses, None as NULL, one entry per parameter for the expanded
    arguments.

    The packer is generated (as :func:`collections.namedtuple` generates its class): a
    launch packs a dozen values, and a loop over the arguments cost more host time than
    the launch itself."""
    lines = [f"    {''.join(f'{a.name}, ' for a in pass_.outputs)}= _out"]
    items = []
    for a in pass_.of(states, draws):
        if not a.output:
            read = f"[{a.name!r}]" if a.default is None else f".get({a.name!r}, {a.default!r})"
            lines.append(f"    {a.name} = _values{read}")
        items.append(_address(a) if a.pointer else f"*{a.name}" if a.each else a.name)
    body = "\n".join(lines)
    source = f"def pack(_out, _values):\n{body}\n    return [{', '.join(items)}]\n"
    namespace: dict[str, Any] = {"_rows": _rows, "_data_ptr": torch.Tensor.data_ptr}
    exec(source, namespace)  # noqa: S102 (text built above from the signature's names)
    return namespace["pack"]


def _aligned(tensors: list[Any]) -> bool:
    """Whether every tensor is 16-byte aligned (a broadcast, all strides 0, and a single
    value are read as one value, not as vectors)."""
    for t in tensors:
        if t is not None and t.numel() > 1 and any(t.stride()) and t.data_ptr() % 16:
            return False
    return True


def _kinds(args: tuple[Arg, ...], counts: dict[str, int]) -> str:
    """The ``struct`` characters of a pass's values (``counts``: values per ``each``)."""
    return "".join(a.pack * (1 if a.each is None else counts[a.each]) for a in args)


class Program:
    """The kernels of ``neuron`` on ``backend``.

    :meth:`forward` and :meth:`backward` take their values by the names of the pass's
    arguments, allocate the outputs and launch one variant each; they return the
    pass's named tuple (:attr:`symneuron.signature.Pass.returns`). The autograd binding
    (:mod:`symneuron.binding`) calls them.
    """

    def __init__(self, neuron: Definition, backend: str) -> None:
        self.neuron = neuron
        self.backend = backend
        self.impl = BACKENDS[backend]
        self.key = neuron.key()
        self.name = neuron.name
        self.k = len(neuron.states)
        params = list(neuron.params)
        self.n_params = len(params)
        self.n_learnable = len(neuron.learnable)
        #: (gradient row, param index) for each learnable param
        self.learnable_rows = tuple(
            (j, params.index(name)) for j, name in enumerate(neuron.learnable)
        )
        #: pass -> what each of its launches reads (:meth:`_pass`), made on first use
        self._passes: dict[Pass, tuple[str, Callable[..., list[int]], tuple[str, ...], Any]] = {}
        self._launchers: dict[tuple[Any, ...], tuple[Variant, Launch]] = {}
        self._flags: dict[str, bool] = {}
        #: which outputs exist, by the call's flags (read-only dicts, made once), and the
        #: pass's allocator for them
        self._present: dict[Any, tuple[dict[str, bool], Any]] = {}
        #: storage dtype -> the dtype of the learnable-parameter gradient rows, and the
        #: dtype's vector width (lanes)
        self._accum: dict[torch.dtype, torch.dtype] = {}
        self._widths: dict[torch.dtype, int] = {}

    def _pass(self, pass_: Pass) -> tuple[str, Callable[..., list[int]], tuple[str, ...], Any]:
        """What each launch of ``pass_`` reads: its values' kinds, its packer, the names
        of its tensor inputs (the first gives the launcher's dtype and device) and which
        outputs are single tensors (both for the alignment check); made once per pass."""
        found = self._passes.get(pass_)
        if found is None:
            found = self._passes[pass_] = self._tables(pass_)
        return found

    def _tables(self, pass_: Pass) -> tuple[str, Callable[..., list[int]], tuple[str, ...], Any]:
        states, draws = bool(self.k), self.neuron.draws
        args = pass_.of(states, draws)
        counts = {"param": self.n_params, "learnable": self.n_learnable}
        tensors = tuple(
            a.name for a in args if a.pointer and not a.each and a.const and not a.noise
        )  # (the generator's state is read as two scalars)
        single = tuple(not a.each for a in pass_.outputs)
        return _kinds(args, counts), _packer(pass_, states, draws), tensors, single

    @property
    def cnames(self) -> tuple[str, ...]:
        return param_cnames(tuple(self.neuron.params))

    def _flag(self, name: str) -> bool:
        """A derived yes/no fact of the backward, cached on disk (no SymPy on a warm start)."""
        found = self._flags.get(name)
        if found is None:

            def make() -> str:
                return str(int(getattr(derivation.derive(self.neuron), name)))

            text = cache.generated((self.key, name), ".txt", make, valid=_is_flag)
            found = self._flags[name] = text == "1"
        return found

    @property
    def needs_x(self) -> bool:
        """Whether the backward reads X (then the forward's caller keeps it)."""
        return self._flag("needs_x")

    @property
    def needs_wt(self) -> bool:
        """Whether the backward reads W̃ (then the training forward saves it)."""
        return self.k > 0 and self._flag("needs_wt")

    # -- compile and launch -------------------------------------------------
    def _launcher(self, variant: Variant, tensor: torch.Tensor) -> Launch:
        """Render, compile and look up ``variant``'s kernel for ``tensor``'s dtype and
        device."""
        device = (tensor.device.index or 0) if tensor.is_cuda else -1
        dtype = dtypes.dtype_name(tensor.dtype)
        name = variant.exported(self.name)

        def make() -> str:
            return render_source(derivation.derive(self.neuron), self.backend, dtype, variant)

        source = cache.generated((self.key, self.backend, dtype, name), self.impl.suffix, make)
        module = self.impl.runtime.load(source, device)
        return self.impl.runtime.launcher(module, name, device)

    def _lanes(self, dtype: torch.dtype, n: int) -> int:
        """Neurons per thread (CUDA) or per loop iteration (C): the dtype's vector width,
        on CUDA only when the neuron count is a multiple of it and the launch has enough
        threads (and the tensors are aligned: :func:`_aligned`), else 1."""
        lanes = self._widths.get(dtype)
        if lanes is None:  # (kept per program: host time)
            lanes = self._widths[dtype] = dtypes.lookup(self.backend, dtype).lanes
        if settings.max_lanes is not None and settings.max_lanes < lanes:
            lanes = 1  # a source exports only 1 and the dtype's width
        if lanes == 1 or not self.impl.simt:  # a C kernel takes any N (its tail one by one)
            return lanes
        if n % lanes or n < lanes * settings.min_vector_threads:
            return 1
        return lanes

    def run(
        self,
        pass_: Pass,
        options: tuple[Any, ...],
        out: Any,
        values: dict[str, Any],
        n: int,
        geometry: Callable[[Variant, torch.Tensor], Geometry] | None = None,
        lanes: int | None = None,
    ) -> None:
        """Launch the variant of ``pass_`` with ``options`` (in the pass's option order)
        over ``n`` neurons, its arguments packed by name from the outputs ``out`` and the
        other ``values``. ``geometry`` gives a GPU launch's blocks (default: one thread per
        ``lanes`` neurons, :meth:`~symneuron.signature.Variant.geometry`), ``lanes`` the
        neurons per thread (default: the widest the call allows, :meth:`_lanes`)."""
        kinds, pack, names, single = self._passes.get(pass_) or self._pass(pass_)
        first = values[names[0]]
        if lanes is None:
            lanes = self._lanes(first.dtype, n)
            if lanes > 1 and self.impl.simt:  # the wide variant's vector loads need alignment
                tensors = [values.get(name) for name in names]
                tensors += [t for t, one in zip(out, single, strict=True) if one]
                lanes = lanes if _aligned(tensors) else 1
        variant, launch = self.launcher(pass_, options, first, lanes)
        blocks = None
        if self.impl.simt:
            blocks = (
                geometry(variant, first) if geometry else variant.geometry(n, settings.cuda_block)
            )
        launch(kinds, pack(out, values), blocks)

    def launcher(
        self, pass_: Pass, options: tuple[Any, ...], first: torch.Tensor, lanes: int
    ) -> tuple[Variant, Launch]:
        """The variant of ``pass_`` with ``options`` and ``lanes`` and its launch for the
        dtype and device of ``first`` (the pass's first tensor input): rendered, compiled
        and looked up on first use, then kept per program."""
        lkey = (first.dtype, first.device, pass_.name, options, lanes)  # a tuple: host time
        found = self._launchers.get(lkey)
        if found is None:
            variant = Variant(pass_, options, lanes)
            launch = self._launcher(variant, first)
            found = self._launchers[lkey] = (variant, launch)
        return found

    def check_params(self, params: Sequence[torch.Tensor]) -> list[int]:
        """The params' strides (0 for a 0-dim tensor), after checking their count."""
        if len(params) != self.n_params:
            raise ValueError(f"{self.name} takes {self.n_params} params, got {len(params)}")
        return [p.stride(0) if p.dim() else 0 for p in params]

    # -- the two passes -----------------------------------------------------
    def forward_layout(
        self, x_seq: torch.Tensor, store_h: bool, v_mode: str, pass_: Pass = FORWARD
    ) -> Layout:
        """The forward's output dims and which outputs exist (also for fake tensors), as
        ``pass_`` (a forward pass; a connection's stores X_eff too when the backward
        reads X) allocates them."""
        t_len, n = x_seq.shape
        rows = t_len if v_mode == "seq" else 1
        dims = {"T": t_len, "N": n, "rows": rows, "k": self.k}
        pkey = (pass_, store_h)
        found = self._present.get(pkey)
        if found is None:  # (one dict per flag, made once: host time)
            present = {"states": self.k > 0, "store_h": store_h}
            present["store_wt"] = store_h and self.needs_wt
            present["store_x"] = store_h and self.needs_x
            found = self._present[pkey] = (present, pass_.allocator(present))
        return _new(Layout, (dims, found[0], None, found[1]))

    def backward_layout(
        self,
        h_seq: torch.Tensor,
        v_init: torch.Tensor | None,
        w_init: torch.Tensor | None,
        pass_: Pass = BACKWARD,
    ) -> Layout:
        """The backward's output dims, which outputs exist and the accumulator dtype, as
        ``pass_`` (a backward pass) allocates them."""
        dims = {"T": h_seq.shape[0], "N": h_seq.shape[1], "k": self.k, "P": self.n_learnable}
        pkey = (pass_, v_init is not None, w_init is not None)
        found = self._present.get(pkey)
        if found is None:
            present = {"states": self.k > 0, "v_init": pkey[1], "w_init": pkey[2]}
            present["learnable"] = self.n_learnable > 0
            found = self._present[pkey] = (present, pass_.allocator(present))
        accum = self._accum.get(h_seq.dtype)
        if accum is None:
            accum = self._accum[h_seq.dtype] = dtypes.lookup(self.backend, h_seq.dtype).torch_accum
        return _new(Layout, (dims, found[0], accum, found[1]))

    def forward(
        self,
        x_seq: torch.Tensor,
        v_init: torch.Tensor | None,
        w_init: torch.Tensor | None,
        params: Sequence[torch.Tensor],
        store_h: bool,
        v_mode: str,
        **extra: Any,
    ) -> Any:
        """Forward over ``x_seq`` [T, N]: :data:`~symneuron.signature.FORWARD`'s outputs
        (spike_seq, h_seq [T, N], v_seq [T or 1, N], wt_seq [k, T, N], w_out
        [k, T or 1, N]), None for H and W̃ when not stored (W̃ is stored only when the
        backward reads it: :attr:`needs_wt`) and for the state outputs of a neuron
        without extra states. ``params`` are [N] tensors (stride 0 for a scalar) or
        0-dim tensors in the compute dtype; ``v_init=None`` / ``w_init=None`` start from
        v_reset / each state's init without a tensor."""
        t_len, n = x_seq.shape
        out = self.forward_layout(x_seq, store_h, v_mode).outputs(x_seq)
        if n == 0:
            return out
        values = {
            "x_seq": x_seq,
            "v_init": v_init,
            "w_init": w_init,
            "params": params,
            "param_strides": self.check_params(params),
            "T": t_len,
            "N": n,
            **extra,
        }
        self.run(FORWARD, (store_h, v_mode), out, values, n)
        return out

    def backward(
        self,
        grad_spike: torch.Tensor,
        grad_v_seq: torch.Tensor | None,
        grad_w_seq: torch.Tensor | None,
        h_seq: torch.Tensor,
        wt_seq: torch.Tensor | None,
        x_seq: torch.Tensor | None,
        v_init: torch.Tensor | None,
        w_init: torch.Tensor | None,
        params: Sequence[torch.Tensor],
        grad_v_mode: str,
        **extra: Any,
    ) -> Any:
        """Backward through time: :data:`~symneuron.signature.BACKWARD`'s outputs
        (grad_x_seq [T, N], grad_v_init [N], grad_w_init [k, N], grad_params [P, N] in
        the accumulator dtype), None for the initial-state gradients of absent initial
        states and when no param is learnable. ``grad_v_seq`` and ``grad_w_seq`` are
        given in ``grad_v_mode`` "seq" or "last", None in "none"; a ``grad_spike`` with
        all strides 0 is read as one scalar."""
        t_len, n = h_seq.shape
        out = self.backward_layout(h_seq, v_init, w_init).outputs(h_seq)
        if n == 0:
            return out
        scalar = grad_spike.numel() > 1 and not any(grad_spike.stride())
        values = {
            "grad_spike": grad_spike,
            "grad_v_seq": grad_v_seq,
            "grad_w_seq": grad_w_seq,
            "h_seq": h_seq,
            "wt_seq": wt_seq,
            "x_seq": x_seq,
            "v_init": v_init,
            "w_init": w_init,
            "params": params,
            "param_strides": self.check_params(params),
            "grad_spike_scalar": int(scalar),
            "T": t_len,
            "N": n,
            **extra,
        }
        self.run(BACKWARD, (grad_v_mode,), out, values, n)
        return out


#: (neuron key, backend) -> Program; the least recently used are forgotten (a forgotten
#: program is made again on its next use, its kernels loaded from the tables below it)
_PROGRAMS: BoundedTable[tuple[str, str], Program] = BoundedTable(256, "runtime.programs")


def program(neuron: Definition, backend: str) -> Program:
    """The process's :class:`Program` of ``neuron`` on ``backend`` (created on first use)."""
    pkey = (neuron.key(), backend)
    found = _PROGRAMS.get(pkey)
    if found is None:
        if backend not in BACKENDS:
            raise ValueError(f"No kernels for backend {backend!r}; use one of {sorted(BACKENDS)}")
        found = _PROGRAMS.put(pkey, Program(neuron, backend))
    return found


def lookup(key: str, backend: str) -> Program:
    """The program of the live neuron whose key is ``key`` (how the custom ops, which
    take only plain arguments, find their kernels)."""
    found = _PROGRAMS.get((key, backend))
    if found is not None:
        return found
    neuron = find(key)
    if neuron is None:
        raise RuntimeError(
            f"symneuron: no live neuron has key {key!r}; keep the neuron (or its layer) "
            "alive while its ops run."
        )
    return program(neuron, backend)
