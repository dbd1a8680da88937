"""The kernel calling convention, written once: names, variants and arguments.

Code generation prints the parameter lists from :func:`forward_args` and
:func:`backward_args`; the runtime packs a launch's values from the same lists,
by name. Each source holds every variant of one neuron's kernels for one dtype:

    <name>_forward_<h|n>_<seq|last>_k<K>   store H for backward or not; V every step or last
    <name>_backward_<none|seq|last>_k<K>   which gradient of V (and W) autograd supplies

``K`` is the number of adjacent neurons one thread owns ("lanes"): 1, or the
dtype's vector width (:attr:`symneuron.dtypes.DType.lanes`) on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Arg",
    "V_MODES",
    "GRAD_V_MODES",
    "forward_args",
    "backward_args",
    "forward_name",
    "backward_name",
    "lane_counts",
]

#: How V (and each extra state) is returned: after every step, or only after the last.
V_MODES = ("seq", "last")
#: Which gradient of V (and W) the backward receives: none, one per step, or the last only.
GRAD_V_MODES = ("none", "seq", "last")


@dataclass(frozen=True)
class Arg:
    """One kernel argument.

    ``role`` is the type: ``"storage"``, ``"compute"`` or ``"accum"`` for a pointer
    to that dtype role (:class:`symneuron.dtypes.DType`), ``"int"`` or
    ``"long long"`` for a scalar. ``const`` marks a pointer the kernel only reads.
    """

    name: str
    role: str
    const: bool = False

    @property
    def pointer(self) -> bool:
        return self.role in ("storage", "compute", "accum")

    @property
    def pack(self) -> str:
        """The ``struct`` format character of the value: pointer, int or long long."""
        return "P" if self.pointer else ("i" if self.role == "int" else "q")


def _params(cnames: tuple[str, ...]) -> list[Arg]:
    return [Arg(f"{c}_ptr", "compute", True) for c in cnames]


def _strides(cnames: tuple[str, ...]) -> list[Arg]:
    return [Arg(f"{c}_stride", "long long") for c in cnames]


def forward_args(cnames: tuple[str, ...], k: int) -> tuple[Arg, ...]:
    """Arguments of every forward kernel: ``cnames`` are the params' kernel names
    (:func:`symneuron.derivation.c_identifier`), ``k`` the number of extra states."""
    states = [Arg("w_init", "storage", True)] if k else []
    state_out = [Arg("wt_seq", "storage"), Arg("w_out", "storage")] if k else []
    return (
        Arg("x_seq", "storage", True),
        Arg("v_init", "storage", True),
        *states,
        *_params(cnames),
        Arg("spike_seq", "storage"),
        Arg("h_seq", "storage"),
        Arg("v_seq", "storage"),
        *state_out,
        *_strides(cnames),
        Arg("T", "int"),
        Arg("N", "long long"),
    )


def backward_args(cnames: tuple[str, ...], learnable: tuple[str, ...], k: int) -> tuple[Arg, ...]:
    """Arguments of every backward kernel; ``learnable`` are the kernel names of the
    params that get gradients (one accumulator row each, ``grad_<c>_ptr``)."""

    def state(arg: Arg) -> list[Arg]:
        return [arg] if k else []

    return (
        Arg("grad_spike", "storage", True),
        Arg("grad_v_seq", "storage", True),
        *state(Arg("grad_w_seq", "storage", True)),
        Arg("h_seq", "storage", True),
        *state(Arg("wt_seq", "storage", True)),
        Arg("x_seq", "storage", True),
        Arg("v_init", "storage", True),
        *state(Arg("w_init", "storage", True)),
        *_params(cnames),
        Arg("grad_x_seq", "storage"),
        Arg("grad_v_init", "storage"),
        *state(Arg("grad_w_init", "storage")),
        *[Arg(f"grad_{c}_ptr", "accum") for c in learnable],
        *_strides(cnames),
        Arg("grad_spike_scalar", "int"),
        Arg("T", "int"),
        Arg("N", "long long"),
    )


def forward_base(name: str, store_h: bool, v_mode: str) -> str:
    """A forward variant's name without its lane count."""
    return f"{name}_forward_{'h' if store_h else 'n'}_{v_mode}"


def backward_base(name: str, grad_v_mode: str) -> str:
    """A backward variant's name without its lane count."""
    return f"{name}_backward_{grad_v_mode}"


def exported(base: str, lanes: int) -> str:
    """The exported kernel name of variant ``base`` with ``lanes`` neurons per thread."""
    return f"{base}_k{lanes}"


def forward_name(name: str, store_h: bool, v_mode: str, lanes: int) -> str:
    """Exported name of a forward kernel of the neuron called ``name``."""
    return exported(forward_base(name, store_h, v_mode), lanes)


def backward_name(name: str, grad_v_mode: str, lanes: int) -> str:
    """Exported name of a backward kernel of the neuron called ``name``."""
    return exported(backward_base(name, grad_v_mode), lanes)


def lane_counts(lanes: int) -> tuple[int, ...]:
    """The lane counts a source exports for a dtype of vector width ``lanes``."""
    return (1, lanes) if lanes > 1 else (1,)
