"""EventProp's compiled kernels, on the CPU or on a CUDA GPU: a layer's exact forward and
adjoint backward.

:func:`event_kernels` returns the :class:`EventKernels` of a (neuron, synapse target,
dtype, backend) quadruple, one per process: its source rendered by
:mod:`symneuron.codegen.events` in the backend's language, compiled the first time a pass
runs (C by the system compiler, :mod:`.cpu`; CUDA by NVRTC, :mod:`.cuda`; both cached on
disk by the source's hash). The backend follows the tensors' device. A launch packs its
values by the names of :data:`~symneuron.codegen.events.FORWARD_ARGS` /
``BACKWARD_ARGS``.

Arrival order: where every neuron's delays are equal along its row (no delays, or
delays not yet trained apart), each sample's spikes are sorted once
(:func:`arrival_order`) and every neuron reads its arrivals through that order; else each
(sample, neuron) row sorts its own in its scratch. On CUDA a row's scratch is a slab of
one buffer, launched in waves within a budget (:mod:`.event_launch`).

Spike slots: the forward writes at most ``capacity`` spikes per neuron (or, where more,
a quarter more than the last forward of the same shape needed, so a training loop's
steps run once) and counts on past it; when a neuron spiked more often, it runs again
with as many slots as the most spikes of any neuron (so a caller never sees an
overflow, and a second run costs only time). The result is trimmed to max(1, that
count) slots, +inf past each neuron's own: the slots given never change a result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch

from ..codegen.events import (
    ARGS,
    PARTS_OF,
    EventSource,
    render_events,
    scratch_bytes,
)
from ..definition import Definition
from ..derivation.events import EventSpec
from ..memo import BoundedTable
from . import cpu, cuda
from .event_launch import Values, in_waves, kinds, packed

__all__ = [
    "EventKernels",
    "LayerInputs",
    "Spikes",
    "Gradients",
    "SampleLaunch",
    "arrival_order",
    "settle",
    "slots_key",
    "event_kernels",
    "GROUPS",
    "QUEUE_SLOTS",
]

#: batch rows are split into at most this many groups in the backward, each with its own
#: gradient rows (so the sums do not depend on the number of threads)
GROUPS = 16
#: a recurrent layer's first room for the arrivals waiting at a neuron (those of the
#: spikes within its longest recurrent delay, before their times: a few at SHD rates),
#: four times more in each run that needed more
QUEUE_SLOTS = 64
_DTYPES = {torch.float32: "float32", torch.float64: "float64"}
#: device type -> the runtime that compiles and launches there
_RUNTIMES = {"cpu": cpu, "cuda": cuda}


def arrival_order(
    pre: torch.Tensor, uniform: bool
) -> tuple[torch.Tensor, torch.Tensor] | tuple[None, None]:
    """Each sample's spike slots in time order, [B, n_in·K_in] (a stable sort: ties
    keep the source, then slot, order), and their times in that order, where the layer's
    delays are ``uniform`` (one value along every row); else (None, None) (each
    row then sorts its own arrivals)."""
    if not uniform:
        return None, None
    ordered, order = torch.sort(pre.reshape(pre.shape[0], -1), dim=1, stable=True)
    return order, ordered


class LayerInputs(NamedTuple):
    """A layer's kernel inputs, contiguous in one dtype on one device: presynaptic spike
    times ``pre`` [B, n_in, K_in] (+inf padded), ``weight`` and ``delay`` [N, n_in],
    ``params`` [NP, N] (every param, the spec's order: :meth:`EventKernels.params`) and
    the samples' arrival ``order`` with the times ``ordered`` by it
    (:func:`arrival_order`); ``transposed``: ``weight`` and ``delay`` are [n_in, N]
    copies instead (:meth:`EventKernels.laid_out`)."""

    pre: torch.Tensor
    weight: torch.Tensor
    delay: torch.Tensor
    params: torch.Tensor
    order: torch.Tensor | None = None
    ordered: torch.Tensor | None = None
    transposed: bool = False

    @property
    def n_out(self) -> int:
        """The layer's neurons N."""
        return self.weight.shape[1 if self.transposed else 0]

    def values(self, times: tuple[float, float]) -> Values:
        """The launch values both passes share, by argument name."""
        batch, n_in, k_in = self.pre.shape
        if n_in * k_in >= 1 << 31:
            raise ValueError(
                f"{n_in} inputs × {k_in} spike slots: the kernels index a sample's slots "
                "in 32 bits; split the inputs or trim their slots."
            )
        return {
            **self._asdict(),
            "until": times[0],
            "step": times[1],
            "B": batch,
            "N": self.n_out,
            "n_in": n_in,
            "k_in": k_in,
            "n_steps": math.ceil(times[0] / times[1]),
            "transposed": int(self.transposed),
        }


class Spikes(NamedTuple):
    """A layer's forward: spike ``times`` [B, N, K] (+inf padded), the stored states
    ``store`` [B, N, K, NSTORE], ġ⁻ ``rate`` [B, N, K], ``counts`` [B, N] and the rows'
    ``outcome`` [2, B, N] (their counts, then 1 where a reset did not leave the threshold;
    read back by :meth:`EventKernels.forward`, or later by the caller, :func:`settle`)."""

    times: torch.Tensor
    store: torch.Tensor
    rate: torch.Tensor
    counts: torch.Tensor
    outcome: torch.Tensor


class Gradients(NamedTuple):
    """A layer's backward: dL/dW, dL/dD [N, n_in], dL/dθ [NP, N] (every param, the
    spec's order) and Σ Q per presynaptic spike [B, n_in, K_in] (the delays' and the
    last None where not wanted); a recurrent layer's dL/dW_rec and dL/dD_rec [N, N] too
    (``recurrent``; its delays' None where not wanted)."""

    weight: torch.Tensor
    delay: torch.Tensor | None
    params: torch.Tensor
    source_b: torch.Tensor | None
    recurrent: tuple[torch.Tensor, torch.Tensor | None] | None = None


class SampleLaunch(NamedTuple):
    """A recurrent layer's backward launch: a sample's scratch bytes, and whether the
    recurrent delays' gradient is wanted."""

    slab: int
    delays: bool


def _tensor(values: Values, name: str) -> torch.Tensor:
    value = values[name]
    assert isinstance(value, torch.Tensor), name
    return value


class EventKernels:
    """One neuron's EventProp kernels in one dtype for one backend (``"cpu"`` or
    ``"cuda"``): compiled on first use of each backward flavour (with or without
    ∫λ·∂f/∂θ) and device, launched on that backend's tensors."""

    def __init__(
        self, definition: Definition, spec: EventSpec, dtype: str, backend: str, rk4: bool = False
    ) -> None:
        self.definition, self.spec, self.dtype, self.backend = definition, spec, dtype, backend
        #: whether the kernels move by RK4 (:func:`~symneuron.codegen.events.render_events`)
        self.rk4 = rk4
        self.names = list(spec.params)
        self.store = len(spec.store)
        self._runtime = _RUNTIMES[backend]
        self._launchers: dict[tuple[str, bool, int], cpu.Launch] = {}
        self._sources: dict[tuple[bool, str], EventSource] = {}
        #: the slots a forward of each (B, N, n_in·K_in) shape last needed, with room to
        #: spare: the first run's (time only: a run short of slots runs again)
        self.slots: dict[tuple[int, int, int], int] = {}
        #: a recurrent layer's room for the recurrent arrivals not yet applied at a neuron,
        #: per shape (:data:`QUEUE_SLOTS` at first; a run short of room runs again)
        self.queues: dict[tuple[int, int, int], int] = {}
        #: whether the kernels read ``weight``, ``delay`` as [n_in, N] copies (CUDA: a
        #: warp's neurons then read one line per input; C rows read their own row)
        self.transpose = backend == "cuda"
        self._defaults: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}

    def source(self, integrals: bool, part: str = "layers") -> EventSource:
        """The rendered source (``integrals`` selects the backward's flavour; the forward
        is the same in both; ``part``: which kernels, :data:`~symneuron.codegen.events.
        PARTS_OF`), rendered once."""
        key = (integrals, part)
        if key not in self._sources:
            self._sources[key] = render_events(
                self.definition,
                self.spec,
                self.dtype,
                integrals,
                self.backend,
                self.rk4,
                part,
            )
        return self._sources[key]

    def launcher(self, name: str, integrals: bool, device: int = -1) -> cpu.Launch:
        """The launch function of ``sn_events_<name>`` on ``device`` (-1: the CPU), from
        the source that holds it (the layers', the readouts' or the recurrent layers')."""
        key = (name, integrals, device)
        if key not in self._launchers:
            module = self._runtime.load(self.source(integrals, PARTS_OF[name]).text, device)
            self._launchers[key] = self._runtime.launcher(module, f"sn_events_{name}", device)
        return self._launchers[key]

    def run(
        self,
        name: str,
        integrals: bool,
        values: Values,
        slab: int,
        like: torch.Tensor,
        samples: bool = False,
    ) -> None:
        """Launch ``sn_events_<name>`` over every (sample, neuron) row: in C one call (each
        thread takes ``slab`` bytes of scratch itself), in CUDA one thread per row with
        its slab of one buffer, in waves (:func:`~.event_launch.in_waves`). With
        ``samples`` (a recurrent layer's kernels) the unit is a sample, ``slab`` its
        bytes: in CUDA a block a sample."""
        args = ARGS[name]
        total = _int(values["B"]) * (1 if samples else _int(values["N"]))
        values["slab_bytes"] = slab
        if self.backend == "cpu":
            values.update({"scratch": None, "row0": 0, "rows": total})
            self.launcher(name, integrals)(kinds(args), packed(args, values), None)
            return
        launch = self.launcher(name, integrals, like.device.index or 0)
        in_waves(launch, args, values, slab, total, like.device, samples)

    def laid_out(self, inputs: LayerInputs) -> LayerInputs:
        """``inputs`` as the kernels read them: on CUDA with ``weight`` and ``delay`` as
        [n_in, N] copies (``transposed``: a warp's threads are neighbouring neurons of one
        sample reading one input at a time, so they then read one line, not 32;
        :attr:`transpose`). A layer lays its inputs out once, for both passes."""
        if not self.transpose or inputs.transposed:
            return inputs
        weight, delay = (t.t().contiguous() for t in (inputs.weight, inputs.delay))
        return inputs._replace(weight=weight, delay=delay, transposed=True)

    def params(self, given: Mapping[str, torch.Tensor], n: int, like: torch.Tensor) -> torch.Tensor:
        """[NP, n] in the spec's order: the given params, the rest at their defaults (the
        defaults' rows are built once per (n, dtype, device); the kernels only read
        them)."""
        key = (n, like.dtype, like.device)
        if key not in self._defaults:
            values = [float(self.definition.params[name]) for name in self.names]
            column = torch.tensor(values, dtype=like.dtype).reshape(-1, 1)
            self._defaults[key] = column.expand(len(values), n).contiguous().to(like.device)
        defaults = self._defaults[key]
        if not given:
            return defaults
        rows = [
            given[name].to(like).expand(n) if name in given else defaults[q]
            for q, name in enumerate(self.names)
        ]
        return torch.stack(rows).contiguous()

    def scratch(
        self, inputs: LayerInputs, k_out: int, n_steps: int, integrals: bool, pieces: bool = False
    ) -> dict[str, int]:
        """A row's scratch bytes in each pass (:func:`~symneuron.codegen.events.
        scratch_bytes`)."""
        _, n_in, k_in = inputs.pre.shape
        source = self.source(integrals)
        sorting = inputs.order is None
        return scratch_bytes(source, self.dtype, n_in * k_in, k_out, n_steps, sorting, pieces)

    def forward(
        self,
        inputs: LayerInputs,
        times: tuple[float, float],
        capacity: int = 4,
        check: bool = True,
    ) -> Spikes:
        """The layer's spikes up to ``times[0]`` in steps of ``times[1]``; ``capacity``:
        the slots the first run gives each neuron. With ``check`` False it runs once, with
        the slots it would start with, and returns them untrimmed with their outcome
        unread (no host sync): the caller reads it later, several layers' at once
        (:func:`settle`), and runs again where a neuron had no room."""
        inputs = self.laid_out(inputs)
        pre = inputs.pre
        batch, n = pre.shape[0], inputs.n_out
        values = inputs.values(times)
        # (every row's count and status is written by its run)
        outcome = torch.empty((2, batch, n), dtype=torch.int64, device=pre.device)
        values["counts"], values["status"] = outcome[0], outcome[1]
        shape = self.shape_of(inputs)
        slots = max(1, capacity, self.slots.get(shape, 0))
        slab = self.scratch(inputs, slots, _int(values["n_steps"]), False)["forward"]
        while True:
            values["k_out"] = slots
            values["times"] = pre.new_empty((batch, n, slots))
            # past each row's count, store and rate are never read (times are +inf there)
            values["store"] = pre.new_empty((batch, n, slots, self.store))
            values["rate"] = pre.new_empty((batch, n, slots))
            self.run("forward", False, values, slab, pre)
            spikes = Spikes(
                _tensor(values, "times"),
                _tensor(values, "store"),
                _tensor(values, "rate"),
                outcome[0],
                outcome,
            )
            if not check:
                return spikes
            (most,), _ = settle(self, [(shape, slots, outcome)])
            if most is not None:
                break
            slots = self.slots[shape]
        return trimmed(spikes, most)

    @staticmethod
    def shape_of(inputs: LayerInputs) -> tuple[int, int, int]:
        """The key of a layer's remembered slots (:func:`slots_key`)."""
        return slots_key(inputs.pre.shape, inputs.n_out)

    def remember(self, shape: tuple[int, int, int], most: int) -> None:
        """The next forward of ``shape`` starts with room for a few more spikes than
        ``most``."""
        self.slots[shape] = max(self.slots.get(shape, 0), most + most // 4)

    def backward(
        self,
        inputs: LayerInputs,
        times: tuple[float, float],
        spikes: Spikes,
        grad_times: torch.Tensor,
        integrals: bool = False,
        wanted: tuple[bool, bool] = (True, True),
    ) -> Gradients:
        """The layer's gradients given dL/dt_k of each of its spikes (``grad_times``
        [B, N, K]; the kernels take B = −dL/dt_k); ``integrals``: add ∫λ·∂f/∂θ dt to
        dL/dθ (time constants);
        ``wanted``: whether the delays' gradient and Σ Q per input spike are (each None
        where not: the kernels skip their sums)."""
        inputs = self.laid_out(inputs)
        values = inputs.values(times)
        values.update(
            {
                "k_out": spikes.times.shape[2],
                "times": spikes.times,
                "store": spikes.store,
                "counts": spikes.counts,
                "grad_t": grad_times.contiguous(),
            }
        )
        return self.gradients("backward", inputs, values, integrals, wanted)

    def gradients(
        self,
        name: str,
        inputs: LayerInputs,
        values: Values,
        integrals: bool,
        wanted: tuple[bool, bool],
        pieces: bool = False,
        samples: SampleLaunch | None = None,
    ) -> Gradients:
        """Run backward kernel ``name`` (``sn_events_<name>``, a layer's or a readout's)
        with ``values`` into zeroed gradient rows per group, and sum them; ``pieces``: its
        adjoint integrates a source on pieces of at most dt (a mean readout); ``samples``:
        a recurrent layer's, a sample a launch unit, with its recurrent gradients."""
        pre = inputs.pre
        (batch, n_in, k_in), n = pre.shape, inputs.n_out
        groups = max(1, min(batch, GROUPS))
        rows = (n_in, n) if inputs.transposed else (n, n_in)
        values["groups"] = groups
        values.update(
            _zeroed(
                pre,
                {
                    "grad_w": (groups, *rows),
                    "grad_d": (groups, *rows) if wanted[0] else None,
                    "grad_p": (groups, len(self.names), n),
                    "source_b": (batch, n_in, k_in) if wanted[1] else None,
                    "grad_rw": (groups, n, n) if samples else None,
                    "grad_rd": (groups, n, n) if samples and samples.delays else None,
                },
            )
        )
        if samples is None:
            k_out = _int(values["k_out"])
            slab = self.scratch(inputs, k_out, _int(values["n_steps"]), integrals, pieces)
            self.run(name, integrals, values, slab["backward"], pre)
        else:
            self.run(name, integrals, values, samples.slab, pre, samples=True)
        grad_w, grad_d, grad_p, grad_rw, grad_rd = (
            None if values[k] is None else _tensor(values, k).sum(0)
            for k in ("grad_w", "grad_d", "grad_p", "grad_rw", "grad_rd")
        )
        assert grad_w is not None and grad_p is not None
        if inputs.transposed:
            grad_w = grad_w.t().contiguous()
            grad_d, grad_rw, grad_rd = (
                None if t is None else t.t().contiguous() for t in (grad_d, grad_rw, grad_rd)
            )
        source_b = _tensor(values, "source_b") if wanted[1] else None
        recurrent = None if grad_rw is None else (grad_rw, grad_rd)
        return Gradients(grad_w, grad_d, grad_p, source_b, recurrent)


def _zeroed(
    like: torch.Tensor, shapes: Mapping[str, tuple[int, ...] | None]
) -> dict[str, torch.Tensor | None]:
    """Zeroed tensors of ``shapes`` (None: none), contiguous parts of one buffer zeroed
    at once (one launch where each would take its own)."""
    sizes = {name: math.prod(shape) for name, shape in shapes.items() if shape is not None}
    buffer = like.new_zeros(sum(sizes.values()))
    out: dict[str, torch.Tensor | None] = {}
    start = 0
    for name, shape in shapes.items():
        if shape is None:
            out[name] = None
            continue
        out[name] = buffer[start : start + sizes[name]].view(shape)
        start += sizes[name]
    return out


def slots_key(pre: torch.Size, n_out: int) -> tuple[int, int, int]:
    """The key of a layer's remembered slots, from its input times' shape [B, n_in, K_in]
    and its neurons: (B, N, n_in·K_in)."""
    batch, n_in, k_in = pre
    return batch, n_out, n_in * k_in


def trimmed(spikes: Spikes, most: int) -> Spikes:
    """``spikes`` with max(1, ``most``) slots (the most spikes of any neuron)."""
    keep = max(1, most)
    times, store, rate = (t[:, :, :keep].contiguous() for t in spikes[:3])
    return spikes._replace(times=times, store=store, rate=rate)


#: one layer's run to settle: its shape (:meth:`EventKernels.shape_of`), the slots it had
#: and its rows' outcome [2, B, N] (:class:`Spikes`)
Run = tuple[tuple[int, int, int], int, torch.Tensor]


def settle(
    kernels: EventKernels, runs: Sequence[Run], also: Sequence[torch.Tensor] = ()
) -> tuple[list[int | None], list[np.ndarray]]:
    """The most spikes of any neuron of each layer of a network that ran in order (each
    layer's input the one before's output), read back with the values of ``also``
    (tensors, returned flat in float64) after one host sync: an error where a reset did
    not leave the threshold; each layer's count remembered (:meth:`EventKernels.
    remember`); None for the first layer whose neurons had too few slots (its slots for
    the next run raised to fit) or, in a recurrent layer, too little room for their
    waiting arrivals (more room in the next run), and for every layer after it (their
    inputs lacked spikes: they run again)."""
    reduced = [o.flatten(1).amax(1) if o[0].numel() else o.new_zeros(2) for _, _, o in runs]
    extra = [v.detach().reshape(-1) for v in also]
    parts = [t.to(torch.float64) for t in (*reduced, *extra)]  # (counts < 2^53: exact)
    read = torch.cat(parts).cpu().numpy() if parts else np.zeros(0)  # the one host sync
    values, flat = read[: 2 * len(runs)].astype(np.int64), read[2 * len(runs) :]
    sizes = [int(s) for s in np.cumsum([v.numel() for v in extra])[:-1]]
    out: list[int | None] = []
    for index, (shape, slots, _) in enumerate(runs):
        most, failed = int(values[2 * index]), int(values[2 * index + 1])
        if failed == 2:
            raise RuntimeError(
                f"layer {index}: a recurrent arrival fell inside the step of its spike "
                "(a recurrent delay of one step, less its rounding); make recurrent delays "
                "longer than one step (dt) by a few rounding errors."
            )
        if failed == 1:
            raise RuntimeError("A reset did not leave the threshold (g(h(x)) ≥ 0) at a spike.")
        kernels.remember(shape, most)
        if failed == 3:  # a recurrent layer's queue was full: more room
            kernels.queues[shape] = 4 * kernels.queues.get(shape, QUEUE_SLOTS)
            out += [None] * (len(runs) - index)
            break
        if most > slots:
            kernels.slots[shape] = max(kernels.slots[shape], most)
            out += [None] * (len(runs) - index)
            break
        out.append(most)
    return out, list(np.split(flat, sizes)) if extra else []


def _int(value: torch.Tensor | float | None) -> int:
    assert isinstance(value, int)
    return value


#: kernels by (definition, its ODEs' text, target, dtype, backend, whether RK4)
_KERNELS: BoundedTable[tuple[Definition, str, str | None, str, str, bool], EventKernels] = (
    BoundedTable(32, "runtime.events.kernels")
)


def _available(backend: str) -> None:
    """Raise where ``backend``'s kernels cannot be built or run here, with the reason."""
    if backend not in _RUNTIMES:
        raise ValueError(
            f"The EventProp kernels run on {sorted(_RUNTIMES)} tensors, not {backend!r} ones; "
            "move the input times and the layers' tensors to one of those."
        )
    if backend == "cpu" and not cpu.available():
        raise RuntimeError(cpu.problem())
    if backend == "cuda" and not cuda.available():
        raise RuntimeError(
            "The CUDA EventProp kernels need torch to see a CUDA device and CuPy (NVRTC): "
            "pip install 'symneuron[cuda]'."
        )


def event_kernels(
    definition: Definition,
    spec: EventSpec,
    system_text: str,
    target: str | None,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    rk4: bool | None = None,
) -> EventKernels:
    """The memoised :class:`EventKernels` of ``definition`` (whose derived spec is
    ``spec``, from the ODEs ``system_text``) for spike inputs into ``target``, for
    tensors of ``dtype`` on ``device`` (its type picks the backend), moving by RK4 where
    ``rk4`` (None: where the spec has no closed-form flow)."""
    rk4 = spec.flow is None if rk4 is None else rk4
    if dtype not in _DTYPES:
        raise TypeError(
            f"The EventProp kernels take float32 or float64 tensors, not {dtype}; "
            "cast the input times and the layers' tensors."
        )
    backend = torch.device(device).type
    _available(backend)
    key = (definition, system_text, target, _DTYPES[dtype], backend, rk4)
    found = _KERNELS.get(key)
    if found is not None:
        return found
    return _KERNELS.put(key, EventKernels(definition, spec, key[3], backend, rk4))
