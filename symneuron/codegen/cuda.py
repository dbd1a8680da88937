"""The CUDA dialect: one thread per neuron, a loop over t, no CUDA headers.

16-bit types are stored as ``unsigned short`` and converted with PTX ``cvt``
instructions, so NVRTC needs no ``cuda_fp16.h`` and compiles on a machine
without a GPU or a CUDA toolkit.
"""

from __future__ import annotations

from .kernels import Dialect, DTypeInfo

__all__ = ["CUDA", "CUDA_DTYPES"]

_PRELUDE = r"""
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
    prelude=_PRELUDE,
    restrict="__restrict__",
    vector="sn_vec<{st}, K>",
    loop_open=(
        "const long long i0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * K;\n"
        "if (i0 >= N) return;"
    ),
    loop_close="",
    template=True,
)

CUDA_DTYPES = {
    "float32": DTypeInfo("float32", "float", "float", "float", lanes=4),
    "float64": DTypeInfo("float64", "double", "double", "double", lanes=2),
    "float16": DTypeInfo(
        "float16", "unsigned short", "float", "float", "sn_h2f({})", "sn_f2h({})", lanes=4
    ),
    "bfloat16": DTypeInfo(
        "bfloat16", "unsigned short", "float", "float", "sn_b2f({})", "sn_f2b({})", lanes=4
    ),
}
