"""The recurrent passes of a program: one launch per sequence each way, one block per
batch row (:mod:`symneuron.codegen.recurrent` prints the kernels).

A row of ``F`` neurons runs on one block of ``ceil(F / K)`` threads (K lanes each: 1,
or the dtype's vector width when F exceeds :data:`MAX_THREADS`), with two halves of
``F`` compute values of shared memory for the spikes (forward) or the gradients
(backward) that the neurons exchange each step. On the CPU one thread runs a row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeVar

import torch

from .. import dtypes
from ..signature import RBACKWARD, RFORWARD, Geometry, Pass

__all__ = ["MAX_THREADS", "max_features", "forward", "backward"]

#: threads of one block (CUDA's limit)
MAX_THREADS = 1024
#: threads a neuron's transposed product is spread over in the backward (at most)
BACKWARD_PARTS = 4
#: rows of at least this many neurons (a multiple of the dtype's width) take the
#: dtype's width per thread: 16-byte loads of the weights
WIDE_FROM = MAX_THREADS + 1
#: neurons of one row the single-kernel path takes: its shared memory stays under the
#: 48 KB a block gets without opting in
MAX_FEATURES = 4096


def max_features(backend: str, dtype: torch.dtype) -> int:
    """The largest layer the fused kernels run on ``backend`` in ``dtype`` (the C kernels
    keep a row's state on the heap: any size)."""
    if backend != "cuda":
        return 2**62
    return min(MAX_FEATURES, MAX_THREADS * dtypes.lookup(backend, dtype).lanes)


def _lanes(prog: Any, features: int, dtype: torch.dtype) -> int:
    """Neurons per thread: 1, or the dtype's width for a row wider than a block."""
    limit = max_features(prog.backend, dtype)
    if features > limit:
        raise ValueError(
            f"symneuron: the fused recurrent kernel runs layers of up to {limit} neurons "
            f"on backend={prog.backend!r} in {dtypes.dtype_name(dtype)} (one block per batch "
            f"row, the exchanged values in its shared memory); this layer has {features}. "
            "Use backend='torch' (a loop over steps) for it, or a smaller layer."
        )
    if not prog.impl.simt:
        return 1
    width = dtypes.lookup(prog.backend, dtype).lanes
    if features >= WIDE_FROM and features % width == 0:
        return width
    if features <= MAX_THREADS:
        return 1
    if features % width:
        raise ValueError(
            f"symneuron: a recurrent layer of more than {MAX_THREADS} neurons on CUDA takes "
            f"{width} per thread in {dtypes.dtype_name(dtype)}: its size must be a multiple "
            f"of {width}, got {features}"
        )
    return width


def _launch(
    prog: Any,
    pass_: Pass,
    options: tuple[Any, ...],
    out: Any,
    values: dict[str, Any],
    features: int,
) -> None:
    """Launch the variant of ``pass_`` with ``options``: one block per row of
    ``features`` neurons, its arguments packed from the outputs ``out`` and ``values``."""
    kinds, pack, names, _ = prog._passes[pass_.name]
    first = values[names[0]]
    lanes = _lanes(prog, features, first.dtype)
    launch = prog.launcher(pass_, options, first, lanes)[1]
    geometry = _geometry(prog, pass_, first, features, lanes) if prog.impl.simt else None
    launch(kinds, pack(out, values), geometry)


def _geometry(prog: Any, pass_: Pass, first: torch.Tensor, features: int, lanes: int) -> Geometry:
    """One block per row: a thread per K neurons (rounded up to whole warps); the
    backward gives each neuron up to 4 threads for its transposed product, while they
    fit a block. Shared memory: the exchanged values' two halves, and the forward's
    spike votes or the backward's partial sums."""
    item = dtypes.lookup(prog.backend, first.dtype).torch_compute.itemsize
    row_threads = 32 * math.ceil(features / (32 * lanes))
    if pass_ is RFORWARD:
        words = 2 * (row_threads // 32) * lanes * 4  # uint32 votes, two halves
        return Geometry(first.shape[1] // features, row_threads, 2 * features * item + words)
    parts = max(1, min(BACKWARD_PARTS, MAX_THREADS // row_threads))
    rows = first.shape[1] // features
    base = -(-(2 + parts) * features * item // 16) * 16
    # then as many rows of the weight as fit (the kernel reads the rest from L2)
    chunk = -(-features // parts)
    whole = base + parts * chunk * features * first.element_size()
    room = _shared_room(first.device.index, rows, row_threads * parts)
    return Geometry(rows, row_threads * parts, max(base, min(whole, room)))


def _shared_room(device: int, rows: int, threads: int) -> int:
    """Shared bytes a block of the backward may take without running its ``rows`` blocks
    in more waves than they would run in with none: all of a block's opt-in limit when
    each SM runs one block, else the SM's bytes over the blocks it must hold."""
    from .cuda import shared_limits

    optin, per_sm, sms, sm_threads = shared_limits(device)
    blocks = max(1, min(sm_threads // threads, -(-rows // sms)))
    return min(optin, per_sm // blocks - 1024)  # the driver keeps 1 KB per block


_Maybe = TypeVar("_Maybe", torch.Tensor, None)


def _aligned(tensor: _Maybe) -> _Maybe:
    """``tensor``, copied when its start is not 16-byte aligned (a view with an offset):
    the kernels of several lanes per thread load 16 bytes at once."""
    return tensor if tensor is None or tensor.data_ptr() % 16 == 0 else tensor.clone()


def forward(
    prog: Any,
    x_seq: torch.Tensor,
    weight_t: torch.Tensor,
    s_init: torch.Tensor | None,
    v_init: torch.Tensor | None,
    w_init: torch.Tensor | None,
    params: Sequence[torch.Tensor],
    store_h: bool,
    v_mode: str,
    rng: torch.Tensor | None = None,
) -> Any:
    """The recurrent forward over ``x_seq`` [T, rows·F]: :data:`RFORWARD`'s outputs
    (those of :meth:`Program.forward` and X_eff [T, N] when stored for the backward).
    ``weight_t`` [F, F] is the effective weight transposed (contiguous); ``rng`` the
    generator's state of a neuron that draws (int64 [seed, offset])."""
    t_len, n = x_seq.shape
    features = weight_t.shape[0]
    x_seq = _aligned(x_seq)
    out = prog.forward_layout(x_seq, store_h, v_mode, True).outputs(x_seq)
    if n == 0 or t_len == 0:
        return out
    values = {
        "x_seq": x_seq, "weight_t": weight_t, "s_init": s_init, "v_init": v_init,
        "w_init": w_init, "params": params, "param_strides": prog._check_params(params),
        "T": t_len, "N": n, "F": features, "rng": rng,
    }  # fmt: skip
    _launch(prog, RFORWARD, (store_h, v_mode), out, values, features)
    return out


def backward(prog: Any, weight: torch.Tensor, rng: torch.Tensor | None = None) -> Any:
    """The recurrent backward, as a function of :meth:`Program.backward`'s arguments
    (``weight`` [F, F] the effective weight, contiguous; ``rng`` the forward's generator
    state, so that it draws the forward's numbers); ``grad_spike`` must be a full [T, N]
    tensor."""

    def run(
        grad_spike: torch.Tensor, grad_v_seq: Any, grad_w_seq: Any, h_seq: torch.Tensor,
        wt_seq: Any, x_seq: Any, v_init: Any, w_init: Any, params: Sequence[torch.Tensor],
        grad_v_mode: str,
    ) -> Any:  # fmt: skip
        t_len, n = h_seq.shape
        out = prog.backward_layout(h_seq, v_init, w_init, True).outputs(h_seq)
        if n == 0:
            return out
        values = {
            "grad_spike": _aligned(grad_spike.contiguous()), "grad_v_seq": _aligned(grad_v_seq),
            "grad_w_seq": _aligned(grad_w_seq), "h_seq": h_seq, "wt_seq": wt_seq,
            "x_seq": x_seq, "v_init": v_init, "w_init": w_init, "params": params,
            "weight": weight, "param_strides": prog._check_params(params),
            "grad_spike_scalar": 0, "T": t_len, "N": n, "F": weight.shape[0], "rng": rng,
        }  # fmt: skip
        _launch(prog, RBACKWARD, (grad_v_mode,), out, values, weight.shape[0])
        return out

    return run
