"""``sn.check``: verify a neuron's derived gradients and its kernels automatically.

Two independent oracles:

1. every derived partial (and the surrogate's σ') against central finite
   differences of the charge (and of σ) at random points, in float64;
2. the chosen backend's forward and backward (x, v_init, every learnable
   param) against the torch reference (:mod:`symneuron.reference`), which never
   uses a SymPy derivative, on fresh random inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp
import torch

from . import derivation
from .check_events import eventprop_errors
from .check_recurrent import recurrent_errors
from .definition import H, V, X
from .derivation import partial_definitions
from .models import require_neuron
from .neuron import Neuron
from .reference import simulate_reference, torch_function
from .simulate import resolve_backend, simulate
from .stochastic import NOISES
from .surrogate import u as U

__all__ = ["check", "CheckReport", "CheckResult"]

_DEFAULT_TOL = {torch.float64: 1e-8, torch.float32: 2e-4}
#: The narrowest name column of :meth:`CheckReport.__str__` (wider when a name is longer)
_NAME_WIDTH = 29


@dataclass(frozen=True)
class CheckResult:
    """One comparison: its maximum (relative) error and the tolerance it must meet."""

    name: str
    error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return bool(self.error <= self.tolerance)  # NaN fails


@dataclass
class CheckReport:
    """All comparisons of one :func:`check` run; ``bool(report)`` is pass/fail."""

    neuron: str
    backend: str
    dtype: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def __bool__(self) -> bool:
        return self.passed

    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if not r.passed]

    def __str__(self) -> str:
        head = f"check({self.neuron}, backend={self.backend}, dtype={self.dtype}): "
        head += "PASS" if self.passed else "FAIL"
        width = max([_NAME_WIDTH, *(len(r.name) for r in self.results)])
        rows = [
            f"  {'ok  ' if r.passed else 'FAIL'} {r.name:<{width}} "
            f"error {r.error:.3e}  tol {r.tolerance:.1e}"
            for r in self.results
        ]
        return "\n".join([head, *rows])


def _rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max(max |b|, 1) over the finite values of ``b``; equal infinities
    (a 16-bit overflow both sides agree on) count as no error, NaN as a failure."""
    diff = torch.where(a == b, torch.zeros_like(a), (a - b).abs())
    finite = b[torch.isfinite(b)]
    scale = (finite.abs().max() if finite.numel() else b.new_tensor(0.0)).clamp_min(1.0)
    return float((diff.max() / scale).item())


def _v_scale(neuron: Neuron) -> tuple[float, float]:
    """Where V lives: (V[0], |threshold − V[0]|), e.g. (0, 1) for SpikingJelly's units and
    (−70.6, 30.2) for AdEx in mV; (0, 1) when either is an expression."""
    start, threshold = neuron.v_start, neuron.v_threshold
    if isinstance(start, float) and isinstance(threshold, float) and threshold != start:
        return start, abs(threshold - start)
    return 0.0, 1.0


def _point(neuron: Neuron, n: int, gen: torch.Generator) -> dict[sp.Symbol, torch.Tensor]:
    def draw(center: float, spread: float) -> torch.Tensor:
        return center + spread * (2 * torch.rand(n, generator=gen, dtype=torch.float64) - 1)

    start, span = _v_scale(neuron)
    v = draw(start + 0.3 * span, span)
    point = {V: v, X: draw(0.5, 1.0), H: draw(start + 0.5 * span, span)}
    for name, state in neuron.states.items():
        point[neuron.state_symbols[name]] = draw(state.init, 0.5)
    for name, default in neuron.params.items():
        point[neuron.symbols[name]] = draw(default, 0.1 * max(abs(default), 0.1))
    for i in neuron.noise_streams:  # a draw is an input of the step like X
        point[NOISES[i]] = draw(0.0, 2.0)
    return point


def _finite_difference(
    expr: sp.Expr, wrt: sp.Symbol, point: dict[sp.Symbol, torch.Tensor]
) -> torch.Tensor:
    args = list(point)
    fn = torch_function(args, expr)
    step = 1e-6 * point[wrt].abs().clamp_min(1.0)
    up = {**point, wrt: point[wrt] + step}
    down = {**point, wrt: point[wrt] - step}
    diff = torch.as_tensor(fn(*up.values())) - torch.as_tensor(fn(*down.values()))
    return diff / (2 * step)


def _evaluate(expr: sp.Expr, point: dict[sp.Symbol, torch.Tensor]) -> torch.Tensor:
    value = torch_function(list(point), expr)(*point.values())
    return torch.as_tensor(value, dtype=torch.float64).expand_as(next(iter(point.values())))


def check_partials(
    neuron: Neuron, points: int, gen: torch.Generator, tol: float
) -> list[CheckResult]:
    """Each derived partial and σ' against central finite differences."""
    point = _point(neuron, points, gen)
    definitions = partial_definitions(neuron)
    out = []
    # the partials shown, or where they show an exp_euler step exactly, the kernels' staged ones
    staged = neuron.charge is not neuron.step_charge
    found = derivation.partials(neuron) if staged else neuron.derivatives()
    for key, expr in found.items():
        function, wrt = definitions[key]
        fd = _finite_difference(function, wrt, point)
        out.append(
            CheckResult(f"{key} vs finite diff", _rel_error(_evaluate(expr, point), fd), tol)
        )
    p = neuron.spike_probability  # escape firing: dp/dH stands for dS/dH
    if p is not None:

        def step(x: sp.Expr, *_: sp.Expr) -> sp.Expr:  # d Min/Max, torch-printable
            return sp.Piecewise((1, x > 0), (0, True))

        dp = _evaluate(sp.diff(p, H).replace(sp.Heaviside, step), point)
        fd = _finite_difference(p, H, point)
        out.append(CheckResult("dp/dH vs finite diff", _rel_error(dp, fd), tol))
    u_point = {U: 3 * (2 * torch.rand(points, generator=gen, dtype=torch.float64) - 1)}
    u_point[U] = u_point[U][u_point[U].abs() > 1e-3]
    sg = neuron.surrogate.derivative()
    fd = _finite_difference(neuron.surrogate.primitive_in_u(), U, u_point)
    out.append(
        CheckResult("surrogate' vs finite diff", _rel_error(_evaluate(sg, u_point), fd), tol)
    )
    return out


def _inputs(
    neuron: Neuron,
    t: int,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
) -> dict[str, torch.Tensor]:
    def rand(*size: int) -> torch.Tensor:
        return torch.rand(size, generator=gen, dtype=torch.float64).to(device=device)

    start, span = _v_scale(neuron)
    v_init = start + span * (0.6 * rand(*shape) - 0.1)
    inputs = {"x_seq": 1.6 * rand(t, *shape) - 0.2, "v_init": v_init}
    for name, state in neuron.states.items():
        inputs[f"state {name}"] = state.init + 0.4 * rand(*shape) - 0.2
    for name in neuron.learnable:
        default = neuron.params[name]
        inputs[name] = torch.tensor(default, dtype=torch.float64, device=device) + 0.05 * (
            rand() - 0.5
        )
    return {k: v.to(dtype) for k, v in inputs.items()}


def _run(
    neuron: Neuron,
    inputs: dict[str, torch.Tensor],
    backend: str | None,
    weights: tuple[torch.Tensor, torch.Tensor],
    round_h_to: torch.dtype | None = None,
    rng: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in inputs.items()}
    params = {n: leaves[n] for n in neuron.learnable}
    w_init = {n: leaves[f"state {n}"] for n in neuron.states}
    if backend is None:
        result = simulate_reference(
            neuron,
            leaves["x_seq"],
            leaves["v_init"],
            {**neuron.params, **params},
            round_h_to=round_h_to,
            w_init=w_init,
            rng=rng,
        )
    else:
        result = simulate(
            neuron,
            leaves["x_seq"],
            leaves["v_init"],
            params,
            backend=backend,
            states=w_init,
            seed=rng,
        )
    spikes, v_seq, *rest = result
    state_seqs = list(rest[0].values()) if rest else []
    loss = (spikes * weights[0].to(spikes.dtype)).sum()
    for seq in [v_seq, *state_seqs]:
        loss = loss + (seq * weights[1].to(seq.dtype)).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    out = [spikes.detach(), v_seq.detach(), *[seq.detach() for seq in state_seqs]]
    pairs = zip(grads, leaves.values(), strict=True)
    return out + [torch.zeros_like(v) if g is None else g for g, v in pairs]


#: Input scales tried in turn until the float64 reference fires (models in mV and pA
#: need larger inputs than SpikingJelly's units); 4^7 keeps 16-bit inputs finite.
_X_SCALES = tuple(4.0**k for k in range(8))


def _count(value: object, what: str) -> int:
    """``value`` as an int of at least 1, else a ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be an int of at least 1, got {value!r}")
    return value


def _arguments(
    T: int, shape: tuple[int, ...], points: int, tolerance: float | None
) -> tuple[int, ...]:
    """Refuse what :func:`check` cannot run with (naming the fix); ``shape`` as a tuple."""
    _count(T, "T (the number of steps simulated)")
    _count(points, "points (the random points of the finite-difference checks)")
    if not isinstance(shape, tuple | list) or len(shape) == 0:
        raise ValueError(
            f"shape is one step's shape [*shape] with at least 1 dim, e.g. (4, 16); got {shape!r}"
        )
    for size in shape:
        _count(size, f"each size of shape (got shape={tuple(shape)!r})")
    if tolerance is not None:
        ok = isinstance(tolerance, int | float) and not isinstance(tolerance, bool)
        if not ok or not 0 <= tolerance < float("inf"):
            raise ValueError(
                "tolerance is the largest relative error accepted: a finite number >= 0 "
                f"(or None for the dtype's default), got {tolerance!r}"
            )
    return tuple(shape)


def _firing_reference(
    neuron: Neuron,
    inputs: dict[str, torch.Tensor],
    weights: tuple[torch.Tensor, torch.Tensor],
    dtype: torch.dtype,
    rng: torch.Tensor | None = None,
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor], CheckResult]:
    """The inputs scaled by the first of :data:`_X_SCALES` at which the float64 reference
    fires, its outputs and gradients, and the row saying whether it fired."""
    half = dtype in (torch.float16, torch.bfloat16)
    for scale in _X_SCALES:  # inputs in the model's units: the first scale that fires
        scaled = {**inputs, "x_seq": (inputs["x_seq"].double() * scale).to(dtype)}
        double_inputs = {k: v.double() for k, v in scaled.items()}
        reference = _run(neuron, double_inputs, None, weights, dtype if half else None, rng)
        if float(reference[0].sum()) > 0:
            return scaled, reference, CheckResult(f"reference fires (x scaled {scale:g}x)", 0, 0)
    name = f"reference never fires, x scaled up to {scale:g}x: no spike was checked"
    return scaled, reference, CheckResult(name, 1.0, 0.0)


def _nan_reference(neuron: Neuron, v_seq: torch.Tensor) -> list[CheckResult]:
    """A failing row naming the parameters when the float64 reference's V is NaN (from
    finite inputs: the parameter values are the usual cause, e.g. a time constant 0)."""
    nan = torch.isnan(v_seq).flatten(1).any(1).nonzero()
    if len(nan) == 0:
        return []
    params = ", ".join(f"{k}={v!r}" for k, v in neuron.params.items()) or "none"
    name = f"reference V is NaN from step {int(nan[0])}; parameters {params}"
    return [CheckResult(name, float("nan"), 0.0)]


def check(
    neuron: Neuron,
    *,
    backend: str = "auto",
    dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
    T: int | None = None,
    shape: tuple[int, ...] = (4, 16),
    points: int = 64,
    tolerance: float | None = None,
    seed: int | None = None,
    recurrent: bool = False,
    gradient: str = "surrogate",
) -> CheckReport:
    """Verify ``neuron``'s derivatives and its ``backend`` kernels against oracles.

    ``gradient="eventprop"`` checks EventProp instead of the surrogate gradients
    (:mod:`symneuron.check_events`, docs/eventprop.md): a seeded network of the neuron
    run for ``T`` steps of its ``dt`` (default 40; 8 for the surrogate check), its
    gradient against central differences and, for a nonlinear model, its convergence in
    dt; a refused neuron raises the derivation's ``EventPropError``. With
    ``recurrent=True`` its hidden layer is recurrent (its neurons receive each other's
    spikes after delays of at least one step), and the recurrent weights' and delays'
    gradients are checked too.

    With ``recurrent=True`` it also runs a :class:`~symneuron.RecurrentNeuronLayer` of
    ``shape[-1]`` neurons (and a bias) on ``backend`` against the same layer on the
    torch reference, one step at a time in float64: spikes, and the gradients of the
    input, the recurrent weight, the bias and every learnable parameter.

    Returns a :class:`CheckReport`: each comparison with its max error and
    tolerance, and ``report.passed``. Inputs are fresh random draws unless
    ``seed`` is given; V and the derivative points are drawn on the neuron's own
    scale (around V[0], spread |threshold − V[0]|), and the input is scaled by
    1, 4, 16, ... up to 4^7 until the float64 reference fires: a neuron that never
    fires fails the check ("reference never fires"), since nothing passed through
    a spike. ``T``, ``points`` and each size of ``shape`` must be at least 1,
    ``tolerance`` (default: the dtype's) a finite number >= 0. A neuron that draws
    random numbers (docs/noise.md) runs the reference and the backend with one noise
    seed taken from ``seed``: the noise is then a fixed function of it, so the
    gradients are compared as for any neuron.

    Examples
    --------
    >>> import symneuron as sn
    >>> report = sn.check(sn.models.QIF())
    >>> assert report.passed, str(report)
    """
    require_neuron(neuron)
    if gradient not in GRADIENTS:
        raise ValueError(f"gradient is one of {GRADIENTS}, got {gradient!r}")
    if gradient == "eventprop":
        given = dict(backend=backend, dtype=dtype, device=device, shape=shape, points=points)
        extra = _surrogate_only(given)
        return _eventprop_check(neuron, T, tolerance, seed, extra, recurrent)
    T = 8 if T is None else T
    shape = _arguments(T, shape, points, tolerance)
    device = torch.device(device)
    gen = _generator(seed)
    backend = resolve_backend(backend, device)
    tol = tolerance if tolerance is not None else _DEFAULT_TOL.get(dtype, 1e-2)
    report = CheckReport(neuron.name, backend, str(dtype).removeprefix("torch."))
    report.results += check_partials(neuron, points, gen, 1e-6)
    inputs = _inputs(neuron, T, shape, dtype, device, gen)
    weights = (
        torch.randn(T, *shape, generator=gen, dtype=torch.float64).to(device),
        torch.randn(T, *shape, generator=gen, dtype=torch.float64).to(device),
    )
    rng = _noise_state(neuron, gen, device)
    inputs, reference, fired = _firing_reference(neuron, inputs, weights, dtype, rng)
    report.results += [fired, *_nan_reference(neuron, reference[1])]
    got = _run(neuron, inputs, backend, weights, rng=rng)
    report.results += _against_reference(neuron, inputs, got, reference, tol)
    if recurrent:
        found = recurrent_errors(neuron, backend, inputs["x_seq"], weights[0], gen)
        report.results += [CheckResult(name, _rel_error(a, b), tol) for name, a, b in found]
    return report


#: The gradient modes :func:`check` verifies.
GRADIENTS = ("surrogate", "eventprop")
#: The surrogate check's arguments, at their defaults (the EventProp check refuses others).
_SURROGATE_DEFAULTS = {
    "backend": "auto",
    "dtype": torch.float64,
    "device": "cpu",
    "shape": (4, 16),
    "points": 64,
}


def _surrogate_only(arguments: dict[str, object]) -> list[str]:
    """The surrogate check's arguments given other than their defaults."""
    return [
        name
        for name, default in _SURROGATE_DEFAULTS.items()
        if arguments[name] != default and str(arguments[name]) != str(default)
    ]


def _eventprop_check(
    neuron: Neuron,
    T: int | None,
    tolerance: float | None,
    seed: int | None,
    given: list[str],
    recurrent: bool,
) -> CheckReport:
    """``check(gradient="eventprop")``: :func:`~symneuron.check_events.eventprop_errors`
    (``recurrent``: its hidden layer recurrent)."""
    if given:
        raise ValueError(
            f"check(gradient='eventprop') checks the float64 EventProp reference of a small "
            f"network; {', '.join(given)} belong to the surrogate check: leave them out."
        )
    steps = 40 if T is None else T
    _arguments(steps, (1,), 1, tolerance)
    rows = eventprop_errors(neuron, steps, _generator(seed), tolerance, recurrent)
    report = CheckReport(neuron.name, "eventprop reference", "float64")
    report.results += [CheckResult(name, error, tol) for name, error, tol in rows]
    return report


def _generator(seed: int | None) -> torch.Generator:
    """The check's own generator: seeded, or fresh entropy (torch's global RNG untouched)."""
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def _noise_state(neuron: Neuron, gen: torch.Generator, device: torch.device) -> torch.Tensor | None:
    """For a neuron that draws: the noise's [seed, offset], the seed from ``gen``."""
    if not neuron.draws:
        return None
    noise_seed = int(torch.randint(0, 2**62, (), generator=gen))
    return torch.tensor([noise_seed, 0], dtype=torch.int64, device=device)


def _against_reference(
    neuron: Neuron,
    inputs: dict[str, torch.Tensor],
    got: list[torch.Tensor],
    reference: list[torch.Tensor],
    tol: float,
) -> list[CheckResult]:
    """The backend's outputs and gradients, each against the reference's."""
    names = ["spike_seq", "v_seq", *[f"{w}_seq" for w in neuron.states]]
    names += [f"grad {k}" for k in inputs]
    return [
        CheckResult(f"{name} vs reference", _rel_error(a.double(), b), tol)
        for name, a, b in zip(names, got, reference, strict=True)
    ]
