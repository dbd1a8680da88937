"""Where randomness may enter a neuron's equations, checked (stage 0: imports only the
reserved symbols).

Two kinds (docs/noise.md):

* a standard-normal draw per neuron and step (:data:`symneuron.noise`; ``noise<i>`` for
  the other streams), which may enter a charge or a state's update only linearly
  (``σ·noise``, σ free of the draw: additive or multiplicative noise, the
  Euler–Maruyama form), so that the step map stays a smooth function of the draw;
* escape noise, ``firing="escape"``: S = [u < p(H)] with u uniform in (0, 1), p a
  probability written with :data:`symneuron.H` and the params.

A draw's stream is fixed by its symbol (``noise`` 0, ``noise<i>`` i), so the kernels and
the reference key it the same way (:mod:`symneuron.rng`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import sympy as sp
import torch

from .memo import BoundedTable
from .symbols import NOISE_STREAMS, H, noise_symbol

__all__ = [
    "NOISES",
    "SEED_LIMIT",
    "stream_of",
    "noise_streams",
    "check_linear_noise",
    "call_state",
    "check_probability",
    "check_seed",
    "check_state_values",
    "generator_state",
    "rank_seed",
]

#: seeds and offsets are integers in [0, 2^63)
SEED_LIMIT = 1 << 63

#: stream -> its draw's symbol
NOISES: dict[int, sp.Symbol] = {i: noise_symbol(i) for i in range(NOISE_STREAMS)}
_STREAM = {z: i for i, z in NOISES.items()}
#: values of H at which a spike probability is checked (with the default params)
_H_GRID = [sp.Float(h) for h in (-1e3, -100, -10, -3, -1, -0.3, 0, 0.3, 1, 3, 10, 100, 1e3)]


def stream_of(symbol: sp.Symbol) -> int | None:
    """The stream of a noise draw's symbol (None for any other symbol)."""
    return _STREAM.get(symbol)


def noise_streams(exprs: Iterable[object]) -> tuple[int, ...]:
    """The streams the expressions draw from, in order."""
    used = {s for e in exprs if isinstance(e, sp.Basic) for s in e.free_symbols}
    return tuple(sorted(i for z, i in _STREAM.items() if z in used))


def check_linear_noise(expr: sp.Expr, what: str) -> None:
    """Each draw enters ``expr`` linearly (its coefficient free of every draw), or a
    ``ValueError`` naming the fix."""
    for z in expr.free_symbols & set(_STREAM):
        slope = sp.diff(expr, z)
        if slope.free_symbols & set(_STREAM) or sp.diff(slope, z) != 0:
            raise ValueError(
                f"The {what} uses the draw {z} nonlinearly ({expr}); noise enters a step "
                f"only as coefficient*{z} (the coefficient may use V, X, the states and "
                "the params, not a draw): write e.g. V + ... + sigma*noise."
            )


def check_probability(
    p: sp.Expr, params: Mapping[str, float], symbols: Mapping[str, sp.Symbol]
) -> sp.Expr:
    """``p``, a spike probability p(H) in [0, 1] at the default params over a grid of H
    from −1000 to 1000, or a ``ValueError`` naming the fix."""
    unknown = sorted({s.name for s in p.free_symbols} - set(params) - {"H"})
    if unknown:
        raise ValueError(
            f"spike_probability uses {unknown}; it may use H and the params (give each a "
            "default in params={...})."
        )
    defaults = {symbols[n]: sp.Float(v) for n, v in params.items()}
    for h in _H_GRID:
        value = complex(p.xreplace({**defaults, H: h}).evalf(20))
        if value.imag != 0 or not 0 <= value.real <= 1:
            raise ValueError(
                f"spike_probability = {p} is {value.real:.6g} at H = {float(h):g} with the "
                "default params, outside [0, 1]; use a probability such as "
                "1/(1 + exp(-(H - theta)/delta)) or Min(1, exp((H - theta)/delta)/tau)."
            )
    return p


#: an odd 63-bit constant: rank r's seed is the drawn one XOR r·stride (mod 2^63), a
#: different key for every rank (Philox keys that differ give independent streams)
_RANK_STRIDE = 0x2545F4914F6CDD1D


def _rank() -> int:
    """This process's rank in the default process group (0 without one)."""
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def rank_seed(seed: int, rank: int | None = None) -> int:
    """A seed of this process's own for a seed shared by every rank: ``seed`` itself on
    rank 0, on rank r > 0 ``seed`` XOR r·stride (mod 2^63), a different Philox key, so
    each rank's rows draw an independent stream. Without it, ranks given one int seed
    draw the same numbers for their rows (a draw is keyed by step and neuron index, not
    by rank): correlated noise across the global batch.

    Parameters
    ----------
    seed : int in [0, 2^63)
    rank : int, optional
        Default: this process's rank in ``torch.distributed``'s default group (0 without
        one).

    Examples
    --------
    >>> import symneuron as sn
    >>> sn.rank_seed(7, rank=0), sn.rank_seed(7, rank=1) != 7
    (7, True)
    """
    seed = check_seed(seed)
    rank = _rank() if rank is None else rank
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an int >= 0, got {rank!r}")
    return seed ^ (rank * _RANK_STRIDE) % SEED_LIMIT if rank else seed


def check_seed(seed: Any, what: str = "seed") -> int:
    """``seed`` as an int in [0, 2^63), or a ``TypeError``/``ValueError`` naming the fix."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        if isinstance(seed, float) and math.isfinite(seed) and seed == int(seed):
            hint = f"; pass {int(seed)}"
        else:
            hint = ""
        raise TypeError(f"{what} must be an int in [0, 2**63) or None, got {seed!r}{hint}")
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(
            f"{what} must be in [0, 2**63), got {seed}; take it modulo 2**63, or pass "
            "None for a fresh seed from torch's generator (torch.manual_seed fixes it)."
        )
    return seed


def check_state_values(seed: int, offset: int) -> None:
    """Refuse a generator state [seed, offset] with an entry outside [0, 2^63) (a
    negative int64), on every backend alike: the cpu backend's state is checked where it
    enters (:func:`generator_state`), the torch reference's where it reads it."""
    for what, value in (("seed", seed), ("offset", offset)):
        if not 0 <= value < SEED_LIMIT:
            raise ValueError(
                f"a generator state [seed, offset] must hold values in [0, 2**63), got "
                f"{what} {value}; pass an int seed instead, or take the entries modulo 2**63."
            )


def generator_state(seed: Any, device: torch.device) -> torch.Tensor:
    """The kernels' generator state, an int64 [seed, offset] tensor on ``device``: from an
    int seed (offset 0), from None (a fresh seed drawn from torch's default generator, so
    ``torch.manual_seed`` makes runs reproducible; under ``torch.distributed``, mixed with
    the rank, so ranks seeded alike draw different numbers), or a given state tensor."""
    if isinstance(seed, torch.Tensor):
        if seed.dtype != torch.int64 or seed.shape != (2,) or seed.device != device:
            raise ValueError(
                f"a generator state must be an int64 tensor [seed, offset] on {device}, got "
                f"{seed.dtype} {tuple(seed.shape)} on {seed.device}"
            )
        if seed.device.type == "cpu" and not torch.compiler.is_compiling():  # no device sync
            check_state_values(*(int(v) for v in seed.tolist()))
        return seed
    if seed is None:  # a tensor op: under torch.compile, a fresh seed at every call
        drawn = torch.randint(0, SEED_LIMIT - 1, (1,), dtype=torch.int64)
        rank = _rank()  # DDP ranks seeded alike draw independent streams
        drawn = drawn ^ (rank * _RANK_STRIDE) % SEED_LIMIT if rank else drawn
        state = torch.cat([drawn, drawn.new_zeros(1)])
    else:
        state = torch.tensor([check_seed(seed), 0], dtype=torch.int64)
    # non-blocking: the pageable source is staged at once; a blocking copy would also wait
    # for the GPU to finish the work queued before it
    return state.to(device, non_blocking=True)


#: (seed, device) -> the state [seed, 0] of calls that only read it (:func:`call_state`)
_CALL_STATES: BoundedTable[tuple[int, torch.device], torch.Tensor] = BoundedTable(
    32, "stochastic.call_states"
)


def call_state(seed: Any, device: torch.device) -> torch.Tensor:
    """:func:`generator_state` for one ``simulate`` call, whose kernels only read it: the
    state of an int seed is made once per device and kept, so a repeated call copies
    nothing to the device (host time: a copy is about 10 us of a noisy call's launch,
    and it cannot be captured in a CUDA graph). Not for a state that is advanced in
    place (a layer's buffer)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or torch.compiler.is_compiling():
        return generator_state(seed, device)
    state = _CALL_STATES.get((seed, device))
    if state is None:
        state = _CALL_STATES.put((seed, device), generator_state(seed, device))
    return state
