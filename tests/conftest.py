"""Shared helpers for the test suite.

The oracle is :func:`symneuron.reference.simulate_reference` run in float64
(torch ops + torch autograd, no SymPy derivative), plus finite differences.
:func:`run_with_grads` is the one harness every comparison goes through: it
runs a neuron (any backend, or the reference) from leaf copies of its inputs
and differentiates a linear loss. :func:`compare` draws random inputs and a
random linear loss for one neuron, runs it through a backend and through the
oracle, and returns both results side by side.

Every random draw comes from a seeded generator (:func:`generator`,
:func:`seed_of`), and the whole session compiles into a temporary kernel cache (one
for all the workers of a ``pytest -n`` run).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import sympy as sp
import torch

import symneuron as sn
from symneuron.reference import simulate_reference


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker gets its share of the cores for torch's own threads.
    Two workers of two threads on two cores, with one more busy process, took 46 s for
    test_noise and test_rng instead of 31 s (an OU moments test 12 s instead of 1: its
    threads wait on a preempted peer). The kernels' OpenMP is left as it is."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // workers))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` skip where torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's kernel and generated-source cache: a fresh temporary directory, so
    that every run starts cold and nothing is written into ``~/.cache/symneuron``.

    Under pytest-xdist the workers share one, in the run's base directory, as processes
    on one machine share ``~/.cache/symneuron``: a kernel one worker compiled the other
    loads. A test that clears or counts the cache's files sets ``SYMNEURON_CACHE`` to a
    directory of its own."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        path = tmp_path_factory.getbasetemp().parent / "symneuron-cache"
        path.mkdir(exist_ok=True)
    else:
        path = tmp_path_factory.mktemp("symneuron-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SYMNEURON_CACHE", str(path))
        yield path


def nvrtc_or_skip() -> ModuleType:
    """:mod:`symneuron.runtime.nvrtc` where NVRTC loads; skips the test where it does not,
    and fails it under CI, which must compile every CUDA source."""
    nvrtc = pytest.importorskip("symneuron.runtime.nvrtc")
    if not nvrtc.nvrtc_available():
        if os.environ.get("CI"):
            pytest.fail("CI must compile CUDA sources: install 'symneuron[cuda]' (NVRTC)")
        pytest.skip("NVRTC not installed (pip install 'symneuron[cuda]')")
    return nvrtc


# -- random draws ----------------------------------------------------------------------


def seed_of(*parts: Any) -> int:
    """A stable seed from a test's parameters (same inputs on every run)."""
    return zlib.crc32(repr(parts).encode())


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


#: Surrogate constructors by name. The model x reset x detach sweeps run with
#: ``BASIC_SURROGATES``, SpikingJelly's usual three; property tests draw from all.
SURROGATES: dict[str, Callable[..., sn.surrogate.Surrogate]] = {
    "Sigmoid": sn.surrogate.Sigmoid,
    "ATan": sn.surrogate.ATan,
    "PiecewiseQuadratic": sn.surrogate.PiecewiseQuadratic,
    "SoftSign": sn.surrogate.SoftSign,
    "SuperSpike": sn.surrogate.SuperSpike,
}
BASIC_SURROGATES = ["Sigmoid", "ATan", "PiecewiseQuadratic"]

#: (x_offset, x_scale) per model name where the default input would diverge:
#: EIF's exponential and QIF's square run away (EIF to inf, then NaN) once V is
#: far above threshold, which a soft reset does not pull it back from.
INPUT_SCALE = {"EIF": (0.5, 0.5), "QIF": (0.6, 0.6)}
DEFAULT_INPUT_SCALE = (0.9, 1.0)


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


def learnable_values(neuron: sn.Neuron, seed: int) -> dict[str, torch.Tensor]:
    """Each learnable param as a scalar tensor near its default (not exactly the default)."""
    gen = generator(seed + 2)
    out = {}
    for name in neuron.learnable:
        jitter = 0.1 * (torch.rand((), generator=gen, dtype=torch.float64) - 0.5)
        out[name] = torch.tensor(neuron.params[name], dtype=torch.float64) + jitter
    return out


# -- checks ----------------------------------------------------------------------------


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


# -- the harness -----------------------------------------------------------------------


@dataclass
class Run:
    """Outputs of one simulation and the gradients of the linear loss.

    ``grads`` is keyed by leaf: ``"x_seq"``, ``"v_init"``, each learnable param's name
    and ``"w:NAME"`` for each extra state's initial value; ``states`` holds each
    extra state's sequence (neurons with extra states only).
    """

    spikes: torch.Tensor
    v_seq: torch.Tensor
    grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    states: dict[str, torch.Tensor] = field(default_factory=dict)


def linear_loss(
    outputs: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], loss: str = "both"
) -> torch.Tensor:
    """``sum(out * r)`` over the outputs ``(spikes, v_seq, *state sequences)`` paired with
    ``weights`` in order (an output without a weight is left out of the loss).

    ``loss`` is ``"both"`` (every weighted output), ``"spike"`` or ``"v"`` (that output
    alone) or ``"sum"`` (``spikes.sum() + v_seq.sum()``, no weights: autograd then hands
    the backward stride-0 (expanded) gradients). Weights have T rows; an output stored
    for the last step only (``store_v_seq=False``) takes their last row. Each weight is
    cast to its output's dtype and device.
    """
    if loss == "sum":
        return outputs[0].sum() + outputs[1].sum()
    pairs = list(zip(outputs, weights, strict=False))
    if loss != "both":
        pairs = [pairs[{"spike": 0, "v": 1}[loss]]]
    terms = [(o * r[-o.shape[0] :].to(o.device, o.dtype)).sum() for o, r in pairs]
    return sum(terms[1:], terms[0])


def _start_level(
    neuron: sn.Neuron,
    v_init: torch.Tensor | float | None,
    values: Mapping[str, float | torch.Tensor],
    x_seq: torch.Tensor,
) -> torch.Tensor:
    """The reference's initial V as a tensor: ``v_init``, or for ``None`` where
    ``sn.simulate`` starts, the reset level (a param's value, through which its
    gradient flows, for a reset given by a param) or 0 for a soft reset."""
    if isinstance(v_init, torch.Tensor):
        return v_init
    if v_init is None:
        level = neuron.v_reset
        v_init = values[level.name] if isinstance(level, sp.Symbol) else level or 0.0
    start = torch.as_tensor(v_init, dtype=x_seq.dtype, device=x_seq.device)
    return start.expand(x_seq.shape[1:])


def run_with_grads(
    neuron: sn.Neuron,
    x_seq: torch.Tensor,
    v_init: torch.Tensor | float | None = None,
    params: Mapping[str, float | torch.Tensor] | None = None,
    weights: Sequence[torch.Tensor] = (),
    *,
    backend: str = "reference",
    states: Mapping[str, torch.Tensor] | None = None,
    store_v_seq: bool = True,
    loss: str = "both",
    round_h_to: torch.dtype | None = None,
    allow_unused: bool = False,
) -> Run:
    """Run ``neuron`` once and return its outputs and the gradients of :func:`linear_loss`.

    ``backend="reference"`` runs :func:`simulate_reference` (the oracle: give it float64
    inputs; ``round_h_to`` is its 16-bit emulation); any other value is the backend of
    ``sn.simulate``. Leaves are fresh copies of ``x_seq``, of ``v_init`` when it is a
    tensor (a float or ``None`` passes as it is), of each learnable param given as a
    tensor and of each initial state in ``states``; other params pass as they are.
    Unused leaves fail unless ``allow_unused`` (then their gradient is ``None``).
    """

    def leaf(value: torch.Tensor) -> torch.Tensor:
        return value.detach().clone().requires_grad_(True)

    leaves = {"x_seq": leaf(x_seq)}
    if isinstance(v_init, torch.Tensor):
        v_init = leaves["v_init"] = leaf(v_init)
    values: dict[str, float | torch.Tensor] = {}
    for name, value in (params or {}).items():
        if isinstance(value, torch.Tensor):
            value = value.detach().clone()
            if name in neuron.learnable:
                value = leaves[name] = value.requires_grad_(True)
        values[name] = value
    w_init = {name: leaf(value) for name, value in (states or {}).items()}
    leaves.update({f"w:{name}": value for name, value in w_init.items()})
    if backend == "reference":
        values = {**neuron.params, **values}
        out = simulate_reference(
            neuron,
            leaves["x_seq"],
            _start_level(neuron, v_init, values, x_seq),
            values,
            store_v_seq=store_v_seq,
            round_h_to=round_h_to,
            w_init=w_init or None,
        )
    else:
        out = sn.simulate(
            neuron,
            leaves["x_seq"],
            v_init,
            values,
            backend=backend,
            store_v_seq=store_v_seq,
            states=w_init or None,
        )
    spikes, v_seq, *extra = out
    state_seqs: dict[str, torch.Tensor] = extra[0] if extra else {}
    objective = linear_loss([spikes, v_seq, *state_seqs.values()], weights, loss)
    grads = torch.autograd.grad(objective, list(leaves.values()), allow_unused=allow_unused)
    return Run(
        spikes.detach(),
        v_seq.detach(),
        dict(zip(leaves, grads, strict=True)),
        {name: seq.detach() for name, seq in state_seqs.items()},
    )


@dataclass
class Comparison:
    got: Run
    ref: Run

    def grad_names(self) -> list[str]:
        return list(self.ref.grads)


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
    offset, scale = INPUT_SCALE.get(neuron.name, DEFAULT_INPUT_SCALE)
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
    as64 = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in cast.items()}
    options: dict[str, Any] = {"store_v_seq": store_v_seq, "loss": loss, "allow_unused": True}
    got = run_with_grads(neuron, x_seq, v_init, cast, weights, backend=backend, **options)
    ref = run_with_grads(neuron, x_seq.double(), v_init.double(), as64, weights, **options)
    return Comparison(got, ref)


def assert_matches(c: Comparison, *, v_atol: float, grad_rtol: float) -> None:
    """Spikes identical, v (and each extra state) within ``v_atol``, every gradient
    within ``grad_rtol`` (relative)."""
    assert_fires_sometimes(c.ref.spikes)
    assert c.got.spikes.shape == c.ref.spikes.shape
    assert torch.equal(c.got.spikes.double(), c.ref.spikes), "spike trains differ"
    assert c.got.states.keys() == c.ref.states.keys()
    for name in ["v_seq", *c.ref.states]:
        got = c.got.v_seq if name == "v_seq" else c.got.states[name]
        ref = c.ref.v_seq if name == "v_seq" else c.ref.states[name]
        assert got.shape == ref.shape
        err = float((got.double() - ref).abs().max())
        assert err <= v_atol, f"{name} error {err:.3e} > {v_atol:.1e}"
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
