"""``sn.testing``: guard your own neurons in your repository's test suite.

One line in a pytest test checks a neuron on every backend this machine has::

    import symneuron as sn
    from symneuron.testing import assert_neuron_ok

    def test_my_neuron():
        assert_neuron_ok(my_neuron())

:func:`assert_neuron_ok` runs :func:`symneuron.check` for each backend and dtype
(every derived partial and the surrogate's σ' against finite differences; the
kernels' outputs and gradients against the float64 torch reference) and raises
an ``AssertionError`` whose message lists every failing comparison.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from . import dtypes as _dtypes
from .check import CheckReport, check
from .neuron import Neuron
from .runtime import cpu, cuda

__all__ = ["assert_neuron_ok", "available_backends"]

#: Where each backend's inputs live.
_DEVICES = {"cpu": "cpu", "cuda": "cuda", "torch": "cpu"}
#: The dtypes checked when none are given: float16/bfloat16 only where CUDA runs them.
_DEFAULT_DTYPES = ("float64", "float32", "float16", "bfloat16")


def available_backends() -> list[str]:
    """The backends that run on this machine.

    ``"cpu"`` when a C compiler is found, ``"cuda"`` when torch sees a GPU and
    CuPy is installed, and ``"torch"`` (the reference) always.

    Examples
    --------
    >>> from symneuron.testing import available_backends
    >>> "torch" in available_backends()
    True
    """
    found = ["cpu"] if cpu.available() else []
    if cuda.available():
        found.append("cuda")
    return [*found, "torch"]


def _pairs(
    neuron: Neuron,
    backends: Iterable[str] | None,
    dtypes: Iterable[torch.dtype | str] | None,
) -> list[tuple[str, str]]:
    """The (backend, dtype name) pairs to check, after validating the request."""
    if not isinstance(neuron, Neuron):
        raise TypeError(f"assert_neuron_ok needs a symneuron.Neuron, got {type(neuron).__name__}")
    here = available_backends()
    chosen = here if backends is None else list(backends)
    for backend in chosen:
        if backend not in _DEVICES:
            raise ValueError(f"unknown backend {backend!r}; choose from {sorted(_DEVICES)}")
        if backend not in here:
            raise ValueError(
                f"backend {backend!r} is not available here (this machine runs {here}); "
                "leave backends=None to check the ones available"
            )
    names = [_dtypes.dtype_name(d) for d in (dtypes or _DEFAULT_DTYPES)]
    for name in names:
        if not isinstance(getattr(torch, name, None), torch.dtype):
            raise ValueError(f"unknown dtype {name!r}; give e.g. torch.float32 or 'float64'")
    pairs = []
    for backend in chosen:
        # the reference runs any dtype, but 16-bit types are storage types of the CUDA kernels
        takes = _dtypes.supported("cpu" if backend == "torch" else backend)
        pairs += [(backend, name) for name in names if name in takes]
    if not pairs:
        raise ValueError(
            f"none of the dtypes {names} runs on the backends {chosen}: float16 and bfloat16 "
            "need the cuda backend; add 'float32' or 'float64'"
        )
    return pairs


def assert_neuron_ok(
    neuron: Neuron,
    *,
    backends: Iterable[str] | None = None,
    dtypes: Iterable[torch.dtype | str] | None = None,
    T: int = 8,
    shape: tuple[int, ...] = (4, 16),
    seed: int = 0,
    tolerance: float | None = None,
    recurrent: bool = False,
) -> list[CheckReport]:
    """Assert that ``neuron``'s partials and kernels agree with their oracles.

    Runs :func:`symneuron.check` once per (backend, dtype) pair: each derived partial and
    the surrogate's σ' against central finite differences, and the backend's spikes, V,
    extra states and gradients (input, initial state, every learnable parameter) against
    the float64 torch reference on the same random inputs.

    Parameters
    ----------
    neuron : symneuron.Neuron
        The neuron under test.
    backends : iterable of str, optional
        Any of ``"cpu"``, ``"cuda"``, ``"torch"``; default: every backend
        :func:`available_backends` finds (asking for another is a ``ValueError``).
    dtypes : iterable of torch.dtype or str, optional
        Default: float64 and float32 on every backend, plus float16 and bfloat16 on
        ``"cuda"`` (the only backend with 16-bit kernels; other backends skip them).
    T, shape : int, tuple of int
        Time steps and neuron shape of the random inputs.
    seed : int
        Seed of the random inputs and evaluation points (the same on every run).
    tolerance : float, optional
        Maximum relative error of the kernels; default per dtype, as in ``check``.
    recurrent : bool
        Also check a recurrent layer of the neuron (``sn.check(recurrent=True)``).

    Returns
    -------
    list of CheckReport
        One report per (backend, dtype) pair, all passed.

    Raises
    ------
    AssertionError
        When any comparison fails; the message holds each failing report.

    Examples
    --------
    >>> import symneuron as sn
    >>> from symneuron.testing import assert_neuron_ok
    >>> reports = assert_neuron_ok(sn.models.LIF(learnable=["tau"]), backends=["torch"])
    >>> [(r.backend, r.dtype) for r in reports]
    [('torch', 'float64'), ('torch', 'float32')]
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this function's
    reports = _check_each(
        neuron, _pairs(neuron, backends, dtypes), T, shape, seed, tolerance, recurrent
    )
    _assert_all_passed(neuron.name, reports)
    return reports


def _check_each(
    neuron: Neuron,
    pairs: list[tuple[str, str]],
    T: int,
    shape: tuple[int, ...],
    seed: int,
    tolerance: float | None,
    recurrent: bool = False,
) -> list[CheckReport]:
    """One :func:`~symneuron.check` report per (backend, dtype name) pair, in order."""
    return [
        check(
            neuron,
            backend=backend,
            dtype=getattr(torch, name),
            device=_DEVICES[backend],
            T=T,
            shape=shape,
            tolerance=tolerance,
            seed=seed,
            recurrent=recurrent,
        )
        for backend, name in pairs
    ]


def _assert_all_passed(name: str, reports: list[CheckReport]) -> None:
    """Raise an AssertionError naming the pairs that passed and holding each failed report."""
    __tracebackhide__ = True  # pytest shows assert_neuron_ok's caller, not this function
    failed = [report for report in reports if not report.passed]
    if failed:
        passed = [f"{r.backend}/{r.dtype}" for r in reports if r.passed]
        lines = [
            f"{name}: {len(failed)} of {len(reports)} checks failed "
            f"(passed: {', '.join(passed) or 'none'})",
            *(str(report) for report in failed),
        ]
        raise AssertionError("\n".join(lines))
