"""Noisy neurons (issue 24): white noise in discrete charges and ODEs, escape firing.

Oracles: closed-form moments of the discrete Ornstein–Uhlenbeck step, the escape
probability p(H) itself, the torch reference (float64, the same counter-based draws),
finite differences at a fixed seed, and the kernels' own reruns (same seed, chunks).
"""

from __future__ import annotations

import math
import re

import pytest
import sympy as sp
import torch
import torch.utils.checkpoint

import symneuron as sn
from symneuron import rng

TAU, SIGMA, MU = sp.symbols("tau sigma mu", positive=True)
THETA, DELTA = sp.symbols("theta delta", positive=True)


def ou_discrete(**kw: object) -> sn.Neuron:
    """V' = V + (mu − V)/tau + sigma·ζ: a = 1 − 1/tau, q = sigma²; no spike (θ = 1e9)."""
    charge = sn.V + (MU + sn.X - sn.V) / TAU + SIGMA * sn.noise
    params = {TAU: 5.0, SIGMA: 0.4, MU: 1.5}
    return sn.Neuron(charge, params=params, v_threshold=1e9, name="ou", **kw)  # type: ignore[arg-type]


def ou_ode(dt: float = 0.5) -> sn.Neuron:
    """dV/dt = (mu − V)/tau + sigma·ξ, Euler–Maruyama: a = 1 − dt/tau, q = dt·sigma²."""
    dv = (MU + sn.X - sn.V) / TAU + SIGMA * sn.xi
    params = {TAU: 5.0, SIGMA: 0.4, MU: 1.5}
    return sn.Neuron.from_ode(
        dv, dt=dt, method="euler", params=params, v_threshold=1e9, name="ou_ode"
    )


def noisy_ode(**kw: object) -> sn.Neuron:
    """A LIF written as an ODE with white noise: dV/dt = (X − V)/tau + sigma·ξ."""
    dv = (sn.X - sn.V) / TAU + SIGMA * sn.xi
    return sn.Neuron.from_ode(
        dv, dt=0.5, method="euler", params={TAU: 2.0, SIGMA: 0.5}, name="node", **kw
    )


def noisy_lif(**kw: object) -> sn.Neuron:
    charge = sn.V + (sn.X - sn.V) / TAU + SIGMA * sn.noise
    return sn.Neuron(charge, params={TAU: 2.0, SIGMA: 0.3}, name="nlif", **kw)  # type: ignore[arg-type]


def escape_lif(**kw: object) -> sn.Neuron:
    p = 1 / (1 + sp.exp(-(sn.H - THETA) / DELTA))
    return sn.Neuron(
        sn.V + (sn.X - sn.V) / TAU,
        params={TAU: 2.0, THETA: 1.0, DELTA: 0.2},
        firing="escape",
        spike_probability=p,
        name="esc",
        **kw,  # type: ignore[arg-type]
    )


def _moments(v: torch.Tensor) -> tuple[float, float, float, float, float, float]:
    """Mean, variance and lag-1 covariance over neurons of V[T−2], V[T−1], and their
    standard errors (independent neurons, Gaussian values)."""
    a, b = v[-2], v[-1]
    n = b.numel()
    mean, var = float(b.mean()), float(b.var())
    cov = float(((a - a.mean()) * (b - b.mean())).mean())
    se_cov = math.sqrt((float(a.var()) * var + cov**2) / n)
    return mean, var, cov, math.sqrt(var / n), var * math.sqrt(2 / (n - 1)), se_cov


@pytest.mark.parametrize(("make", "dt"), [(ou_discrete, 1.0), (ou_ode, 0.5)])
@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_ou_membrane_has_the_closed_form_discrete_moments(make, dt, backend) -> None:
    """From V[0] = 0: E V[t] = mu(1 − a^t), Var V[t] = q(1 − a^2t)/(1 − a²),
    Cov(V[t−1], V[t]) = a·Var V[t−1], with a = 1 − dt/tau, q = dt·sigma² (DESIGN §3c);
    within 5 standard errors over 2^16 neurons."""
    neuron, steps, n = make(), 40, 2**16
    x = torch.zeros(steps, n, dtype=torch.float64)
    _, v = sn.simulate(neuron, x, v_init=0.0, backend=backend, seed=2024)
    a, q = 1 - dt / 5.0, dt * 0.4**2
    mean_t = 1.5 * (1 - a**steps)
    var_prev = q * (1 - a ** (2 * (steps - 1))) / (1 - a**2)
    var_t = q * (1 - a ** (2 * steps)) / (1 - a**2)
    mean, var, cov, se_m, se_v, se_c = _moments(v)
    assert abs(mean - mean_t) < 5 * se_m, (mean, mean_t, se_m)
    assert abs(var - var_t) < 5 * se_v, (var, var_t, se_v)
    assert abs(cov - a * var_prev) < 5 * se_c, (cov, a * var_prev, se_c)
    assert abs(var - var_t) > 0 and var_t > 0.1  # (a real variance, not zero noise)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("make", [noisy_lif, noisy_ode, escape_lif])
def test_cpu_kernels_draw_what_the_reference_draws(make, dtype) -> None:
    """Same seed: the same spikes, and V to rounding (float32 kernels against a float32
    reference run the same draws: bit for bit here)."""
    gen = torch.Generator().manual_seed(5)
    x = (1.2 * torch.rand(24, 3, 37, generator=gen, dtype=torch.float64)).to(dtype)
    neuron = make()
    s_k, v_k = sn.simulate(neuron, x, backend="cpu", seed=77)
    s_r, v_r = sn.simulate(neuron, x, backend="torch", seed=77)
    assert 0 < float(s_r.sum()) < s_r.numel()
    assert torch.equal(s_k, s_r)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert float((v_k - v_r).abs().max()) <= tol


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("make", [noisy_lif, escape_lif])
def test_same_seed_same_path_other_seed_other_path(make, backend) -> None:
    x = torch.full((30, 64), 0.6, dtype=torch.float64)
    neuron = make()
    s1, v1 = sn.simulate(neuron, x, backend=backend, seed=1)
    s2, v2 = sn.simulate(neuron, x, backend=backend, seed=1)
    s3, v3 = sn.simulate(neuron, x, backend=backend, seed=2)
    assert torch.equal(s1, s2) and torch.equal(v1, v2)
    assert not torch.equal(s1, s3)


def test_seed_none_follows_torch_manual_seed() -> None:
    x = torch.full((10, 32), 0.6, dtype=torch.float64)
    torch.manual_seed(3)
    a = sn.simulate(noisy_lif(), x, backend="cpu")[1]
    b = sn.simulate(noisy_lif(), x, backend="cpu")[1]
    torch.manual_seed(3)
    c = sn.simulate(noisy_lif(), x, backend="cpu")[1]
    assert torch.equal(a, c) and not torch.equal(a, b)


def test_an_int_seed_is_made_on_the_device_once_and_a_layer_never_shares_it() -> None:
    """simulate keeps the state of an int seed per device (no host-to-device copy per
    call); a layer's state, advanced in place, is its own, so a layer seeded alike
    leaves simulate's draws unchanged."""
    from symneuron import stochastic

    cpu = torch.device("cpu")
    first = stochastic.call_state(41, cpu)
    assert stochastic.call_state(41, cpu) is first and first.tolist() == [41, 0]
    assert stochastic.call_state(42, cpu).tolist() == [42, 0]
    x = torch.full((8, 32), 0.6, dtype=torch.float64)
    before = sn.simulate(noisy_lif(), x, backend="cpu", seed=41)[1]
    layer = sn.NeuronLayer(noisy_lif(), backend="cpu", seed=41)
    layer(x), layer(x)  # advances the layer's state to [41, 16]
    assert layer.rng_state.tolist() == [41, 16] and first.tolist() == [41, 0]
    assert torch.equal(sn.simulate(noisy_lif(), x, backend="cpu", seed=41)[1], before)


def test_simulate_under_torch_compile_draws_as_eager() -> None:
    """fullgraph: an int seed gives the eager path; seed=None a fresh one per call, drawn
    from torch's generator inside the graph (torch.manual_seed reproduces it)."""
    x = torch.rand(10, 64, generator=torch.Generator().manual_seed(1))
    neuron = noisy_lif()
    fixed = torch.compile(
        lambda xs: sn.simulate(neuron, xs, backend="cpu", seed=3)[1], fullgraph=True
    )
    assert torch.equal(fixed(x), sn.simulate(neuron, x, backend="cpu", seed=3)[1])
    fresh = torch.compile(lambda xs: sn.simulate(neuron, xs, backend="cpu")[1], fullgraph=True)
    torch.manual_seed(0)
    a, b = fresh(x), fresh(x)
    torch.manual_seed(0)
    assert torch.equal(fresh(x), a) and not torch.equal(a, b)


def test_the_offset_continues_the_steps_of_the_previous_call() -> None:
    """A generator state [seed, offset] starts the draws at step ``offset``."""
    x = torch.full((12, 16), 0.3, dtype=torch.float64)
    neuron = noisy_lif(v_threshold=1e9)
    _, v_all = sn.simulate(neuron, x, v_init=0.0, backend="cpu", seed=9)
    _, v_head = sn.simulate(neuron, x[:5], v_init=0.0, backend="cpu", seed=9)
    state = torch.tensor([9, 5])
    _, v_tail = sn.simulate(neuron, x[5:], v_init=v_head[-1], backend="cpu", seed=state)
    assert torch.equal(torch.cat([v_head, v_tail]), v_all)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("make", [noisy_lif, escape_lif])
def test_layer_chunks_draw_what_one_long_call_draws(make, backend) -> None:
    gen = torch.Generator().manual_seed(8)
    x = torch.rand(20, 2, 33, generator=gen, dtype=torch.float64)
    one, two = (sn.NeuronLayer(make(), backend=backend, seed=123) for _ in range(2))
    whole = one(x)
    chunks = torch.cat([two(x[:7]), two(x[7:12]), two(x[12:])])
    assert torch.equal(whole, chunks) and 0 < float(whole.sum())
    assert one.rng_state.tolist() == [123, 20] == two.rng_state.tolist()
    again = one(x)  # the next call draws new numbers
    assert not torch.equal(again, whole)


def _two_calls(layer: torch.nn.Module, x: torch.Tensor, run=None) -> tuple[torch.Tensor, ...]:
    """Spikes of two calls and the input's gradient of a loss on both."""
    xs = x.clone().requires_grad_(True)
    call = layer if run is None else run
    first, second = call(xs), call(xs)
    (first.sum() + 2 * second.sum()).backward()
    return first, second, xs.grad


@pytest.mark.parametrize("how", ["compile", "checkpoint"])
def test_a_compiled_or_checkpointed_layer_draws_what_the_eager_one_draws(how) -> None:
    """torch.compile(fullgraph=True): the generator state advances inside the graph and
    the backward reads the call's own; checkpoint: the recomputation redraws the first
    run's numbers. Spikes and gradients equal the eager layer's."""
    neuron = noisy_lif(learnable=["tau"])
    x = torch.rand(10, 4, 16, generator=torch.Generator().manual_seed(2))
    eager = _two_calls(sn.NeuronLayer(neuron, backend="cpu", seed=5), x)
    layer = sn.NeuronLayer(neuron, backend="cpu", seed=5)
    if how == "compile":
        got = _two_calls(layer, x, torch.compile(layer, fullgraph=True))
    else:
        got = _two_calls(
            layer, x, lambda xs: torch.utils.checkpoint.checkpoint(layer, xs, use_reentrant=False)
        )
    assert not torch.equal(eager[0], eager[1])
    assert all(torch.equal(a, b) for a, b in zip(eager, got, strict=True))
    assert layer.rng_state.tolist() == [5, 20]


def test_ranks_seeded_alike_draw_different_numbers(monkeypatch) -> None:
    """seed=None under torch.distributed: the drawn seed is mixed with the rank."""
    from symneuron import stochastic

    seeds = []
    for rank in (0, 1, 2):
        monkeypatch.setattr(stochastic, "_rank", lambda r=rank: r)
        torch.manual_seed(0)
        seeds.append(int(stochastic.generator_state(None, torch.device("cpu"))[0]))
    assert len(set(seeds)) == 3 and all(0 <= s < 2**63 for s in seeds)


def test_layer_seed_none_follows_torch_manual_seed() -> None:
    torch.manual_seed(4)
    a = sn.NeuronLayer(noisy_lif(), backend="cpu")
    torch.manual_seed(4)
    b = sn.NeuronLayer(noisy_lif(), backend="cpu")
    x = torch.full((6, 10), 0.7)
    assert torch.equal(a(x), b(x))


@pytest.mark.parametrize("make", [noisy_lif, escape_lif])
def test_kernel_gradients_equal_the_reference_and_finite_differences(make) -> None:
    """At a fixed seed the noise is a fixed function of it: float64 gradients of the
    kernels equal the reference's and central finite differences of the reference."""
    neuron = make(learnable=["tau"])
    gen = torch.Generator().manual_seed(11)
    x = 0.9 * torch.rand(10, 24, generator=gen, dtype=torch.float64)
    w = torch.randn(10, 24, generator=gen, dtype=torch.float64)

    def loss(backend: str, tau: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
        s, v = sn.simulate(neuron, xs, params={"tau": tau}, backend=backend, seed=31)
        return (w * v).sum() + (w * s).sum()

    tau = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    xs = x.clone().requires_grad_(True)
    g_k = torch.autograd.grad(loss("cpu", tau, xs), [tau, xs])
    g_r = torch.autograd.grad(loss("torch", tau, xs), [tau, xs])
    assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(g_k, g_r, strict=True))
    if neuron.firing == "escape":
        return  # spikes are not differentiable: the straight-through gradient is p's
    eps = 1e-6
    with torch.no_grad():  # V of a noisy LIF that never fires: smooth in tau
        smooth = neuron.replace(v_threshold=1e9)
        runs = [
            sn.simulate(smooth, x, params={"tau": t}, backend="torch", seed=31)
            for t in (2.0 + eps, 2.0 - eps)
        ]
        f = [float((w * run[1]).sum()) for run in runs]
    tau2 = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    v = sn.simulate(smooth, x, params={"tau": tau2}, backend="cpu", seed=31)[1]
    (g,) = torch.autograd.grad((w * v).sum(), [tau2])
    assert abs(float(g) - (f[0] - f[1]) / (2 * eps)) < 1e-6 * max(1.0, abs(float(g)))


@pytest.mark.parametrize(
    ("make", "learnable"),
    [
        (noisy_lif, ["tau"]),
        (noisy_lif, ["sigma", "tau"]),
        (escape_lif, ["tau"]),
        (escape_lif, ["theta", "delta"]),
        (noisy_ode, ["tau", "sigma"]),
    ],
)
def test_sn_check_supports_noisy_neurons_at_a_fixed_seed(make, learnable) -> None:
    """The backward reads the draws (dH/dsigma = noise) and redraws the escape uniform of
    step t − 1 when it recomputes S[t−1] (learnable tau: V[t−1] is needed)."""
    neuron = make(learnable=learnable)
    report = sn.check(neuron, backend="cpu", seed=3)
    assert report.passed, str(report)


def test_escape_firing_rate_is_p_of_h() -> None:
    """H = X (no memory: a·V with a = 0): the fraction of spikes at each X is p(X) within
    5 standard errors over 2^16 neuron-steps per level."""
    a = sp.Symbol("a")
    p = 1 / (1 + sp.exp(-(sn.H - THETA) / DELTA))
    neuron = sn.Neuron(
        a * sn.V + sn.X,
        params={a: 0.0, THETA: 1.0, DELTA: 0.2},
        firing="escape",
        spike_probability=p,
    )
    levels = torch.tensor([0.4, 0.8, 1.0, 1.3, 1.8], dtype=torch.float64)
    x = levels.repeat_interleave(4096).expand(16, -1).contiguous()
    for backend in ("cpu", "torch"):
        s, _ = sn.simulate(neuron, x, backend=backend, seed=99)
        rate = s.reshape(16, len(levels), 4096).mean(dim=(0, 2))
        expected = torch.sigmoid((levels - 1.0) / 0.2)
        se = (expected * (1 - expected) / (16 * 4096)).sqrt()
        assert bool(((rate - expected).abs() < 5 * se).all()), (backend, rate, expected)


def test_the_escape_uniform_decides_the_spike() -> None:
    """S[t] = [u < p(H[t])] with u the escape stream's uniform, bit for bit."""
    a = sp.Symbol("a")
    p = 1 / (1 + sp.exp(-(sn.H - THETA) / DELTA))
    neuron = sn.Neuron(
        a * sn.V + sn.X,
        params={a: 0.0, THETA: 1.0, DELTA: 0.2},
        firing="escape",
        spike_probability=p,
    )
    x = torch.linspace(0.0, 2.0, 64, dtype=torch.float64).expand(5, -1).contiguous()
    s, _ = sn.simulate(neuron, x, backend="cpu", seed=17)
    steps, neurons = torch.arange(5)[:, None], torch.arange(64)
    u = rng.uniform(17, 0, rng.ESCAPE_STREAM, steps, neurons, torch.float64)
    assert torch.equal(s, (u < torch.sigmoid((x - 1.0) / 0.2)).double())


def test_noise_enters_each_equation_as_its_own_stream() -> None:
    """From an ODE with xi in V and in a state: stream 0 for V, 1 for the state."""
    w = sp.Symbol("w")
    neuron = sn.Neuron.from_ode(
        -sn.V + w + sn.X + 0.5 * sn.xi,
        dt=0.25,
        method="euler",
        states={w: sn.ODEState(-w + 0.3 * sn.xi)},
    )
    assert neuron.noise_streams == (0, 1)
    z0, z1 = sp.Symbol("noise", real=True), sp.Symbol("noise1", real=True)
    assert sp.simplify(neuron.charge.diff(z0) - 0.5 * 0.5) == 0  # sqrt(dt)·sigma
    assert sp.simplify(neuron.states["w"].update.diff(z1) - 0.5 * 0.3) == 0
    report = sn.check(neuron, backend="cpu", seed=1)
    assert report.passed, str(report)


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: sn.Neuron(sn.V + sn.X + sp.exp(sn.noise)), ValueError, "nonlinearly"),
        (lambda: sn.Neuron(sn.V + sn.X + sn.noise**2), ValueError, "nonlinearly"),
        (lambda: sn.Neuron(sn.V + sn.X, v_threshold=1 + sn.noise), ValueError, "noise"),
        (
            lambda: sn.Neuron.from_ode(-sn.V + sn.X + sn.xi, dt=0.5, method="rk4"),
            ValueError,
            "method='euler'",
        ),
        (
            lambda: sn.Neuron.from_ode(-sn.V + sn.X + sn.xi, dt=0.5, method="exp_euler"),
            ValueError,
            "method='euler'",
        ),
        (
            lambda: sn.Neuron.from_ode(-sn.V + sn.X + sn.xi**2, dt=0.5, method="euler"),
            ValueError,
            "not linear in xi",
        ),
        (lambda: sn.Neuron(sn.V + sn.X + sn.xi), ValueError, "xi"),
        (lambda: sn.Neuron(sn.V + sn.X, firing="escape"), ValueError, "spike_probability"),
        (lambda: sn.Neuron(sn.V + sn.X, spike_probability=sn.H), ValueError, "firing='escape'"),
        (
            lambda: sn.Neuron(sn.V + sn.X, firing="escape", spike_probability=2 * sn.H),
            ValueError,
            r"outside \[0, 1\]",
        ),
    ],
)
def test_misplaced_noise_raises_an_error_naming_the_fix(build, error, match) -> None:
    with pytest.raises(error, match=match):
        build()


@pytest.mark.parametrize(
    ("seed", "error", "match"),
    [
        (-1, ValueError, r"\[0, 2\*\*63\)"),
        (2**63, ValueError, r"\[0, 2\*\*63\)"),
        (1.0, TypeError, "pass 1"),
        (float("nan"), TypeError, "int"),
        (True, TypeError, "int"),
        ("3", TypeError, "int"),
        (torch.tensor([1, 2, 3]), ValueError, r"int64 tensor \[seed, offset\]"),
    ],
)
def test_a_bad_seed_raises_an_error_naming_the_fix(seed, error, match) -> None:
    x = torch.zeros(3, 4)
    with pytest.raises(error, match=match):
        sn.simulate(noisy_lif(), x, backend="cpu", seed=seed)
    if not isinstance(seed, torch.Tensor):
        with pytest.raises(error, match=match):
            sn.NeuronLayer(noisy_lif(), seed=seed)


def test_a_quiet_neuron_keeps_its_kernels_and_ignores_the_seed() -> None:
    lif = sn.models.LIF()
    assert not lif.draws and "sn_rng" not in lif.source("cpu") and "rng" not in lif.source("cuda")
    x = torch.rand(5, 8)
    assert torch.equal(sn.simulate(lif, x, seed=1)[1], sn.simulate(lif, x, seed=2)[1])
    assert "rng_state" not in dict(sn.NeuronLayer(lif).named_buffers())


@pytest.mark.parametrize("make", [noisy_lif, escape_lif])
def test_nir_export_refuses_a_neuron_that_draws(make) -> None:
    pytest.importorskip("nir")
    with pytest.raises(ValueError, match="draws random numbers"):
        sn.nir.export(sn.NeuronLayer(make()), torch.rand(3, 2, 4), dt=1.0)


def test_the_fused_recurrent_kernels_draw_what_the_torch_loop_draws() -> None:
    """A seeded RecurrentNeuronLayer: the fused kernels and the loop over steps give the
    same spikes (more in tests/test_recurrent_noise.py)."""
    x = 2.0 * torch.rand(12, 2, 8, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    spikes = []
    for backend in ("cpu", "torch"):
        layer = sn.RecurrentNeuronLayer(noisy_lif(), 8, backend=backend, seed=4).double()
        with torch.no_grad():
            layer.weight.copy_(torch.linspace(-1, 1, 64, dtype=torch.float64).view(8, 8))
        spikes.append(torch.cat([layer(x[:5]), layer(x[5:])]).detach())
    assert 0 < float(spikes[1].mean()) < 0.9
    assert torch.equal(spikes[0], spikes[1])


@pytest.mark.parametrize("make", [noisy_lif, escape_lif, ou_ode])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_noisy_cuda_sources_compile_with_nvrtc(make, dtype) -> None:
    nvrtc = pytest.importorskip("symneuron.runtime.nvrtc")
    if not nvrtc.nvrtc_available():
        pytest.skip("NVRTC not available")
    neuron = make()
    source = neuron.source("cuda", dtype)
    assert "sn_rng_" in source
    ptx = nvrtc.compile_to_ptx(source, name=f"{neuron.name}.cu")
    assert "_forward_h_seq_k1" in ptx and "_backward_seq_k1" in ptx


@pytest.mark.parametrize("name", ["NoisyLIF", "EscapeLIF"])
def test_the_noisy_zoo_models_pass_sn_check_and_fire(name) -> None:
    neuron = sn.models.NOISY[name]()
    assert name in (neuron.__doc__ or "") or sn.models.NOISY[name].__doc__
    report = sn.check(neuron, backend="cpu", seed=4)
    assert report.passed, str(report)
    rows = [r.name for r in report.results]
    assert ("dp/dH vs finite diff" in rows) == (name == "EscapeLIF")
    rate = sn.simulate(neuron, torch.zeros(1000, 512, dtype=torch.float64), seed=1)[0].mean()
    assert 0 < float(rate) < 0.05  # spikes per 0.1 ms step: between 0 and 500 Hz


def test_brunels_noisy_lif_membrane_has_variance_sigma_squared_over_two() -> None:
    """Below threshold, tau dV/dt = mu - V + sigma sqrt(tau) xi is an OU process of
    variance sigma²/2 (its Euler–Maruyama step: q/(1 − a²) with a = 1 − dt/tau, q =
    sigma² dt/tau, which is sigma²/(2 − dt/tau)); within 5 standard errors."""
    neuron = sn.models.NoisyLIF(v_threshold=1e9)
    _, v = sn.simulate(
        neuron, torch.zeros(3000, 8192, dtype=torch.float64), v_init=24.0, seed=3, store_v_seq=False
    )
    expected, n = 25.0 / (2 - 0.1 / 20.0), v.numel()
    assert abs(float(v.var()) - expected) < 5 * expected * math.sqrt(2 / (n - 1))
    assert abs(float(v.mean()) - 24.0) < 5 * math.sqrt(expected / n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_c_steps_draw_their_lanes_at_once_with_nothing_left_a_call(dtype) -> None:
    """A C step fills its lanes' normals (and escape uniforms) before the lane loop (one
    Philox block per four lanes), through functions that are always inlined (a call
    keeps the loop scalar: 25 -> 4.4 ns a noisy LIF step); the draws equal the reference's
    (test_cpu_kernels_draw_what_the_reference_draws runs the 64-lane and 1-lane kernels)."""
    source = noisy_lif().source("cpu", dtype)
    real = {torch.float32: "float", torch.float64: "double"}[dtype]
    kernels = source[source.index("void nlif_forward") :]
    assert f"sn_rng_normals_{real}(noise_l, K, " in kernels
    assert f"sn_rng_normal_{real}(" not in kernels and "noise_l[j]" in kernels
    inline = "static inline __attribute__((always_inline))"
    assert f"{inline} void sn_rng_normals_{real}(" in source
    assert f"{inline} sn_pair_{real} sn_box_muller_{real}(" in source
    escape = escape_lif().source("cpu", dtype)  # escape firing's uniforms alike
    kernels = escape[escape.index("void esc_forward") :]
    assert f"sn_rng_uniforms_{real}(esc_l, K, " in kernels and "esc_l[j] <" in kernels
    assert f"sn_rng_uniforms_{real}(escp_l, K, " in kernels  # the backward's step t - 1
    assert f"sn_rng_uniform_{real}(" not in kernels


def test_cuda_lanes_of_a_group_share_one_philox_block() -> None:
    """K = 4: the four lanes of a group compute one Philox call per step (the PTX holds a
    round constant of Philox 7 times per call): fewer than the K = 1 kernel, whose time
    loop is unrolled twice as far, where four calls per step would be 4.4 times more."""
    nvrtc = pytest.importorskip("symneuron.runtime.nvrtc")
    if not nvrtc.nvrtc_available():
        pytest.skip("NVRTC not available")
    ptx = nvrtc.compile_to_ptx(noisy_lif().source("cuda", torch.float32), name="nlif.cu")
    entries = dict(re.findall(r"\.entry (\w+)\((.*?)\n\}\n", ptx, re.S))
    rounds = {
        k: sum(body.count(c) for c in ("3528531795", "-766435501"))
        for k, body in entries.items()
        if "forward_h_seq" in k
    }
    one, four = rounds["nlif_forward_h_seq_k1"], rounds["nlif_forward_h_seq_k4"]
    assert 0 < four < one, rounds


@pytest.mark.parametrize(
    ("dtype", "draw", "one_pair"),
    [
        (torch.float32, "sn_rng_normals_float<K>", "div.rn.f32"),
        (torch.bfloat16, "sn_rng_normals_fast_float<K>", "lg2.approx.ftz.f32"),
    ],
)
def test_cuda_steps_draw_their_lanes_at_once_16_bit_kernels_by_the_fast_conversion(
    dtype, draw, one_pair
) -> None:
    """A step fills its K lanes' normals before the lane loop (fast conversion for 16-bit
    kernels only): in the K = 4 forward, two Box–Muller pairs per step (per load of X)."""
    nvrtc = pytest.importorskip("symneuron.runtime.nvrtc")
    source = noisy_lif().source("cuda", dtype)
    assert draw in source and "noise_l[j]" in source
    assert ("sn_rng_normals_fast_float<K>(" in source) == (dtype == torch.bfloat16)
    if not nvrtc.nvrtc_available():
        pytest.skip("NVRTC not available")
    ptx = nvrtc.compile_to_ptx(source, name="nlif.cu")
    body = dict(re.findall(r"\.entry (\w+)\((.*?)\n\}\n", ptx, re.S))["nlif_forward_h_seq_k4"]
    steps = len(re.findall(r"ld\.global\.nc\.v4\.(?:f32|u16)", body))
    assert steps >= 2 and body.count(one_pair) == 2 * steps, (steps, body.count(one_pair))


# -- on a GPU (the lead runs these) -----------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("make", [noisy_lif, escape_lif, noisy_ode])
def test_cuda_kernels_draw_what_the_cpu_kernels_draw(make, dtype) -> None:
    """The same seed on CUDA: the same spikes as the reference (bf16: the reference
    rounded as the kernels store), V and gradients to rounding; K = 4 lanes included."""
    neuron = make(learnable=["tau"])
    gen = torch.Generator().manual_seed(6)
    x = 1.2 * torch.rand(16, 4 * 65536 + 4, generator=gen, dtype=torch.float64)
    for n in (4 * 65536, 4 * 65536 + 4, 1000):  # wide lanes, and one neuron per thread
        xs = x[:, :n].to(dtype)
        s_c, v_c = sn.simulate(neuron, xs.cuda(), backend="cuda", seed=5)
        if dtype == torch.bfloat16:
            report = sn.check(neuron, backend="cuda", dtype=dtype, device="cuda", seed=5)
            assert report.passed, str(report)
            continue
        s_r, v_r = sn.simulate(neuron, xs, backend="cpu", seed=5)
        assert torch.equal(s_c.cpu(), s_r)
        assert float((v_c.cpu() - v_r).abs().max()) < (1e-12 if dtype == torch.float64 else 1e-4)
    report = sn.check(neuron, backend="cuda", device="cuda", seed=5)
    assert report.passed, str(report)


@pytest.mark.cuda
def test_a_captured_cuda_graph_draws_fresh_noise_at_each_replay() -> None:
    layer = sn.NeuronLayer(noisy_lif(), backend="cuda", seed=3).cuda()
    x = torch.full((8, 1024), 0.5, device="cuda")
    layer(x)
    layer.reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(x)
        layer.reset()
    graph.replay()
    first = out.clone()
    graph.replay()
    assert not torch.equal(first, out)
    reference = sn.NeuronLayer(noisy_lif(), backend="cuda", seed=3).cuda()
    for _ in range(2):  # warm-up (offset 0), then the first replay (offset 8)
        expected = reference(x)
        reference.reset()
    assert torch.equal(expected, first)


@pytest.mark.cuda
def test_bf16_noise_does_not_depend_on_the_lane_layout() -> None:
    """bf16 (fast conversion): four lanes per thread and one give the same spikes and V
    bit for bit on the neurons both runs hold."""
    neuron = noisy_lif()
    gen = torch.Generator().manual_seed(8)
    x = (1.2 * torch.rand(16, 4 * 65536 + 2, generator=gen)).to(torch.bfloat16).cuda()
    s4, v4 = sn.simulate(neuron, x[:, : 4 * 65536], backend="cuda", seed=5)
    s1, v1 = sn.simulate(neuron, x, backend="cuda", seed=5)  # N % 4 != 0: one lane
    assert torch.equal(s4, s1[:, : 4 * 65536]) and torch.equal(v4, v1[..., : 4 * 65536])
