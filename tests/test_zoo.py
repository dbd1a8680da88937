"""The zoo: every model builds, cites its source, runs its kernels as its float64 torch
reference does, and (for the models written here from their papers) matches an
independent loop of the paper's own equations. Crossing firing (no reset) is checked
against a plain Python loop. The ODE models are compared with Brian2 in
``test_brian2.py``; their CUDA sources are compiled by NVRTC below."""

from __future__ import annotations

import math
import os
import re

import pytest
import sympy as sp
import torch

import symneuron as sn
from symneuron.reference import torch_function

T, N = 400, 16

#: Input mean and spread per model, in its own units, chosen so that it fires.
DRIVE = {
    "Izhikevich2003": (10.0, 5.0),
    "AdEx2005": (900.0, 400.0),
    "HodgkinHuxley": (30.0, 20.0),
    "FitzHughNagumo": (0.6, 0.5),
    "ResonateAndFire": (0.3, 1.0),
    "IafCondExp": (60.0, 40.0),
    "IafPscExp": (400.0, 300.0),
    "ThetaNeuron": (0.3, 0.6),
    "AdLIF": (8.0, 4.0),
    "WangBuzsaki": (2.0, 1.0),
    "MorrisLecar": (150.0, 50.0),
    "Pospischil2008": (6.0, 3.0),
}


def _inputs(name: str, t_len: int = T) -> torch.Tensor:
    mean, spread = DRIVE.get(name, (0.8, 0.8))
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    return mean + spread * (2 * torch.rand(t_len, N, generator=gen, dtype=torch.float64) - 1)


def test_the_zoo_has_at_least_twenty_models_each_citing_its_source() -> None:
    assert len(sn.models.ZOO) >= 20
    for name, ctor in sn.models.ZOO.items():
        doc = ctor.__doc__ or ""
        cited = re.search(r"(19|20)\d\d|SpikingJelly|NEST|Brian2", doc)
        assert cited, f"{name}: its docstring names no source"
        assert isinstance(ctor(), sn.Neuron), name


@pytest.mark.parametrize("name", sorted(sn.models.PAPERS))
def test_paper_models_kernels_match_the_reference(name: str) -> None:
    neuron = sn.models.ZOO[name]()
    x = _inputs(name)
    if name == "HodgkinHuxley":
        neuron = sn.models.HodgkinHuxley(dt=0.025)  # 10 ms: time for spikes
    got = sn.simulate(neuron, x, backend="cpu")
    ref = sn.simulate(neuron, x, backend="torch")
    assert 0 < int(ref[0].sum()) < ref[0].numel() / 2, "vacuous: no or too many spikes"
    assert torch.equal(got[0], ref[0])
    scale = ref[1].abs().clamp_min(1.0)
    assert float(((got[1] - ref[1]).abs() / scale).max()) < 1e-10
    for state in neuron.states:
        assert torch.allclose(got[2][state], ref[2][state], rtol=1e-10, atol=1e-10), state


def test_hodgkin_huxley_passes_check() -> None:
    """Four states, crossing firing; the whole zoo's check is in test_testing.py."""
    report = sn.check(sn.models.HodgkinHuxley(dt=0.025))
    assert report.passed, str(report)


# -- crossing firing -------------------------------------------------------------------


def test_crossing_spikes_only_on_upward_crossings_and_never_resets() -> None:
    tau = sp.Symbol("tau")
    neuron = sn.Neuron(
        sn.V + (sn.X - sn.V) / tau, params={tau: 3.0}, firing="crossing", v_init=-0.5
    )
    gen = torch.Generator().manual_seed(7)
    x = 3 * torch.rand(80, 16, generator=gen, dtype=torch.float64) - 0.5
    # the oracle: a plain loop of the definition
    v = torch.full((16,), -0.5, dtype=torch.float64)
    spikes, vs = [], []
    for t in range(80):
        h = v + (x[t] - v) / 3.0
        spikes.append(((h >= 1.0) & (v < 1.0)).double())
        v = h
        vs.append(v)
    for backend in ("cpu", "torch"):
        s, v_seq = sn.simulate(neuron, x, backend=backend)
        assert torch.equal(s, torch.stack(spikes)), backend
        assert torch.allclose(v_seq, torch.stack(vs), rtol=0, atol=1e-14), backend
    s = torch.stack(spikes)
    assert s.sum() > 10 and (s[1:] * s[:-1]).sum() == 0  # several, never twice in a row
    assert float(torch.stack(vs).max()) > 1.5  # no reset: V stays above the threshold


def test_crossing_surrogate_gradient_is_gated_by_the_previous_state() -> None:
    """dS[t]/dH[t] = σ'(H − θ)·[V[t−1] < θ]: one step from above the threshold gives no
    gradient through the spike, one from below gives the surrogate's."""
    neuron = sn.Neuron(sn.V + sn.X, firing="crossing", v_init=0.0)
    for v0, expected in ((1.5, 0.0), (0.5, 1.0)):
        x = torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)
        v_init = torch.full((1,), v0, dtype=torch.float64)
        s, _ = sn.simulate(neuron, x, v_init=v_init, backend="cpu")
        (g,) = torch.autograd.grad(s.sum(), x)
        sig = 1 / (1 + math.exp(-4.0 * (v0 - 1.0)))
        assert float(g) == pytest.approx(expected * 4.0 * sig * (1 - sig), rel=1e-12)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"v_reset": None}, r"soft reset \(v_reset=None\) cannot apply"),
        ({"v_reset": 0.3}, r"no reset, but v_reset=0\.3 was given"),
        ({"firing": "edge"}, r"firing must be 'level' .* or 'crossing'"),
    ],
)
def test_crossing_errors_name_the_fix(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sn.Neuron(sn.V + sn.X, **{"firing": "crossing", **kw})


def test_crossing_with_an_on_spike_rule_is_rejected() -> None:
    w = sp.Symbol("w")
    with pytest.raises(ValueError, match=r"states \['w'\] have on_spike rules"):
        sn.Neuron(sn.V + sn.X - w, firing="crossing", states={w: sn.State(on_spike=w + sn.S)})


# -- models against their papers' own loops ----------------------------------------------


def test_adlif_matches_the_sparch_loop() -> None:
    """Bittar & Garner's step written as their code does (u, w, s; soft reset by s)."""
    alpha, beta, a, b = math.exp(-1 / 10), math.exp(-1 / 50), 0.4, 1.3
    neuron = sn.models.AdLIF(alpha, beta, a, b)
    x = _inputs("AdLIF")
    u = w = s = torch.zeros(N, dtype=torch.float64)
    spikes = []
    for t in range(T):
        w = beta * w + a * u + b * s
        u = alpha * (u - s) + (1 - alpha) * (x[t] - w)
        s = (u >= 1.0).double()
        spikes.append(s)
    expected = torch.stack(spikes)
    assert expected.sum() > 20
    for backend in ("cpu", "torch"):
        assert torch.equal(sn.simulate(neuron, x, backend=backend)[0], expected), backend


def test_refractory_lif_holds_v_for_t_ref_steps() -> None:
    neuron = sn.models.RefractoryLIF(tau=2.0, t_ref=3.0)
    x = torch.full((40, 1), 5.0, dtype=torch.float64)  # fires as soon as it may
    s, v, states = sn.simulate(neuron, x, backend="cpu")
    fired = s[:, 0].nonzero().flatten().tolist()
    assert fired == list(range(0, 40, 4))  # spike, 3 held steps, spike, ...
    for t in fired[:-1]:
        assert v[t + 1 : t + 4, 0].abs().max() == 0  # held at v_reset
        assert states["R"][t : t + 4, 0].tolist() == [3.0, 2.0, 1.0, 0.0]


def test_izhikevich_presets() -> None:
    rs, fs = sn.models.Izhikevich2003("RS"), sn.models.Izhikevich2003("FS")
    assert rs.params["a"] == 0.02 and fs.params["a"] == 0.1
    assert sn.models.Izhikevich2003("CH").v_reset == -50.0
    assert sn.models.Izhikevich2003("RS", d=4.0).params["d"] == 4.0
    with pytest.raises(ValueError, match=r"Unknown Izhikevich preset 'XX'; use one of"):
        sn.models.Izhikevich2003("XX")
    # the same constant drive: fast spiking fires more often than regular spiking
    x = torch.full((400, 1), 10.0, dtype=torch.float64)
    n_rs = sn.simulate(rs, x, backend="cpu")[0].sum()
    n_fs = sn.simulate(fs, x, backend="cpu")[0].sum()
    assert n_fs > 1.5 * n_rs > 0


def test_vtrap_has_no_singularity() -> None:
    """At V = −40 mV exactly (reachable with 16-bit storage) α_m is finite and continuous."""
    v = sp.Symbol("V")
    expr = sn.models.vtrap(-(v + 40), 10)
    at = float(expr.subs(v, -40.0))
    near = float(expr.subs(v, -40.0 + 1e-4))
    assert at == 10.0 and abs(at - near) < 1e-4


#: r = x/y on both sides of vtrap's removable singularity and of its Taylor band's edge
VTRAP_POINTS = (1e-5, -1e-4, 1e-3, -1e-2, 0.05, 0.0999, -0.1001, 0.5, -3.0, 8.0)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 6e-7), (torch.float64, 1e-14)])
def test_vtrap_and_its_derivative_are_accurate_near_the_singularity(
    dtype: torch.dtype, tol: float
) -> None:
    """Against r/expm1(r) and its derivative in 40-digit arithmetic (mpmath). NEURON's
    x/(exp(x/y) − 1) was 230 % off in its float32 derivative at r = 1e−4 (Pospischil2008's
    float32 gradients failed sn.check, issue 26) and 2e−6 off in float64 at r = 1e−5."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    x = sp.Symbol("x", real=True)
    f = torch_function([x], sn.models.vtrap(x, 1))
    for r in VTRAP_POINTS:
        point = torch.tensor(r, dtype=dtype, requires_grad=True)
        value = f(point)
        (slope,) = torch.autograd.grad(value, point)
        exact = mpmath.mpf(float(point.detach()))  # the rounded point
        em1 = mpmath.expm1(exact)
        want = (exact / em1, 1 / em1 - exact * mpmath.exp(exact) / em1**2)
        for got, ref in zip((value, slope), want, strict=True):
            got = float(got.detach())
            assert abs(got - float(ref)) <= tol * abs(float(ref)), (r, got, ref)


@pytest.mark.parametrize(
    ("name", "rest", "steps"),
    [
        ("Pospischil2008", -71.91, 40_000),
        ("WangBuzsaki", -64.02, 20_000),
        ("MorrisLecar", -60.86, 10_000),
    ],
)
def test_conductance_models_start_at_their_resting_potential(
    name: str, rest: float, steps: int
) -> None:
    """V[0] is where dV/dt = 0 with the gates at steady state: with no input, nothing
    moves for 1 s (Pospischil2008 started at E_L = −70.3 mV and relaxed 1.6 mV;
    WangBuzsaki at −65 mV, MorrisLecar at −60 mV)."""
    neuron = sn.models.ZOO[name]()
    out = sn.simulate(
        neuron, torch.zeros(steps, 1, dtype=torch.float64), backend="cpu", store_v_seq=True
    )
    assert abs(neuron.v_start - rest) < 5e-3
    assert float((out[1] - neuron.v_start).abs().max()) < 1e-9
    for name, seq in out[2].items():
        assert float((seq - neuron.states[name].init).abs().max()) < 1e-12, name


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(sn.models.PAPERS))
def test_paper_models_cuda_sources_compile_with_nvrtc(name: str) -> None:
    nvrtc = pytest.importorskip("symneuron.runtime.nvrtc")
    if not nvrtc.nvrtc_available():
        if os.environ.get("CI"):
            pytest.fail("CI must compile every CUDA variant: install 'symneuron[cuda]' (NVRTC)")
        pytest.skip("NVRTC not installed (pip install 'symneuron[cuda]')")
    neuron = sn.models.ZOO[name]()
    # float32 here, every entry point: tests/test_literals.py compiles each model's training
    # forward and backward in all four dtypes (the 16-bit storage path included), and the
    # GPU tests compile and run all four (bfloat16 here too took 46 s of a CI's 2 cores)
    for dtype in ("float32",):
        ptx = nvrtc.compile_to_ptx(neuron.source("cuda", dtype), name=f"{name}_{dtype}.cu")
        assert ptx.count(".entry") == 14, f"{name} {dtype}"
