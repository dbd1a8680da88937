"""The worker side of ``bench_neurons.py``: each peer checked against the float64 reference,
then timed.

A configuration is ``dict(model, T, N, dtype, mode)``; an entry is a peer of it
(:meth:`WorkerState.build`: first call checked, warm-up, retained memory;
:meth:`WorkerState.time`: median wall and device times).
"""

from __future__ import annotations

import math
import statistics
import time
import zlib
from collections.abc import Callable
from typing import Any

import core
from core import Rec, SpikingJelly, Timer, WorkerBase, is_sticky_cuda, torch_dtype


def reference_spikes(neuron: Any, x: Any, params: dict[str, Any], round_h_to: Any = None) -> Any:
    """The spikes of symneuron's torch reference, started where ``sn.simulate`` starts
    without a ``v_init``: the neuron's ``v_init``, else v_reset (0 under soft reset)."""
    from symneuron.inputs import default_v_init
    from symneuron.reference import simulate_reference

    values = {**neuron.params, **params}
    v0 = default_v_init(neuron, x, x.shape[1:], values)
    return simulate_reference(neuron, x, v0, values, store_v_seq=False, round_h_to=round_h_to)[0]


class Inputs:
    """Inputs, rotation buffers and the float64 reference of one (model, T, N, dtype)."""

    def __init__(self, cfg: dict[str, Any], device: Any, settings: dict[str, Any]) -> None:
        import torch

        self.cfg, self.dtype = cfg, torch_dtype(cfg["dtype"])
        self.neuron = core.make_neuron(cfg["model"])
        t_len, n = cfg["T"], cfg["N"]
        gen = torch.Generator(device=device)
        gen.manual_seed(zlib.crc32(f"{cfg['model']}/{t_len}/{n}/{cfg['dtype']}".encode()))
        x_bytes = t_len * n * torch.empty((), dtype=self.dtype).element_size()
        nbuf = math.ceil(settings["rotate_mb"] * 2**20 / x_bytes)
        self.nbuf = int(max(1, min(settings["max_bufs"], nbuf)))
        self.raw = [
            core.bench_input(cfg["model"], (t_len, n), gen, device).to(self.dtype)
            for _ in range(self.nbuf)
        ]
        self.half = self.dtype in (torch.float16, torch.bfloat16)
        with torch.no_grad():
            self.ref = self._reference(self.raw[0]) > 0.5
        self.spike_rate = float(self.ref.float().mean())
        self._ref_grad = None
        self.grad_slice = min(n, settings["grad_slice"])

    def _reference(self, x: Any) -> Any:
        return reference_spikes(self.neuron, x.double(), {}, self.dtype if self.half else None)

    def ref_grad(self) -> Any:
        """dL/dX of L = sum(spikes) on the first ``grad_slice`` neurons (each is independent)."""
        if self._ref_grad is None:
            xs = self.raw[0][:, : self.grad_slice].double().requires_grad_(True)
            self._reference(xs).sum().backward()
            self._ref_grad = xs.grad.detach()
        return self._ref_grad

    def check(self, spikes: Any, settings: dict[str, Any]) -> Rec:
        """The spikes against the float64 reference (16-bit: H rounded to the dtype)."""
        got, ref = spikes.detach() != 0, self.ref
        if got.shape != ref.shape:
            return {"pass": False, "reason": f"shape {tuple(got.shape)} != {tuple(ref.shape)}"}
        mismatch = int((got != ref).sum())
        frac = mismatch / ref.numel()
        if self.half:
            ok = (1.0 - frac) >= settings["half_min_match"]
            rule = f">= {settings['half_min_match']:.0%} of spikes equal"
            rule += " (float64 reference, H rounded)"
        else:
            ok = frac <= settings["fp32_max_mismatch"]
            rule = f"<= {settings['fp32_max_mismatch']:g} of spikes differ (float64 reference)"
        out = {"pass": bool(ok), "mismatch": mismatch, "mismatch_frac": frac}
        return {**out, "identical": mismatch == 0, "spike_rate": self.spike_rate, "rule": rule}


# ------------------------------------------------------------------------------- peers


class Runner:
    """One peer for one (model, dtype, mode): ``forward(x) -> spikes``, its ``note``."""

    note = ""

    def forward(self, x: Any) -> Any:
        raise NotImplementedError

    def parameters(self) -> list[Any]:
        return []

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None


class SymneuronRunner(Runner):
    """``sn.simulate`` on a backend: the symneuron peer (cuda) and the torch peer (torch)."""

    def __init__(self, model: str, dtype: Any, device: Any, training: bool, backend: str) -> None:
        import torch

        import symneuron as sn

        self.simulate, self.neuron = sn.simulate, core.make_neuron(model)
        if backend == "torch":
            self.note = "symneuron reference (backend='torch')"
        elif device.type != "cuda":  # dry run: the C backend where it can, else torch
            backend = "auto" if dtype in (torch.float32, torch.float64) else "torch"
            self.note = f"dry run: backend={backend}"
        self.backend = backend
        self.params = {
            name: torch.tensor(value, device=device, requires_grad=training)
            for name, value in self.neuron.params.items()
            if name in self.neuron.learnable
        }

    def parameters(self) -> list[Any]:
        return list(self.params.values())

    def forward(self, x: Any) -> Any:
        kw = dict(params=self.params or None, backend=self.backend, store_v_seq=False)
        return self.simulate(self.neuron, x, **kw)[0]


class SJRunner(Runner):
    """A SpikingJelly node (0.0.0.0.14 with ``backend="cupy"``, 2.0.0 its default)."""

    def __init__(self, version: str, sj: SpikingJelly, model: str, dtype: Any, device: Any) -> None:
        kw = {}
        if version == "sj014":
            kw["backend"] = "cupy" if device.type == "cuda" else "torch"
            self.note = "" if device.type == "cuda" else "dry run: backend=torch"
        self.node, self.dtype = core.sj_node(sj, model, **kw).to(device), dtype

    def cast_params(self) -> SJRunner:
        self.node.to(self.dtype)
        self.note = (self.note + "; " if self.note else "") + "node params cast to the input dtype"
        return self

    def forward(self, x: Any) -> Any:
        self.node.reset()
        return self.node(x)

    def parameters(self) -> list[Any]:
        return list(self.node.parameters())


# ------------------------------------------------------------------------------ measure


def _first_call(runner: Runner, x: Any, training: bool, timer: Timer) -> tuple[Any, float]:
    timer.sync()
    t0 = time.perf_counter()
    spikes = runner.forward(x)
    if training:
        spikes.sum().backward()
    timer.sync()
    return spikes, time.perf_counter() - t0


def check_first_call(
    runner: Runner,
    inputs: Inputs,
    x: Any,
    training: bool,
    timer: Timer,
    settings: dict[str, Any],
    rec: Rec,
    retry: Callable[[], Runner] | None,
) -> Runner:
    """The first call (compilation and loading land here), timed and checked against the
    reference into ``rec``; ``retry`` gives a runner to try once more when it fails."""
    import torch

    try:
        spikes, rec["first_call_s"] = _first_call(runner, x, training, timer)
    except Exception as exc:
        if retry is None or is_sticky_cuda(exc):
            raise
        runner = retry()
        rec["retried_after"] = f"{type(exc).__name__}: {exc}"[:300]
        spikes, rec["first_call_s"] = _first_call(runner, x, training, timer)
    rec["check"] = check = inputs.check(spikes, settings)
    if spikes.dtype != inputs.dtype:
        check["spike_dtype"] = str(spikes.dtype)
    if training and x.grad is None:
        check["grad"], check["pass"] = "no gradient reached x", False
    elif training:
        check["grad_finite"] = bool(torch.isfinite(x.grad).all())
        ref = inputs.ref_grad().double()
        diff = x.grad[:, : inputs.grad_slice].double() - ref
        check["grad_relerr"] = float(diff.norm() / ref.norm().clamp_min(1e-30))
    x.grad = None
    return runner


def retained_memory(runner: Runner, inputs: Inputs, timer: Timer) -> int:
    """memory_allocated after a forward with grad minus after one without (outputs alive)."""
    import gc

    import torch

    x, used = inputs.raw[0].detach(), []
    for grad in (False, True):
        runner.zero_grad()
        gc.collect()
        timer.sync()
        base = torch.cuda.memory_allocated()
        with torch.set_grad_enabled(grad):
            out = runner.forward(x.requires_grad_(grad))
            timer.sync()
            used.append(torch.cuda.memory_allocated() - base)
        del out
    runner.zero_grad()
    return int(used[1] - used[0])


class Entry:
    """A peer ready to be timed: ``call(i)``, a forward (and backward) on input i."""

    def __init__(self, runner: Runner, inputs: Inputs, training: bool) -> None:
        self.runner, self.training, self.estimate_s = runner, training, 0.0
        self.xs = [x.detach().requires_grad_(training) for x in inputs.raw]

    def call(self, i: int) -> None:
        x = self.xs[i % len(self.xs)]
        if self.training:
            x.grad = None
            self.runner.zero_grad()
            self.runner.forward(x).sum().backward()
        else:
            self.runner.forward(x)


class WorkerState(WorkerBase):
    """A peer worker: its compiled functions and current inputs besides its device."""

    def __init__(self, kind: str, settings: dict[str, Any]) -> None:
        super().__init__(kind, settings)
        self.inputs: Inputs | None = None

    def op_copy(self, req: Rec) -> Rec:
        """The device-to-device copy bandwidth of the floor model (bytes read + written)."""
        nbytes = int(req["bytes"])
        bufs = [self.torch.ones(nbytes // 4, device=self.device) for _ in range(2)]
        for _ in range(3):
            bufs[1].copy_(bufs[0])
        times = self.timer.device(lambda _: bufs[1].copy_(bufs[0]), 20, 1e-5)
        nbytes, t = bufs[0].numel() * 4, statistics.median(times)
        bufs.clear()
        self.free()
        copy = dict(
            bytes=nbytes,
            gpu_s=t,
            gpu_min_s=min(times),
            bandwidth_Bps=2 * nbytes / t,
            counted="bytes read + bytes written",
        )
        return {"records": [copy]}

    def _runner(self, peer: str, cfg: dict[str, Any]) -> Runner:
        args = (cfg["model"], torch_dtype(cfg["dtype"]), self.device)
        training = cfg["mode"] == "training"
        if peer in ("symneuron", "torch"):
            return SymneuronRunner(*args, training, "cuda" if peer == "symneuron" else "torch")
        assert self.sj is not None
        return SJRunner(peer, self.sj, *args)

    def build(self, cfg: dict[str, Any], peer: str, rec: Rec) -> Entry:
        """The peer's first call checked against the reference, its warm-up calls (the
        estimate that sizes the repetitions) and its memory retained for backward."""
        same = ("model", "T", "N", "dtype")  # the two modes share inputs and reference
        if self.inputs is None or any(self.inputs.cfg[k] != cfg[k] for k in same):
            self.inputs = None
            self.free()
            self.inputs = Inputs(cfg, self.device, self.settings)
        inputs, training = self.inputs, cfg["mode"] == "training"
        rec["buffers"] = inputs.nbuf
        runner = self._runner(peer, cfg)
        retry = runner.cast_params if isinstance(runner, SJRunner) and inputs.half else None
        entry = Entry(runner, inputs, training)
        with self.torch.set_grad_enabled(training):
            entry.runner = check_first_call(
                runner, inputs, entry.xs[0], training, self.timer, self.settings, rec, retry
            )
            warm = [
                self.timer.wall(entry.call, 1)[0] for _ in range(max(1, self.settings["warmup"]))
            ]
        entry.estimate_s = min(warm)
        if training and self.cuda:
            rec["retained_bytes"] = retained_memory(entry.runner, inputs, self.timer)
        if entry.runner.note:
            rec["note"] = entry.runner.note

        if peer == "sj200" and self.sj is not None:
            rec["implementation"] = self.sj.implementation(cfg["model"], self.device)
        return entry

    def time(self, entry: Entry) -> Rec:
        """The median wall time (host overhead counts) and device time (:meth:`Timer.device`)."""
        s = self.settings

        def reps(estimate_s: float) -> int:
            wanted = math.ceil(s["target_ms"] / 1e3 / estimate_s) if estimate_s > 0 else 1e9
            return int(max(s["min_reps"], min(s["max_reps"], wanted)))

        with self.torch.set_grad_enabled(entry.training):
            wall = self.timer.wall(entry.call, reps(entry.estimate_s))
            host = statistics.median(wall)
            dev = self.timer.device(entry.call, reps(host), host)
        return dict(
            gpu_batches_host_slower=self.timer.gap_risk,
            wall_s=host,
            gpu_s=statistics.median(dev),
            wall_min_s=min(wall),
            gpu_min_s=min(dev),
            reps_wall=len(wall),
            reps_gpu=len(dev),
        )

    def status_of(self, exc: BaseException) -> str:
        text = str(exc).lower()
        dtype = any(w in text for w in ("dtype", "bfloat16", "half", "float16"))
        said = any(w in text for w in ("support", "not implemented", "expected"))
        return "unsupported" if isinstance(exc, NotImplementedError) or dtype and said else "error"
