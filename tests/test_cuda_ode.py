"""ODE and paper neurons on the GPU: the CUDA kernels against the CPU kernels (float64,
every model and method of tests/test_brian2.py) and ``sn.check`` (partials, kernels and
gradients against the float64 reference) for every paper model in every CUDA dtype."""

from __future__ import annotations

import pytest
import torch
from test_brian2 import CASES, _inputs, _neuron

import symneuron as sn

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize(("name", "method"), CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_cuda_ode_float64_matches_cpu(name: str, method: str) -> None:
    neuron = _neuron(name, method)
    x, v0 = _inputs(name, neuron)
    cpu = sn.simulate(neuron, x, v_init=v0, backend="cpu")
    gpu = sn.simulate(neuron, x.cuda(), v_init=v0.cuda(), backend="cuda")
    assert torch.equal(gpu[0].cpu(), cpu[0]), "spike trains differ"
    assert float(cpu[0].sum()) > 0
    # 1e-9 of V's scale (Brian2 vs CPU: 1e-10): the GPU contracts a*b + c into FMAs, C does
    # not, and 200 steps of a spiking upstroke (v² in Izhikevich) amplify that last bit
    scale = float(cpu[1].abs().max().clamp_min(1.0))
    err = float((gpu[1].cpu() - cpu[1]).abs().max()) / scale
    assert err <= 1e-9, f"V: {err:.2e} of its scale"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(sn.models.PAPERS))
def test_cuda_paper_model_check(name: str, dtype: torch.dtype) -> None:
    # bf16 (8 bits): a learnable parameter's gradient sums T·N terms, each from bf16-stored
    # H and W̃; 2e-2 is five bf16 ulps (AdLIF's dL/dα measured 1.26e-2 on an H100)
    tolerance = 2e-2 if dtype == torch.bfloat16 else None
    neuron = sn.models.ZOO[name]()
    report = sn.check(
        neuron, backend="cuda", device="cuda", dtype=dtype, seed=2, tolerance=tolerance
    )
    assert report.passed, str(report)
