"""ODE neurons (``sn.Neuron.from_ode``) on the GPU: the CUDA kernels against the float64
torch reference and the CPU kernels, for every model and method of tests/test_brian2.py."""

from __future__ import annotations

import pytest
import torch
from test_brian2 import CASES, _inputs, _neuron

import symneuron as sn

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize(("name", "method"), CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_cuda_ode_float64_matches_cpu(name: str, method: str) -> None:
    neuron = _neuron(name, method)
    x, v0 = _inputs(name)
    cpu = sn.simulate(neuron, x, v_init=v0, backend="cpu")
    gpu = sn.simulate(neuron, x.cuda(), v_init=v0.cuda(), backend="cuda")
    assert torch.equal(gpu[0].cpu(), cpu[0]), "spike trains differ"
    assert float(cpu[0].sum()) > 0
    # 1e-10 as against Brian2: the GPU contracts a*b + c into FMAs, the C build may not
    torch.testing.assert_close(gpu[1].cpu(), cpu[1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("name", "method"), CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_cuda_ode_check(name: str, method: str, dtype: torch.dtype) -> None:
    report = sn.check(_neuron(name, method), backend="cuda", device="cuda", dtype=dtype, seed=2)
    assert report.passed, str(report)
