"""Launch tuning, as module attributes read at every launch (documented knobs, not
internals: benchmarks sweep them by assignment, e.g.
``symneuron.runtime.settings.cuda_block = 128``).

Changing them affects later launches only; the generated source does not depend on
them (a source exports both lane counts of its dtype).
"""

from __future__ import annotations

#: Threads per block of every CUDA launch.
cuda_block: int = 256
#: Fewest threads for which a CUDA launch packs several neurons per thread (the
#: dtype's ``lanes``): below this, one neuron per thread keeps more of the GPU busy.
min_vector_threads: int = 64 * 1024
#: At most this many neurons per thread on CUDA, per loop iteration on the CPU;
#: ``None``: the dtype's width (:attr:`symneuron.dtypes.DType.lanes`). Kernels exist for
#: one neuron and for the dtype's width only, so a cap below the width means one.
max_lanes: int | None = None
