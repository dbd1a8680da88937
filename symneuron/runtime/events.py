"""EventProp's compiled kernels on the CPU: a layer's exact forward and adjoint backward.

:func:`event_kernels` returns the :class:`EventKernels` of a (neuron, synapse target,
dtype) triple, one per process: its source rendered by :mod:`symneuron.codegen.events`,
compiled by the system C compiler (:mod:`.cpu`, cached on disk by the source's hash)
the first time a pass runs. A launch packs its values by the names of
:data:`~symneuron.codegen.events.FORWARD_ARGS` / ``BACKWARD_ARGS``.

Spike slots: the forward writes at most ``capacity`` spikes per neuron and counts on
past it; when a neuron spiked more often, it runs again with as many slots as the most
spikes of any neuron (so a caller never sees an overflow, and a second run costs only
time). The result is trimmed to max(1, that count) slots, +inf past each neuron's own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import torch

from ..codegen.events import BACKWARD_ARGS, FORWARD_ARGS, KernelArg, render_events
from ..definition import Definition
from ..derivation.events import EventSpec
from ..memo import BoundedTable
from . import cpu

__all__ = ["EventKernels", "LayerInputs", "Spikes", "Gradients", "event_kernels", "GROUPS"]

#: batch rows are split into at most this many groups in the backward, each with its own
#: gradient rows (so the sums do not depend on the number of threads)
GROUPS = 16
_DTYPES = {torch.float32: "float32", torch.float64: "float64"}


class LayerInputs(NamedTuple):
    """A layer's kernel inputs, contiguous in one dtype: presynaptic spike times ``pre``
    [B, n_in, K_in] (+inf padded), ``weight`` and ``delay`` [N, n_in], ``params``
    [NP, N] (every param, the spec's order: :meth:`EventKernels.params`)."""

    pre: torch.Tensor
    weight: torch.Tensor
    delay: torch.Tensor
    params: torch.Tensor

    def values(self, times: tuple[float, float]) -> dict[str, torch.Tensor | int]:
        """The launch values both passes share, by argument name."""
        batch, n_in, k_in = self.pre.shape
        return {
            **self._asdict(),
            "scalars": self.pre.new_tensor(times),
            "B": batch,
            "N": self.weight.shape[0],
            "n_in": n_in,
            "k_in": k_in,
            "n_steps": math.ceil(times[0] / times[1]),
        }


class Spikes(NamedTuple):
    """A layer's forward: spike ``times`` [B, N, K] (+inf padded), the stored states
    ``store`` [B, N, K, NSTORE], ġ⁻ ``rate`` [B, N, K] and ``counts`` [B, N]."""

    times: torch.Tensor
    store: torch.Tensor
    rate: torch.Tensor
    counts: torch.Tensor


class Gradients(NamedTuple):
    """A layer's backward: dL/dW, dL/dD [N, n_in], dL/dθ [NP, N] (every param, the
    spec's order) and Σ Q per presynaptic spike [B, n_in, K_in]."""

    weight: torch.Tensor
    delay: torch.Tensor
    params: torch.Tensor
    source_b: torch.Tensor


def _packed(args: tuple[KernelArg, ...], values: Mapping[str, torch.Tensor | int]) -> list[int]:
    """The launch's values in the kernel's argument order: tensors as addresses."""
    out = []
    for arg in args:
        value = values[arg.name]
        if arg.pointer:
            assert isinstance(value, torch.Tensor) and value.is_contiguous(), arg.name
            out.append(value.data_ptr())
        else:
            out.append(int(value))
    return out


def _kinds(args: tuple[KernelArg, ...]) -> str:
    return "".join("P" if arg.pointer else "q" for arg in args)


class EventKernels:
    """One neuron's EventProp kernels in one dtype: compiled on first use of each
    backward flavour (with or without ∫λ·∂f/∂θ), launched on CPU tensors."""

    def __init__(self, definition: Definition, spec: EventSpec, dtype: str) -> None:
        self.definition, self.spec, self.dtype = definition, spec, dtype
        self.names = list(spec.params)
        self.store = len(spec.store)
        self._launchers: dict[tuple[str, bool], cpu.Launch] = {}

    def launcher(self, name: str, integrals: bool) -> cpu.Launch:
        """The launch function of ``sn_events_<name>`` (from the source ``integrals``
        selects; the forward is the same in both)."""
        key = (name, integrals)
        if key not in self._launchers:
            source = render_events(self.definition, self.spec, self.dtype, integrals)
            library = cpu.load(source.text)
            self._launchers[key] = cpu.launcher(library, f"sn_events_{name}")
        return self._launchers[key]

    def params(self, given: Mapping[str, torch.Tensor], n: int, like: torch.Tensor) -> torch.Tensor:
        """[NP, n] in the spec's order: the given params, the rest at their defaults."""
        defaults = self.definition.params
        rows = [
            given[name].to(like).expand(n) if name in given else like.new_full((n,), defaults[name])
            for name in self.names
        ]
        return torch.stack(rows).contiguous() if rows else like.new_zeros((0, n))

    def forward(self, inputs: LayerInputs, times: tuple[float, float], capacity: int = 4) -> Spikes:
        """The layer's spikes up to ``times[0]`` in steps of ``times[1]``; ``capacity``:
        the slots the first run gives each neuron."""
        pre = inputs.pre
        batch, n = pre.shape[0], inputs.weight.shape[0]
        values = inputs.values(times)
        values["counts"] = torch.zeros((batch, n), dtype=torch.int64)
        values["status"] = torch.zeros((batch, n), dtype=torch.int64)
        launch = self.launcher("forward", False)
        slots = max(1, capacity)
        while True:
            values["k_out"] = slots
            values["times"] = pre.new_empty((batch, n, slots))
            values["store"] = pre.new_zeros((batch, n, slots, self.store))
            values["rate"] = pre.new_zeros((batch, n, slots))
            launch(_kinds(FORWARD_ARGS), _packed(FORWARD_ARGS, values), None)
            counts = values["counts"]
            assert isinstance(counts, torch.Tensor)
            most = int(counts.max()) if counts.numel() else 0
            if most <= slots:
                break
            slots = most
        if bool(torch.as_tensor(values["status"]).any()):
            raise RuntimeError("A reset did not leave the threshold (g(h(x)) ≥ 0) at a spike.")
        keep = max(1, most)
        times_, store, rate = (
            torch.as_tensor(values[k])[:, :, :keep].contiguous() for k in ("times", "store", "rate")
        )
        return Spikes(times_, store, rate, counts)

    def backward(
        self,
        inputs: LayerInputs,
        times: tuple[float, float],
        spikes: Spikes,
        own_b: torch.Tensor,
        integrals: bool = False,
    ) -> Gradients:
        """The layer's gradients given each of its spikes' B = −dL/dt_k (``own_b``
        [B, N, K]); ``integrals``: add ∫λ·∂f/∂θ dt to dL/dθ (time constants)."""
        pre = inputs.pre
        (batch, n_in, k_in), n = pre.shape, inputs.weight.shape[0]
        groups = max(1, min(batch, GROUPS))
        values = inputs.values(times)
        values.update(
            {
                "k_out": spikes.times.shape[2],
                "groups": groups,
                "times": spikes.times,
                "store": spikes.store,
                "counts": spikes.counts,
                "own_b": own_b.contiguous(),
                "grad_w": pre.new_zeros((groups, n, n_in)),
                "grad_d": pre.new_zeros((groups, n, n_in)),
                "grad_p": pre.new_zeros((groups, len(self.names), n)),
                "source_b": pre.new_zeros((batch, n_in, k_in)),
            }
        )
        launch = self.launcher("backward", integrals)
        launch(_kinds(BACKWARD_ARGS), _packed(BACKWARD_ARGS, values), None)
        grad_w, grad_d, grad_p = (
            torch.as_tensor(values[k]).sum(0) for k in ("grad_w", "grad_d", "grad_p")
        )
        return Gradients(grad_w, grad_d, grad_p, torch.as_tensor(values["source_b"]))


#: kernels by (definition, its ODEs' text, target, dtype)
_KERNELS: BoundedTable[tuple[Definition, str, str | None, str], EventKernels] = BoundedTable(
    32, "runtime.events.kernels"
)


def event_kernels(
    definition: Definition,
    spec: EventSpec,
    system_text: str,
    target: str | None,
    dtype: torch.dtype,
) -> EventKernels:
    """The memoised :class:`EventKernels` of ``definition`` (whose derived spec is
    ``spec``, from the ODEs ``system_text``) for spike inputs into ``target``."""
    if dtype not in _DTYPES:
        raise TypeError(
            f"The EventProp kernels take float32 or float64 tensors, not {dtype}; "
            "cast the input times and the layers' tensors."
        )
    if not cpu.available():
        raise RuntimeError(cpu.problem())
    key = (definition, system_text, target, _DTYPES[dtype])
    found = _KERNELS.get(key)
    return found if found is not None else _KERNELS.put(key, EventKernels(definition, spec, key[3]))
