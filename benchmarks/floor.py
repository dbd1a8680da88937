"""The floor model (docs/performance.md): the fewest bytes a configuration must move.

Everything here is memory-bound, so a configuration's floor time is
``bytes_per_element(...) * T * N / copy bandwidth``. Per element [t, n], in [T, N]
tensors of the storage dtype:

- inference: read X, write S (2);
- forward of a training call: read X, write S and H, and each extra state's W̃, saved for
  the backward (3 + k);
- backward: read dL/dS, H and each W̃, write dL/dX (3 + k; 2 + k when dL/dS is a stride-0
  broadcast, as after ``spikes.sum()``, and is not read);
- training = forward + backward (6 + 2k: 24 B fp32 for a single-state model).

k is the number of the model's extra state variables whose W̃ the backward reads: all of
them, or none when the backward never reads W̃ (the derivation's ``needs_wt``; then the
kernels do not save it). Anything else a kernel moves (a V sequence nobody asked for, X
re-read in a backward) is above the floor. This module is the one definition, used by
``bench_neurons.py`` and ``report.py``.
"""

from __future__ import annotations

from functools import cache

ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8}


@cache
def extra_states(model: str) -> int:
    """k: the extra state variables of the zoo model ``model`` whose W̃ the training
    forward must save for the backward: all of them when the backward reads W̃, none
    when it does not (``needs_wt``: Izhikevich's W̃ enters its step only linearly)."""
    import symneuron as sn
    from symneuron import derivation

    return derivation.derive(getattr(sn.models, model)()).saved_states


def tensors(mode: str, states: int = 0, grad_spike_read: bool = True) -> int:
    """[T, N] tensors read or written per element by ``mode``: "inference", "forward"
    (training forward), "backward" or "training" (forward + backward)."""
    if mode == "inference":
        return 2
    forward, backward = 3 + states, 2 + grad_spike_read + states
    return {"forward": forward, "backward": backward, "training": forward + backward}[mode]


def bytes_per_element(model: str, mode: str, itemsize: int) -> int:
    """Minimal bytes per element of ``model`` in ``mode`` ("inference" or "training")."""
    return tensors(mode, extra_states(model)) * itemsize
