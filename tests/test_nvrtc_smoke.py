"""NVRTC smoke tests: CUDA C -> PTX on a machine with no GPU and no driver."""

from __future__ import annotations

import sys

import pytest

from symneuron.runtime.nvrtc import NvrtcCompileError, compile_to_ptx, nvrtc_available

HALF_AND_DOUBLE_SRC = r"""
extern "C" __global__ void half_to_float(const unsigned short* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x[i]));
        y[i] = f;
    }
}

extern "C" __global__ void axpy_f64(const double* x, double* y, double a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = fma(a, x[i], y[i]) + exp(x[i]);
    }
}
"""


@pytest.fixture
def nvrtc_ready() -> None:
    """Skip when CuPy is absent; with CuPy present a missing libnvrtc must fail."""
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc")


@pytest.mark.usefixtures("nvrtc_ready")
def test_valid_kernels_compile_to_ptx() -> None:
    ptx = compile_to_ptx(HALF_AND_DOUBLE_SRC, name="smoke.cu")
    assert ".target sm_90" in ptx
    assert ".entry half_to_float(" in ptx
    assert ".entry axpy_f64(" in ptx
    assert "cvt.f32.f16" in ptx
    assert ".f64" in ptx


@pytest.mark.usefixtures("nvrtc_ready")
def test_syntax_error_raises_value_error_with_log() -> None:
    with pytest.raises(ValueError, match=r"bad\.cu") as info:
        compile_to_ptx('extern "C" __global__ void k(float* y) { y[0] = ; }', name="bad.cu")
    assert isinstance(info.value, NvrtcCompileError)
    assert "error" in info.value.log


def test_missing_cupy_raises_runtime_error_naming_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs.nvrtc", None)
    assert not nvrtc_available()
    with pytest.raises(RuntimeError, match="cupy-cuda13x"):
        compile_to_ptx("")
