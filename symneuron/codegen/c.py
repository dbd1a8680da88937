"""The C dialect: the same step bodies, an OpenMP loop over neurons."""

from __future__ import annotations

from .kernels import Dialect, DTypeInfo

__all__ = ["C", "C_DTYPES"]

_PRELUDE = "#include <math.h>\n"

C = Dialect(
    name="c",
    prelude=_PRELUDE,
    qualifier="",
    restrict="restrict",
    loop_open="#pragma omp parallel for schedule(static)\nfor (long long i = 0; i < N; ++i) {",
    loop_close="}",
)

C_DTYPES = {
    "float32": DTypeInfo("float32", "float", "float", "float"),
    "float64": DTypeInfo("float64", "double", "double", "double"),
}
