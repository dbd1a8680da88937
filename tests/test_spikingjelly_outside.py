"""Outside check: the zoo against SpikingJelly's own torch implementations.

Each case builds one SpikingJelly node (multi-step, float64, ``store_v_seq``) and
the matching symneuron neuron with the same constants, feeds both the same random
input and initial potential, and asserts identical spikes, matching ``v_seq``
and matching gradients of a random linear loss w.r.t. ``x_seq``, ``v_init``
and, for PLIF, ``w``.

SpikingJelly 2.0.0 runs float64 through its pure-torch reference loop (its fused
ops take fp32/fp16/bf16 only) and has no ``backend`` argument; 0.0.0.0.14 uses
its torch backend by default. Either works here.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from conftest import Run, generator, linear_loss, run_with_grads, seed_of

if os.environ.get("CI"):
    import spikingjelly  # noqa: F401  (CI installs it: this check must run there, not skip)
pytest.importorskip("spikingjelly")
from spikingjelly.activation_based import neuron as sj_neuron  # noqa: E402
from spikingjelly.activation_based import surrogate as sj_surrogate  # noqa: E402

import symneuron as sn  # noqa: E402

DTYPE = torch.float64
T = 8
SHAPE = (3, 5)
V_THRESHOLD = 0.9
TOL = dict(rtol=1e-6, atol=1e-6)
MIN_SPIKE_FRACTION = 0.1
MAX_SPIKE_FRACTION = 0.9


@dataclass(frozen=True)
class ModelCase:
    """One zoo model: how to build it on both sides and how to drive it."""

    sj_class: str
    sn_factory: str
    constants: dict[str, Any]
    x_mean: float
    x_std: float
    hard_v_reset: float
    learnable_w: bool = False
    sj_only: dict[str, Any] = field(default_factory=dict)


def _leaky(
    sj_class: str, sn_factory: str, tau: dict[str, float], **kw: Any
) -> dict[str, ModelCase]:
    """A leaky model with and without ``decay_input``; without it, the input is not
    divided by tau and a smaller drive fires as often."""
    drive = {True: (1.5, 1.2), False: (0.45, 0.6)}
    return {
        f"{sn_factory}-{'' if decay else 'no_'}decay_input": ModelCase(
            sj_class, sn_factory, {**tau, "decay_input": decay}, *drive[decay], -0.2, **kw
        )
        for decay in (True, False)
    }


MODELS: dict[str, ModelCase] = {
    "IF": ModelCase("IFNode", "IF", {}, 0.35, 0.6, -0.2),
    **_leaky("LIFNode", "LIF", {"tau": 3.0}),
    **_leaky("ParametricLIFNode", "PLIF", {"init_tau": 3.0}, learnable_w=True),
    "QIF": ModelCase(
        "QIFNode",
        "QIF",
        {"tau": 3.0, "v_c": 0.7, "a0": 1.2, "v_rest": 0.05},
        0.9,
        1.0,
        -0.1,
    ),
    "EIF": ModelCase(
        "EIFNode",
        "EIF",
        {"tau": 3.0, "delta_T": 0.9, "theta_rh": 0.7, "v_rest": 0.05},
        0.6,
        1.0,
        -0.1,
    ),
}

#: (class name, constructor kwargs); names and kwargs are the same on both sides.
SurrogateCase = tuple[str, dict[str, float]]

CORE_SURROGATES: list[SurrogateCase] = [
    ("Sigmoid", {"alpha": 4.0}),
    ("ATan", {"alpha": 2.0}),
    ("PiecewiseQuadratic", {"alpha": 1.0}),
]
# QPseudoSpike uses alpha=3: at alpha=2 its gradient equals SoftSign(alpha=2).
# SuperSpike uses alpha=1, where SJ's alpha/(|x|+1)^2 and 1/(beta|x|+1)^2 agree.
EXTRA_SURROGATES: list[SurrogateCase] = [
    ("Sigmoid", {"alpha": 2.5}),
    ("ATan", {"alpha": 3.0}),
    ("PiecewiseQuadratic", {"alpha": 0.7}),
    ("SoftSign", {"alpha": 2.0}),
    ("Erf", {"alpha": 2.0}),
    ("QPseudoSpike", {"alpha": 3.0}),
    ("PiecewiseLeakyReLU", {"w": 1.0, "c": 0.01}),
    ("SuperSpike", {"alpha": 1.0}),
]
EXTRA_SURROGATE_MODELS = ["LIF-decay_input", "EIF"]
RESETS = {"hard": True, "soft": False}


def _have_c_compiler() -> bool:
    return any(shutil.which(cc) for cc in ("cc", "gcc", "clang"))


BACKENDS = [
    "torch",
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(not _have_c_compiler(), reason="no C compiler"),
    ),
]


def _surrogate_id(case: SurrogateCase) -> str:
    name, kwargs = case
    return name + "(" + ",".join(f"{k}={v}" for k, v in kwargs.items()) + ")"


def _sj_piecewise_leaky_relu_is_consistent() -> bool:
    """SJ 0.0.0.0.14's backward is 1/w inside |x| < w, against a primitive of slope 1/(2w)."""
    grad = sj_surrogate.PiecewiseLeakyReLU.backward(
        torch.ones(1, dtype=DTYPE), torch.zeros(1, dtype=DTYPE), 1.0, 0.01
    )
    return math.isclose(float(grad), 0.5)


def _require_surrogate(name: str) -> None:
    if not hasattr(sj_surrogate, name):
        pytest.skip(f"this SpikingJelly has no surrogate.{name}")
    if not hasattr(sn.surrogate, name):
        pytest.skip(f"symneuron has no surrogate.{name}")
    if name == "PiecewiseLeakyReLU" and not _sj_piecewise_leaky_relu_is_consistent():
        pytest.skip("this SpikingJelly's PiecewiseLeakyReLU backward is not the primitive's slope")


def _reset_kwargs(model: ModelCase, hard: bool) -> dict[str, Any]:
    return {
        "v_threshold": V_THRESHOLD,
        "v_reset": model.hard_v_reset if hard else None,
    }


def _build_sj(
    model: ModelCase, hard: bool, detach: bool, surrogate: SurrogateCase
) -> torch.nn.Module:
    name, sg_kwargs = surrogate
    node_class: Callable[..., torch.nn.Module] = getattr(sj_neuron, model.sj_class)
    node = node_class(
        **model.constants,
        **_reset_kwargs(model, hard),
        surrogate_function=getattr(sj_surrogate, name)(**sg_kwargs),
        detach_reset=detach,
        step_mode="m",
        store_v_seq=True,
    )
    return node.to(DTYPE)


def _build_sn(model: ModelCase, hard: bool, detach: bool, surrogate: SurrogateCase) -> Any:
    name, sg_kwargs = surrogate
    factory = getattr(sn.models, model.sn_factory)
    return factory(
        **model.constants,
        **_reset_kwargs(model, hard),
        surrogate=getattr(sn.surrogate, name)(**sg_kwargs),
        detach_reset=detach,
    )


@dataclass
class Drive:
    """Inputs, initial state and loss weights shared by both sides."""

    x_seq: torch.Tensor
    v_init: torch.Tensor
    r_spike: torch.Tensor
    r_v: torch.Tensor

    @property
    def weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.r_spike, self.r_v


def _drive(model: ModelCase, gen: torch.Generator) -> Drive:
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=DTYPE)

    x_seq = model.x_mean + model.x_std * randn(T, *SHAPE)
    v_init = -0.3 + 0.9 * torch.rand(*SHAPE, generator=gen, dtype=DTYPE)
    return Drive(x_seq, v_init, randn(T, *SHAPE), randn(T, *SHAPE))


def _run_sj(node: torch.nn.Module, drive: Drive, learnable_w: bool) -> Run:
    x_seq = drive.x_seq.detach().clone().requires_grad_(True)
    v_init = drive.v_init.detach().clone().requires_grad_(True)
    node.v = v_init
    spike_seq = node(x_seq)
    v_seq = node.v_seq
    assert v_seq is not None and v_seq.shape == x_seq.shape
    inputs = {"x_seq": x_seq, "v_init": v_init}
    if learnable_w:
        inputs["w"] = node.w
    loss = linear_loss([spike_seq, v_seq], drive.weights)
    grads = torch.autograd.grad(loss, list(inputs.values()))
    return Run(spike_seq.detach(), v_seq.detach(), dict(zip(inputs, grads, strict=True)))


def _run_sn(neuron: Any, drive: Drive, backend: str, w_value: float | None) -> Run:
    params = None if w_value is None else {"w": torch.tensor(w_value, dtype=DTYPE)}
    got = run_with_grads(neuron, drive.x_seq, drive.v_init, params, drive.weights, backend=backend)
    assert got.v_seq.shape == drive.x_seq.shape
    return got


def _assert_not_vacuous(reference: Run) -> None:
    fraction = reference.spikes.mean().item()
    assert MIN_SPIKE_FRACTION <= fraction <= MAX_SPIKE_FRACTION, (
        f"spike fraction {fraction:.3f} outside "
        f"[{MIN_SPIKE_FRACTION}, {MAX_SPIKE_FRACTION}]: the drive needs retuning"
    )
    assert torch.isfinite(reference.v_seq).all()
    for name, grad in reference.grads.items():
        assert torch.isfinite(grad).all(), name
        assert grad.abs().max() > 0, f"gradient w.r.t. {name} is identically zero"


def _assert_match(got: Run, want: Run) -> None:
    assert torch.equal(got.spikes.to(DTYPE), want.spikes), "spikes differ"
    torch.testing.assert_close(got.v_seq.to(DTYPE), want.v_seq, **TOL)
    assert got.grads.keys() == want.grads.keys()
    for name in want.grads:
        torch.testing.assert_close(
            got.grads[name].to(DTYPE).reshape(want.grads[name].shape),
            want.grads[name],
            **TOL,
            msg=lambda m, name=name: f"d loss / d {name}: {m}",
        )


def _compare(
    model_name: str,
    reset: str,
    detach: bool,
    surrogate: SurrogateCase,
    backend: str,
) -> None:
    _require_surrogate(surrogate[0])
    model, hard = MODELS[model_name], RESETS[reset]
    seed = seed_of(model_name, reset, detach, _surrogate_id(surrogate))
    drive = _drive(model, generator(seed))
    sj_node = _build_sj(model, hard, detach, surrogate)
    want = _run_sj(sj_node, drive, model.learnable_w)
    _assert_not_vacuous(want)
    w_value = float(sj_node.w.detach()) if model.learnable_w else None
    got = _run_sn(_build_sn(model, hard, detach, surrogate), drive, backend, w_value)
    _assert_match(got, want)


Test = Callable[..., None]


def _sweep(models: list[str], surrogates: list[SurrogateCase]) -> Callable[[Test], Test]:
    """Run a comparison over model x reset x detach_reset x surrogate x backend (``slow``:
    hundreds of cases, each building a SpikingJelly node)."""
    marks = [
        pytest.mark.slow,
        pytest.mark.parametrize("backend", BACKENDS),
        pytest.mark.parametrize("surrogate", surrogates, ids=_surrogate_id),
        pytest.mark.parametrize("detach", [False, True], ids=["attached", "detach_reset"]),
        pytest.mark.parametrize("reset", list(RESETS)),
        pytest.mark.parametrize("model_name", models),
    ]

    def apply(test: Test) -> Test:
        for mark in reversed(marks):  # as if stacked in this order above ``test``
            test = mark(test)
        return test

    return apply


@_sweep(list(MODELS), CORE_SURROGATES)
def test_zoo_matches_spikingjelly(
    model_name: str, reset: str, detach: bool, surrogate: SurrogateCase, backend: str
) -> None:
    _compare(model_name, reset, detach, surrogate, backend)


@_sweep(EXTRA_SURROGATE_MODELS, EXTRA_SURROGATES)
def test_more_surrogates_match_spikingjelly(
    model_name: str, reset: str, detach: bool, surrogate: SurrogateCase, backend: str
) -> None:
    _compare(model_name, reset, detach, surrogate, backend)


def test_plif_w_is_minus_log_of_init_tau_minus_one() -> None:
    """SJ's parametrisation, which the PLIF cases rely on: 1/tau = sigmoid(w)."""
    init_tau = MODELS["PLIF-decay_input"].constants["init_tau"]
    node = sj_neuron.ParametricLIFNode(init_tau=init_tau)
    assert math.isclose(float(node.w.detach()), -math.log(init_tau - 1.0), rel_tol=1e-6)
    assert math.isclose(1.0 / torch.sigmoid(node.w).item(), init_tau, rel_tol=1e-6)


SN_DEFAULT_FACTORIES = {
    "IFNode": "IF",
    "LIFNode": "LIF",
    "ParametricLIFNode": "PLIF",
    "QIFNode": "QIF",
    "EIFNode": "EIF",
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sj_class", list(SN_DEFAULT_FACTORIES))
def test_default_constants_match_spikingjelly(sj_class: str, backend: str) -> None:
    """Constructed with nothing but the surrogate, both sides must agree.

    This covers every default: v_threshold, v_reset (0.0 for IF/LIF/PLIF, -0.1
    for QIF/EIF), tau / init_tau, decay_input, v_c, a0, v_rest, delta_T,
    theta_rh and PLIF's initial w.
    """
    sj_node = getattr(sj_neuron, sj_class)(
        surrogate_function=sj_surrogate.ATan(alpha=2.0),
        step_mode="m",
        store_v_seq=True,
    ).to(DTYPE)
    sn_factory = getattr(sn.models, SN_DEFAULT_FACTORIES[sj_class])
    neuron = sn_factory(surrogate=sn.surrogate.ATan(alpha=2.0))
    gen = generator(seed_of("defaults", sj_class))
    drive = Drive(
        0.6 + 1.0 * torch.randn(T, *SHAPE, generator=gen, dtype=DTYPE),
        -0.1 + 0.6 * torch.rand(*SHAPE, generator=gen, dtype=DTYPE),
        torch.randn(T, *SHAPE, generator=gen, dtype=DTYPE),
        torch.randn(T, *SHAPE, generator=gen, dtype=DTYPE),
    )
    want = _run_sj(sj_node, drive, learnable_w=False)
    _assert_not_vacuous(want)
    got = _run_sn(neuron, drive, backend, w_value=None)
    _assert_match(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reset", list(RESETS))
def test_threshold_tie_spikes(reset: str, backend: str) -> None:
    """Theta(0) = 1: H exactly equal to V_th fires, as in SJ's ``x >= 0``."""
    model, hard = MODELS["IF"], RESETS[reset]
    surrogate = ("ATan", {"alpha": 2.0})
    gen = generator(seed_of("tie", reset))
    x_seq = model.x_mean + model.x_std * torch.randn(T, *SHAPE, generator=gen, dtype=DTYPE)
    x_seq[0] = V_THRESHOLD
    drive = Drive(
        x_seq,
        torch.zeros(SHAPE, dtype=DTYPE),
        torch.randn(T, *SHAPE, generator=gen, dtype=DTYPE),
        torch.randn(T, *SHAPE, generator=gen, dtype=DTYPE),
    )
    want = _run_sj(_build_sj(model, hard, False, surrogate), drive, learnable_w=False)
    assert bool((want.spikes[0] == 1).all())
    got = _run_sn(_build_sn(model, hard, False, surrogate), drive, backend, w_value=None)
    _assert_match(got, want)
