"""A layer's parameters: made in the dtype and on the device asked for, kept at the values
given, and checked against their symbols' assumptions wherever values enter.

A parameter given as a float (or a neuron's default) keeps that value whatever the
module's dtype. A fixed one that the module's dtype rounds runs as the float itself, made
in the dtype of each run (its buffer shows it rounded). A cast (``.double()``, ``.to()``,
``.half()``) recreates a buffer, and a learnable one's ``nn.Parameter``, from the float
as long as it still holds it (neither trained nor set since): ``.double()`` gives 0.9,
not the float32 rounding 0.8999999761581421. A value that changed is the model's own: a
cast converts it as torch converts any tensor. Under ``torch.compile`` a call reads the
tensors, so a float64 run wants a float64 layer. A layer made on the ``meta`` device gets
its floats from ``to_empty()`` (torch's own modules leave that to ``reset_parameters()``).

Every value is checked at construction (the float given and its tensor: float16 holds
tau = 1e-8 as 0) with :func:`symneuron.assumptions.check_values`, the check
:func:`symneuron.simulate` makes of its floats and tensors. A call checks again only the
values replaced or changed in place since their last check (a tensor's identity and
version counter, read on the host): for a learnable parameter with assumptions, once
after each optimizer step, which reads one value back (on a GPU, a synchronisation).
Not under ``torch.compile``, a functorch transform or in a CUDA graph capture, where a
value cannot be read back: the next call outside them checks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .assumptions import check_values, tensor_version
from .definition import Definition
from .validate import dense, finite_float, named

__all__ = ["placement", "param_tensors", "ParamRecords"]

#: the record of a value not checked yet (no tensor is it)
_UNCHECKED = (None, -2)


def placement(dtype: Any, device: Any) -> dict[str, Any]:
    """``dtype`` and ``device`` as keyword arguments of a tensor factory (those given)."""
    place: dict[str, Any] = {}
    if dtype is not None:
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(
                f"dtype must be a floating-point torch.dtype such as torch.float64 (or None "
                f"for torch's default), got {dtype!r}"
            )
        place["dtype"] = dtype
    if device is not None:
        place["device"] = torch.device(device)
    return place


def param_tensors(
    neuron: Definition, params: Mapping[Any, float | torch.Tensor], place: dict[str, Any]
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Each param's tensor, made where ``place`` says (a tensor given keeps its dtype
    unless ``place`` names one), its value checked (finite, and against its symbol's
    assumptions); and the floats given (the neuron's defaults included), by name."""
    values: dict[str, float | torch.Tensor] = dict(neuron.params)
    values.update(named(params, "parameter", neuron.params))
    tensors: dict[str, torch.Tensor] = {}
    given: dict[str, float] = {}
    for name, value in values.items():
        if isinstance(value, torch.Tensor):
            dense(value, f"Parameter {name!r}")
            if not value.is_floating_point():
                raise TypeError(
                    f"Parameter {name!r} must be a floating-point tensor, got "
                    f"{value.dtype}; use .float()"
                )
            tensor = value.detach().to(copy=True, **place)
        else:
            value = given[name] = finite_float(value, f"Parameter {name!r}")
            dtype = place.get("dtype", torch.get_default_dtype())
            tensor = torch.tensor(value, dtype=dtype, device=place.get("device"))
        readable = not tensor.is_meta  # (a meta tensor holds no values: the float is checked)
        if readable and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"Parameter {name!r} must be finite, got {value}")
        kinds = neuron.param_assumptions.get(name)
        if kinds:  # the value given, and as its dtype holds it (rounded to 0, say)
            check_values(name, kinds, value)
            check_values(name, kinds, tensor)
        tensors[name] = tensor
    return tensors, given


class ParamRecords:
    """What a layer knows of its param ``tensors`` between calls: the floats given, the
    fixed params whose tensors hold them rounded (a wider run takes the float), and the
    tensors last checked against their symbols' assumptions (identity and version)."""

    def __init__(
        self, neuron: Definition, given: dict[str, float], tensors: Mapping[str, torch.Tensor]
    ) -> None:
        self.given = given
        self.learnable = frozenset(neuron.learnable)
        self.assumptions = dict(neuron.param_assumptions)
        #: fixed param -> (its float given, its tensor, the tensor's version and dtype)
        self.exact: dict[str, tuple[float, torch.Tensor, int, torch.dtype]] = {}
        #: param with assumptions -> (its tensor, the tensor's version) when last checked
        self.checked: dict[str, tuple[torch.Tensor | None, int]] = {}
        self.note(tensors, checked=True)  # (checked as they were made)

    def note(self, tensors: Mapping[str, torch.Tensor], checked: bool) -> None:
        """Record ``tensors`` as they are now: those fixed ones that hold their float given
        rounded and, if ``checked``, those with assumptions as checked (else each is
        checked at the next call)."""
        self.exact = {
            name: (value, tensors[name], tensor_version(tensors[name]), tensors[name].dtype)
            for name, value in self.given.items()
            if name not in self.learnable and _rounds(tensors[name], value)
        }
        assumed = self.assumptions if checked else {}
        self.checked = {name: (tensors[name], tensor_version(tensors[name])) for name in assumed}

    def held(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.dtype | None]:
        """The params whose tensors still hold their floats given, with their dtypes, None
        for a meta tensor (made from the float, without values); before a cast, reading
        the values back."""
        return {
            name: None if tensors[name].is_meta else tensors[name].dtype
            for name, value in self.given.items()
            if tensors[name].is_meta or _holds(tensors[name], value)
        }

    def recast(
        self, tensors: Mapping[str, torch.Tensor], held: dict[str, torch.dtype | None]
    ) -> None:
        """After a cast, each param :meth:`held` found holds its float again, rounded once
        to its new dtype (not float32's rounding cast to float64; a meta tensor made real
        by ``to_empty`` gets its value); each value is checked again at the next call (a
        cast can round a small value to 0)."""
        for name, dtype in held.items():
            tensor = tensors[name]
            if tensor.dtype != dtype and tensor.is_floating_point() and not tensor.is_meta:
                with torch.no_grad():
                    tensor.fill_(self.given[name])
        self.note(tensors, checked=False)

    def for_call(self, values: dict[str, Any], dtype: torch.dtype | None) -> dict[str, Any]:
        """``values`` (each param's tensor) as a call of ``dtype`` runs with them: a fixed
        param's float given where its tensor holds it rounded and the run's dtype is
        another (:func:`symneuron.simulate` checks floats); each other value with
        assumptions checked once replaced or changed in place since its last check."""
        for name, (given, tensor, version, held) in self.exact.items():
            if values[name] is tensor and held is not dtype and tensor_version(tensor) == version:
                values[name] = given
        checked = self.checked
        for name in self.assumptions:
            value = values[name]
            seen = checked.get(name, _UNCHECKED)
            if value is not seen[0] or tensor_version(value) != seen[1]:  # (a float is not seen)
                self._check(name, value)
        return values

    def _check(self, name: str, value: Any) -> None:
        """Check a changed tensor (:func:`~symneuron.assumptions.check_values`: not where
        its values cannot be read, under ``torch.compile``, a functorch transform or in a
        CUDA graph capture) and note it checked once it was; :func:`symneuron.simulate`
        checks a float."""
        if isinstance(value, torch.Tensor) and check_values(name, self.assumptions[name], value):
            self.checked[name] = (value, tensor_version(value))


def _rounds(tensor: Any, value: float) -> bool:
    """Whether ``tensor`` holds the float ``value`` rounded to its dtype, not ``value``
    itself (a run in a wider dtype takes the float instead)."""
    return _holds(tensor, value) and float(tensor.detach()) != value


def _holds(tensor: Any, value: float) -> bool:
    """Whether ``tensor`` is one plain value equal to the float ``value`` rounded to the
    tensor's dtype (reads it back: called at construction and casts only)."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.numel() != 1:
        return False
    if tensor.device.type == "meta" or not tensor.is_floating_point():
        return False
    return float(tensor.detach()) == float(torch.tensor(value, dtype=tensor.dtype))
