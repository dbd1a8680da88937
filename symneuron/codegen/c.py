"""The C dialect: the same step bodies, an OpenMP loop over neurons."""

from __future__ import annotations

from .kernels import Dialect, DTypeInfo

__all__ = ["C", "C_DTYPES"]

_PRELUDE = """#include <math.h>

#define K 1
typedef struct {
    {st} v[K];
} sn_vec;
"""

C = Dialect(
    name="c",
    prelude=_PRELUDE,
    restrict="restrict",
    vector="sn_vec",
    loop_open=(
        "#pragma omp parallel for schedule(static) if (N >= 262144)\n"
        "for (long long i0 = 0; i0 < N; i0 += K) {"
    ),
    loop_close="}",
    template=False,
)

C_DTYPES = {
    "float32": DTypeInfo("float32", "float", "float", "float"),
    "float64": DTypeInfo("float64", "double", "double", "double"),
}
