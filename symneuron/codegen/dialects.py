"""The target languages as data: what wraps the shared step bodies in C and in CUDA.

A :class:`Dialect` supplies only the scaffolding around the step bodies that
:mod:`~symneuron.codegen.steps` prints: qualifiers, the loop over neurons, the
K-lane vector type and helper functions. The storage and compute types come from
:mod:`symneuron.dtypes`.

* CUDA: one thread per K adjacent neurons (K = 1 or the dtype's lanes, a template
  parameter), a loop over t inside the thread, no CUDA headers: 16-bit values are
  stored as ``unsigned short`` and converted with PTX ``cvt`` instructions, so
  NVRTC compiles without ``cuda_fp16.h`` and without a GPU or a CUDA toolkit.
* C: the same step bodies, one function per K: 1, or the dtype's lanes, K adjacent
  neurons per loop iteration, whose lane loops the compiler vectorises (the last
  N mod K neurons run one at a time in the same function), and an OpenMP loop over
  neurons (only for large N).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Dialect", "C", "CUDA", "DIALECTS"]


@dataclass(frozen=True)
class Dialect:
    """Scaffolding of one target language around the shared step bodies.

    ``vector`` names the K-lane vector type of a storage type (``{st}``);
    ``template`` says whether the lane count K is a C++ template parameter
    (several exported kernels) or a macro set around each exported function, with
    ``vector`` a macro naming that K's struct (C).
    """

    name: str
    prelude: str
    restrict: str
    vector: str
    loop_open: str
    loop_close: str
    template: bool


_C_PRELUDE = """#include <math.h>
"""

#: the C struct of K storage values (one per lane count, before the functions using it)
C_VECTOR = """typedef struct {{
    {{st}} v[{k}];
}} sn_vec{k};
"""

C = Dialect(
    name="c",
    prelude=_C_PRELUDE,
    restrict="restrict",
    vector="sn_vec",
    # {begin}, {end}: the neurons this loop covers, K at a time (skeleton._c_function)
    loop_open=(
        "#pragma omp parallel for schedule(static) if ({end} >= 262144)\n"
        "for (long long i0 = {begin}; i0 < {end}; i0 += K) {{"
    ),
    loop_close="}",
    template=False,
)

_CUDA_PRELUDE = r"""
template <typename T, int K>
struct alignas(sizeof(T) * K) sn_vec {
    T v[K];
};

__device__ __forceinline__ float sn_h2f(unsigned short x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}
__device__ __forceinline__ unsigned short sn_f2h(float f) {
    unsigned short x;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x) : "f"(f));
    return x;
}
__device__ __forceinline__ float sn_b2f(unsigned short x) {
    return __uint_as_float(((unsigned int)x) << 16);
}
__device__ __forceinline__ unsigned short sn_f2b(float f) {
    unsigned short x;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(x) : "f"(f));
    return x;
}
"""

CUDA = Dialect(
    name="cuda",
    prelude=_CUDA_PRELUDE,
    restrict="__restrict__",
    vector="sn_vec<{st}, K>",
    loop_open=(
        "const long long i0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * K;\n"
        "if (i0 >= N) return;"
    ),
    loop_close="",
    template=True,
)

#: backend -> dialect
DIALECTS: dict[str, Dialect] = {"cpu": C, "cuda": CUDA}
