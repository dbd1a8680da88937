"""A neuron's kernels on one backend: compiled on first use, launched by name.

:func:`program` returns the :class:`Program` of a (definition, backend) pair,
one per process. A program renders, compiles and looks up each kernel variant
the first time it runs (so a first call compiles only what it uses), packs each
launch's arguments from the one signature in :mod:`symneuron.codegen.signature`
by name, and launches on the backend of the :data:`BACKENDS` table. It needs no
derivation when the cache (:mod:`symneuron.runtime.cache`) already holds the
generated sources: names, parameter order and state count come from the
definition itself.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NamedTuple

import torch

from .. import derivation, dtypes
from ..codegen import render_source
from ..codegen.signature import Arg, backward_args, backward_name, forward_args, forward_name
from ..definition import Definition, find
from . import Packed, cache, cpu, cuda, settings

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

Launch = Callable[[list[Packed], int], None]


def _is_flag(text: str) -> bool:
    return text in ("0", "1")


def _ptr(value: torch.Tensor | None) -> int:
    """A pointer argument: a tensor's address, or NULL for None."""
    return 0 if value is None else value.data_ptr()


#: The arguments each pass fills itself, in the order it lists their values; the
#: params' pointers and strides follow (then, in the backward, the gradient rows).
_FORWARD_SLOTS = (
    "x_seq", "v_init", "w_init", "spike_seq", "h_seq", "v_seq", "wt_seq", "w_out", "T", "N",
)  # fmt: skip
_BACKWARD_SLOTS = (
    "grad_spike", "grad_v_seq", "grad_w_seq", "h_seq", "wt_seq", "x_seq", "v_init",
    "w_init", "grad_x_seq", "grad_v_init", "grad_w_init", "grad_spike_scalar", "T", "N",
)  # fmt: skip


class _Plan(NamedTuple):
    """A signature computed once: its struct formats, and a getter that picks the
    argument values in signature order out of the pass's slot values."""

    packs: tuple[str, ...]
    pick: Callable[[Sequence[Any]], tuple[Any, ...]]


def _plan(signature: tuple[Arg, ...], slots: Sequence[str]) -> _Plan:
    index = {name: i for i, name in enumerate(slots)}
    order = [index[a.name] for a in signature]
    return _Plan(tuple(a.pack for a in signature), operator.itemgetter(*order))


class Program:
    """The kernels of ``neuron`` on ``backend``.

    :meth:`forward` and :meth:`backward` allocate the outputs and launch one
    variant each; the autograd binding (:mod:`symneuron.binding`) calls them.
    """

    def __init__(self, neuron: Definition, backend: str) -> None:
        self.neuron = neuron
        self.backend = backend
        self.impl = BACKENDS[backend]
        self.key = neuron.key()
        self.name = neuron.name
        self.k = len(neuron.states)
        params = list(neuron.params)
        cnames = tuple(derivation.c_identifier(n, i) for i, n in enumerate(params))
        learn = tuple(cnames[params.index(n)] for n in neuron.learnable)
        self.n_learnable = len(learn)
        #: (gradient row, param index) for each learnable param
        self.learnable_rows = tuple(
            (j, params.index(name)) for j, name in enumerate(neuron.learnable)
        )
        self.n_params = len(params)
        ptrs, strides = [f"{c}_ptr" for c in cnames], [f"{c}_stride" for c in cnames]
        grads = [f"grad_{c}_ptr" for c in learn]
        #: each signature as struct formats and a getter of its values in order
        self._forward_plan = _plan(forward_args(cnames, self.k), (*_FORWARD_SLOTS, *ptrs, *strides))
        self._backward_plan = _plan(
            backward_args(cnames, learn, self.k), (*_BACKWARD_SLOTS, *ptrs, *strides, *grads)
        )
        self._launchers: dict[tuple[Any, ...], Launch] = {}
        self._flags: dict[str, bool] = {}

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
    def _launcher(self, name: str, tensor: torch.Tensor) -> Launch:
        """Render, compile and look up kernel ``name`` for ``tensor``'s dtype and device."""
        device = (tensor.device.index or 0) if tensor.is_cuda else -1
        dtype = dtypes.dtype_name(tensor.dtype)

        def make() -> str:
            return render_source(derivation.derive(self.neuron), self.backend, dtype, name)

        source = cache.generated((self.key, self.backend, dtype, name), self.impl.suffix, make)
        module = self.impl.runtime.load(source, device)
        return self.impl.runtime.launcher(module, name, device)

    def _lanes(self, tensors: Sequence[torch.Tensor | None], n: int) -> int:
        """Neurons per thread (CUDA) or per loop iteration (C): the dtype's vector width,
        on CUDA only when the neuron count is a multiple of it, the launch has enough
        threads and the tensors are 16-byte aligned, else 1."""
        lanes = dtypes.lookup(self.backend, tensors[0].dtype).lanes  # type: ignore[union-attr]
        if settings.max_lanes is not None and settings.max_lanes < lanes:
            lanes = 1  # a source exports only 1 and the dtype's width
        if lanes == 1 or not self.impl.simt:  # a C kernel takes any N (its tail one by one)
            return lanes
        if n % lanes or n < lanes * settings.min_vector_threads:
            return 1
        if any(t is not None and t.numel() > 1 and t.data_ptr() % 16 for t in tensors):
            return 1
        return lanes

    def _launch(
        self,
        variant: tuple[Any, ...],
        plan: _Plan,
        slots: list[Any],
        tensors: Sequence[torch.Tensor | None],
        n: int,
    ) -> None:
        """Pack ``slots`` (the pass's argument values, pointers as addresses) in the
        signature's order and launch ``variant`` over ``n`` neurons:
        ``("forward", store_h, v_mode)`` or ``("backward", grad_v_mode)``."""
        first = tensors[0]
        assert first is not None
        lanes = self._lanes(tensors, n)
        lkey = (first.dtype, first.device, variant, lanes)
        launch = self._launchers.get(lkey)
        if launch is None:
            if variant[0] == "forward":
                name = forward_name(self.name, variant[1], variant[2], lanes)
            else:
                name = backward_name(self.name, variant[1], lanes)
            launch = self._launchers[lkey] = self._launcher(name, first)
        launch(list(zip(plan.packs, plan.pick(slots), strict=True)), n // lanes)

    def _param_slots(self, slots: list[Any], params: Sequence[torch.Tensor]) -> None:
        """Append the params' pointers, then their strides (0 for a 0-dim tensor)."""
        if len(params) != self.n_params:
            raise ValueError(f"{self.name} takes {self.n_params} params, got {len(params)}")
        slots += [p.data_ptr() for p in params]
        slots += [p.stride(0) if p.dim() else 0 for p in params]

    # -- the two passes -----------------------------------------------------
    def forward(
        self,
        x_seq: torch.Tensor,
        v_init: torch.Tensor | None,
        w_init: torch.Tensor | None,
        params: Sequence[torch.Tensor],
        store_h: bool,
        v_mode: str,
    ) -> tuple[torch.Tensor, torch.Tensor, Any, Any, Any]:
        """Forward over ``x_seq`` [T, N]: (spike_seq, v_out [T or 1, N], h_seq [T, N],
        w_out [k, T or 1, N], wt_seq [k, T, N]), with None for H and W̃ when not stored
        (W̃ is stored only when the backward reads it: :attr:`needs_wt`) and for the state
        outputs of a neuron without extra states. ``params`` are [N]
        tensors (stride 0 for a scalar) or 0-dim tensors in the compute dtype;
        ``v_init=None`` / ``w_init=None`` start from v_reset / each state's init without a
        tensor."""
        k = self.k
        t_len, n = x_seq.shape
        rows = t_len if v_mode == "seq" else 1
        spike = torch.empty_like(x_seq)
        v_out = x_seq.new_empty((rows, n))
        h_seq = x_seq.new_empty((t_len, n)) if store_h else None
        w_out = x_seq.new_empty((k, rows, n)) if k else None
        wt_seq = x_seq.new_empty((k, t_len, n)) if store_h and self.needs_wt else None
        if n == 0:
            return spike, v_out, h_seq, w_out, wt_seq
        slots = [
            x_seq.data_ptr(),
            _ptr(v_init),
            _ptr(w_init),
            spike.data_ptr(),
            _ptr(h_seq),
            v_out.data_ptr(),
            _ptr(wt_seq),
            _ptr(w_out),
            t_len,
            n,
        ]  # in _FORWARD_SLOTS order
        self._param_slots(slots, params)
        tensors = [x_seq, spike, h_seq, v_out, w_out, wt_seq]
        self._launch(("forward", store_h, v_mode), self._forward_plan, slots, tensors, n)
        return spike, v_out, h_seq, w_out, wt_seq

    def backward(
        self,
        grad_spike: torch.Tensor,
        grad_v: torch.Tensor | None,
        grad_w: torch.Tensor | None,
        grad_v_mode: str,
        h_seq: torch.Tensor,
        wt_seq: torch.Tensor | None,
        x_seq: torch.Tensor | None,
        v_init: torch.Tensor | None,
        w_init: torch.Tensor | None,
        params: Sequence[torch.Tensor],
    ) -> tuple[torch.Tensor, Any, Any, Any]:
        """Backward through time: (grad_x [T, N], grad_v_init [N], grad_w_init [k, N],
        grad_params [P, N] in the accumulator dtype), with None for the initial-state
        gradients of absent initial states and when no param is learnable. ``grad_v``
        and ``grad_w`` are given in ``grad_v_mode`` "seq" or "last", None in "none"; a
        ``grad_spike`` with all strides 0 is read as one scalar."""
        k, learnable = self.k, self.n_learnable
        t_len, n = h_seq.shape
        grad_x = torch.empty_like(h_seq)
        grad_v_init = None if v_init is None else h_seq.new_empty((n,))
        grad_w_init = None if w_init is None else h_seq.new_empty((k, n))
        accum = dtypes.lookup(self.backend, h_seq.dtype).torch_accum
        grad_params = h_seq.new_empty((learnable, n), dtype=accum) if learnable else None
        if n == 0:
            return grad_x, grad_v_init, grad_w_init, grad_params
        spike_scalar = grad_spike.numel() > 1 and not any(grad_spike.stride())
        slots = [
            grad_spike.data_ptr(),
            _ptr(grad_v),
            _ptr(grad_w),
            h_seq.data_ptr(),
            _ptr(wt_seq),
            _ptr(x_seq),
            _ptr(v_init),
            _ptr(w_init),
            grad_x.data_ptr(),
            _ptr(grad_v_init),
            _ptr(grad_w_init),
            int(spike_scalar),
            t_len,
            n,
        ]  # in _BACKWARD_SLOTS order
        self._param_slots(slots, params)
        if grad_params is not None:  # one row per learnable param, addressed without views
            base, row = grad_params.data_ptr(), n * grad_params.element_size()
            slots += [base + j * row for j in range(learnable)]
        spike_tensor = None if spike_scalar else grad_spike
        tensors = [h_seq, grad_x, x_seq, grad_v, grad_w, wt_seq, spike_tensor]
        self._launch(("backward", grad_v_mode), self._backward_plan, slots, tensors, n)
        return grad_x, grad_v_init, grad_w_init, grad_params


#: (neuron key, backend) -> Program; the least recently used are forgotten (a forgotten
#: program is made again on its next use, its kernels loaded from the tables below it)
_PROGRAMS: cache.BoundedTable[tuple[str, str], Program] = cache.BoundedTable(256)


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
