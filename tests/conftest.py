"""Shared helpers for the CPU test suite.

The oracle is :func:`symneuron.reference.simulate_reference` run in float64
(torch ops + torch autograd, no SymPy derivative), plus finite differences.
``compare`` runs one neuron through ``sn.simulate`` and through the oracle on
the same random inputs and the same random linear loss, and returns both
results side by side.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import symneuron as sn
from symneuron.reference import simulate_reference


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` skip where torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def seed_of(*parts: Any) -> int:
    """A stable seed from a test's parameters (same inputs on every run)."""
    return zlib.crc32(repr(parts).encode())


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_inputs(
    T: int,
    shape: tuple[int, ...],
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    *,
    x_offset: float = 0.9,
    x_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_seq [T, *shape], v_init [*shape])``: random, scaled so that many but not all fire."""
    gen = generator(seed)
    x_seq = x_offset + x_scale * torch.randn(T, *shape, generator=gen, dtype=torch.float64)
    v_init = 0.8 * torch.rand(*shape, generator=gen, dtype=torch.float64) - 0.3
    return x_seq.to(dtype), v_init.to(dtype)


def random_weights(T: int, shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights r1, r2 of the linear loss ``sum(spike*r1) + sum(v_seq*r2)``."""
    gen = generator(seed + 1)
    return (
        torch.randn(T, *shape, generator=gen, dtype=torch.float64),
        torch.randn(T, *shape, generator=gen, dtype=torch.float64),
    )


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a − b| / max|b| (b the oracle); inf when shapes differ."""
    if a.shape != b.shape:
        return float("inf")
    a, b = a.double(), b.double()
    scale = b.abs().max().clamp_min(1e-300)
    return float(((a - b).abs().max() / scale).item())


def assert_fires_sometimes(spikes: torch.Tensor) -> None:
    """Some but not all spikes are 1, and every value is 0 or 1."""
    spikes = spikes.detach()
    assert bool(((spikes == 0) | (spikes == 1)).all()), "spikes must be 0/1"
    rate = float(spikes.detach().double().mean())
    assert 0.0 < rate < 1.0, f"vacuous input: spike rate {rate}"


#: (x_offset, x_scale) per model name where the default input would diverge:
#: EIF's exponential and QIF's square run away (EIF to inf, then NaN) once V is
#: far above threshold, which a soft reset does not pull it back from.
INPUT_SCALE = {"EIF": (0.5, 0.5), "QIF": (0.6, 0.6)}


@dataclass
class Run:
    """Outputs of one simulation and the gradients of the linear loss."""

    spikes: torch.Tensor
    v_seq: torch.Tensor
    grads: dict[str, torch.Tensor | None] = field(default_factory=dict)


@dataclass
class Comparison:
    got: Run
    ref: Run

    def grad_names(self) -> list[str]:
        return list(self.ref.grads)


def _loss(
    spikes: torch.Tensor, v_seq: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor], loss: str
) -> torch.Tensor:
    if loss == "sum":  # autograd then hands the backward stride-0 (expanded) gradients
        return spikes.sum() + v_seq.sum()
    r1, r2 = weights
    terms = []
    if loss in ("both", "spike"):
        terms.append((spikes * r1.to(spikes.dtype)).sum())
    if loss in ("both", "v"):
        r2 = r2 if v_seq.shape[0] == r2.shape[0] else r2[-1:]
        terms.append((v_seq * r2.to(v_seq.dtype)).sum())
    return sum(terms[1:], terms[0])


def _run(
    neuron: sn.Neuron,
    x_seq: torch.Tensor,
    v_init: torch.Tensor,
    params: Mapping[str, float | torch.Tensor],
    weights: tuple[torch.Tensor, torch.Tensor],
    *,
    backend: str | None,
    store_v_seq: bool,
    loss: str,
) -> Run:
    leaves = {
        "x_seq": x_seq.detach().clone().requires_grad_(True),
        "v_init": v_init.detach().clone().requires_grad_(True),
    }
    values: dict[str, float | torch.Tensor] = {}
    for name, value in params.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().clone()
            if name in neuron.learnable:
                value.requires_grad_(True)
                leaves[name] = value
        values[name] = value
    if backend is None:
        spikes, v_seq = simulate_reference(
            neuron,
            leaves["x_seq"],
            leaves["v_init"],
            {**neuron.params, **values},
            store_v_seq=store_v_seq,
        )
    else:
        spikes, v_seq = sn.simulate(
            neuron,
            leaves["x_seq"],
            leaves["v_init"],
            values,
            backend=backend,
            store_v_seq=store_v_seq,
        )
    grads = torch.autograd.grad(
        _loss(spikes, v_seq, weights, loss), list(leaves.values()), allow_unused=True
    )
    return Run(spikes.detach(), v_seq.detach(), dict(zip(leaves, grads, strict=True)))


def learnable_values(neuron: sn.Neuron, seed: int) -> dict[str, torch.Tensor]:
    """Each learnable param as a scalar tensor near its default (not exactly the default)."""
    gen = generator(seed + 2)
    out = {}
    for name in neuron.learnable:
        jitter = 0.1 * (torch.rand((), generator=gen, dtype=torch.float64) - 0.5)
        out[name] = torch.tensor(neuron.params[name], dtype=torch.float64) + jitter
    return out


def compare(
    neuron: sn.Neuron,
    backend: str = "cpu",
    dtype: torch.dtype = torch.float64,
    *,
    T: int = 8,
    shape: tuple[int, ...] = (2, 6),
    seed: int = 0,
    params: Mapping[str, float | torch.Tensor] | None = None,
    store_v_seq: bool = True,
    loss: str = "both",
    x_offset: float | None = None,
    x_scale: float | None = None,
) -> Comparison:
    """Run ``neuron`` with ``backend`` in ``dtype`` and the float64 reference on the same inputs.

    Learnable params not given in ``params`` are drawn as scalar tensors near
    their defaults so that they receive gradients. ``loss`` is ``"both"``
    (spikes and v), ``"spike"``, ``"v"`` or ``"sum"`` (unweighted sum of both).
    Inputs are drawn in float64 and cast to ``dtype``; the reference sees those
    same (cast) values in float64.
    """
    offset, scale = INPUT_SCALE.get(neuron.name, (0.9, 1.0))
    x_seq, v_init = random_inputs(
        T,
        shape,
        dtype,
        seed,
        x_offset=offset if x_offset is None else x_offset,
        x_scale=scale if x_scale is None else x_scale,
    )
    weights = random_weights(T, shape, seed)
    values: dict[str, float | torch.Tensor] = dict(learnable_values(neuron, seed))
    values.update(params or {})
    cast = {k: v.to(dtype) if isinstance(v, torch.Tensor) else v for k, v in values.items()}
    got = _run(
        neuron, x_seq, v_init, cast, weights, backend=backend, store_v_seq=store_v_seq, loss=loss
    )
    as64 = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in cast.items()}
    ref = _run(
        neuron,
        x_seq.double(),
        v_init.double(),
        as64,
        weights,
        backend=None,
        store_v_seq=store_v_seq,
        loss=loss,
    )
    return Comparison(got, ref)


def assert_matches(c: Comparison, *, v_atol: float, grad_rtol: float) -> None:
    """Spikes identical, v within ``v_atol``, every gradient within ``grad_rtol`` (relative)."""
    assert_fires_sometimes(c.ref.spikes)
    assert c.got.spikes.shape == c.ref.spikes.shape
    assert torch.equal(c.got.spikes.double(), c.ref.spikes), "spike trains differ"
    assert c.got.v_seq.shape == c.ref.v_seq.shape
    v_err = float((c.got.v_seq.double() - c.ref.v_seq).abs().max())
    assert v_err <= v_atol, f"v_seq error {v_err:.3e} > {v_atol:.1e}"
    assert set(c.got.grads) == set(c.ref.grads)
    for name, ref in c.ref.grads.items():
        got = c.got.grads[name]
        assert ref is not None, f"reference has no gradient for {name}"
        assert got is not None, f"no gradient for {name}"
        assert got.shape == ref.shape, f"grad {name}: {tuple(got.shape)} != {tuple(ref.shape)}"
        assert float(ref.abs().max()) > 0, f"reference gradient of {name} is all zero"
        err = rel_err(got, ref)
        assert err <= grad_rtol, f"grad {name}: relative error {err:.3e} > {grad_rtol:.1e}"


@pytest.fixture
def rng_seed(request: pytest.FixtureRequest) -> int:
    """A seed derived from the test's node id."""
    return seed_of(request.node.nodeid)
