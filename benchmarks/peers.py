"""The worker side of ``bench_neurons.py``: each peer checked against the float64 reference,
then timed; the one-shot processes that time the first calls and the derivation.

A configuration is ``dict(model, T, N, dtype, mode)``; a worker answers a ``bench``
request with one record per peer (``status``: ok, error, unsupported), see :func:`measure`.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_neurons as bn
from core import (
    SJ_VERSION,
    Rec,
    SpikingJelly,
    Timer,
    device_info,
    log,
    short_error,
    torch_dtype,
    versions,
)

CACHE_VARS = ("SYMNEURON_CACHE", "CUPY_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
STICKY_CUDA = ("illegal memory access", "CUDA error: an illegal", "unspecified launch failure",
               "misaligned address", "CUDA_ERROR_ILLEGAL", "cudaErrorIllegalAddress",
               "device-side assert", "CUDA_ERROR_LAUNCH_FAILED")  # fmt: skip


def config_key(cfg: dict[str, Any]) -> str:
    return f"{cfg['model']}/T{cfg['T']}/N{cfg['N']}/{cfg['dtype']}/{cfg['mode']}"


def is_sticky_cuda(exc: BaseException) -> bool:
    """Whether ``exc`` leaves the CUDA context unusable (the worker must restart)."""
    return any(n in f"{type(exc).__name__}: {exc}" for n in STICKY_CUDA)


def _status_of(exc: BaseException) -> str:
    text = str(exc).lower()
    dtype = any(w in text for w in ("dtype", "bfloat16", "half", "float16"))
    said = any(w in text for w in ("support", "not implemented", "expected"))
    return "unsupported" if isinstance(exc, NotImplementedError) or dtype and said else "error"


def reference_spikes(neuron: Any, x: Any, params: dict[str, Any], round_h_to: Any = None) -> Any:
    """The spikes of symneuron's torch reference, started where ``sn.simulate`` starts
    without a ``v_init``: the neuron's ``v_init``, else v_reset (0 under soft reset)."""
    from symneuron.inputs import default_v_init
    from symneuron.reference import simulate_reference

    values = {**neuron.params, **params}
    v0 = default_v_init(neuron, x, x.shape[1:], values)
    out = simulate_reference(neuron, x, v0, values, store_v_seq=False, round_h_to=round_h_to)
    return out[0]  # (spikes, v_seq) or (spikes, v_seq, states)


class Inputs:
    """Inputs, rotation buffers and the float64 reference of one (model, T, N, dtype)."""

    def __init__(self, cfg: dict[str, Any], device: Any, settings: dict[str, Any]) -> None:
        import torch

        self.cfg = cfg
        self.dtype = torch_dtype(cfg["dtype"])
        self.neuron = bn.make_neuron(cfg["model"])
        t_len, n = cfg["T"], cfg["N"]
        gen = torch.Generator(device=device)
        gen.manual_seed(zlib.crc32(f"{cfg['model']}/{t_len}/{n}/{cfg['dtype']}".encode()))
        x_bytes = t_len * n * torch.empty((), dtype=self.dtype).element_size()
        nbuf = math.ceil(settings["rotate_mb"] * 2**20 / x_bytes)
        self.nbuf = int(max(1, min(settings["max_bufs"], nbuf)))
        self.raw = [
            bn.bench_input(cfg["model"], (t_len, n), gen, device).to(self.dtype)
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

    def xs(self, training: bool) -> list[Any]:
        return [x.detach().requires_grad_(training) for x in self.raw]

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


# --------------------------------------------------------------------------------------
# peers
# --------------------------------------------------------------------------------------


class Runner:
    """One peer for one (model, dtype, mode): ``forward(x) -> spikes``."""

    note = ""

    def forward(self, x: Any) -> Any:
        raise NotImplementedError

    def parameters(self) -> list[Any]:
        return []

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    def baseline_forward(self, x: Any) -> Any:
        """Forward used under no_grad as the baseline of the retained-memory measurement."""
        return self.forward(x)

    def describe(self) -> str:
        return self.note


class SymneuronRunner(Runner):
    """``sn.simulate`` on a backend: the symneuron peer (cuda) and the torch peer (torch)."""

    def __init__(self, model: str, dtype: Any, device: Any, training: bool, backend: str) -> None:
        import torch

        import symneuron as sn

        self.simulate = sn.simulate
        self.neuron = bn.make_neuron(model)
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


class CompileRunner(SymneuronRunner):
    """``simulate_reference`` under ``torch.compile``, one compiled function per ``key``
    (model, dtype, mode, T and, unless N is dynamic, N), the params passed as an argument.
    (``sn.simulate`` is not compiled: Dynamo fails on it for single-state models.)"""

    def __init__(self, model: str, dtype: Any, device: Any, training: bool, key: Any,
                 cache: dict[Any, Any], settings: dict[str, Any]) -> None:  # fmt: skip
        import torch

        super().__init__(model, dtype, device, training, "torch")
        self.dynamic_n, self.mode = settings["compile_dynamic_n"], settings["compile_mode"]
        self.fresh = key not in cache
        if self.fresh:
            neuron, mode = self.neuron, None if self.mode == "default" else self.mode
            cache[key] = torch.compile(lambda x, p: reference_spikes(neuron, x, p), mode=mode)
        self.compiled = cache[key]
        self.graphs, self.calls = [0, 0], 0  # graphs compiled by the first call, by later ones

    def forward(self, x: Any) -> Any:
        import torch

        if self.fresh and self.dynamic_n:
            torch._dynamo.mark_dynamic(x, 1)
        self.fresh = False
        stats = torch._dynamo.utils.counters["stats"]
        before = stats["unique_graphs"]
        out = self.compiled(x, self.params)
        self.graphs[self.calls > 0] += stats["unique_graphs"] - before
        self.calls += 1
        return out

    def baseline_forward(self, x: Any) -> Any:
        # the eager call returns the same outputs; calling the compiled function under
        # no_grad would compile a second graph just for this measurement
        return super().forward(x)

    def describe(self) -> str:
        later = self.graphs[1] / max(1, self.calls - 1)
        return (
            f"symneuron simulate_reference under torch.compile, dynamic_n={self.dynamic_n}, "
            f"mode={self.mode}; graphs compiled: {self.graphs[0]} by the first call, "
            f"{later:.1f} per later call"
        )


class SJRunner(Runner):
    """A SpikingJelly node (0.0.0.0.14 with ``backend="cupy"``, 2.0.0 its default)."""

    def __init__(self, version: str, sj: SpikingJelly, model: str, dtype: Any, device: Any) -> None:
        kw = {}
        if version == "sj014":
            kw["backend"] = "cupy" if device.type == "cuda" else "torch"
            self.note = "" if device.type == "cuda" else "dry run: backend=torch"
        self.node = bn.sj_node(sj, model, **kw).to(device)
        self.dtype = dtype

    def cast_params(self) -> SJRunner:
        self.node.to(self.dtype)
        self.note = (self.note + "; " if self.note else "") + "node params cast to the input dtype"
        return self

    def forward(self, x: Any) -> Any:
        self.node.reset()
        return self.node(x)

    def parameters(self) -> list[Any]:
        return list(self.node.parameters())


# --------------------------------------------------------------------------------------
# one measurement
# --------------------------------------------------------------------------------------


def _first_call(runner: Runner, x: Any, training: bool, timer: Timer) -> tuple[Any, float]:
    timer.sync()
    t0 = time.perf_counter()
    spikes = runner.forward(x)
    if training:
        spikes.sum().backward()
    timer.sync()
    return spikes, time.perf_counter() - t0


def _reps(estimate_s: float, s: dict[str, Any]) -> int:
    if estimate_s <= 0:
        return s["max_reps"]
    return int(max(s["min_reps"], min(s["max_reps"], math.ceil(s["target_ms"] / 1e3 / estimate_s))))


def check_first_call(runner: Runner, inputs: Inputs, x: Any, training: bool, timer: Timer,
                     settings: dict[str, Any], rec: Rec,
                     retry: Callable[[], Runner] | None) -> Runner:  # fmt: skip
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


def measure(runner: Runner, inputs: Inputs, mode: str, timer: Timer, settings: dict[str, Any],
            rec: Rec, retry: Callable[[], Runner] | None = None) -> None:  # fmt: skip
    """Check ``runner``'s first call against the reference, then time it into ``rec``:
    the median wall time (host overhead counts) and device time (:meth:`Timer.device`)."""
    import torch
    from core import no_gc

    training = mode == "training"
    xs = inputs.xs(training)

    def call(i: int) -> None:
        x = xs[i % len(xs)]
        if training:
            x.grad = None
            runner.zero_grad()
            runner.forward(x).sum().backward()
        else:
            runner.forward(x)

    with torch.enable_grad() if training else torch.no_grad():
        runner = check_first_call(runner, inputs, xs[0], training, timer, settings, rec, retry)
        # warm-up, then the estimate that sizes the repetitions
        est = [timer.wall(lambda i: call(1), 1)[0] for _ in range(max(1, settings["warmup"]))]
        with no_gc():
            wall = timer.wall(call, _reps(min(est), settings))
            host = statistics.median(wall)
            dev = timer.device(call, _reps(host, settings), host)
    if runner.describe():
        rec["note"] = runner.describe()
    rec.update(status="ok", gpu_batches_host_slower=timer.gap_risk, wall_s=host,
               gpu_s=statistics.median(dev), wall_min_s=min(wall), gpu_min_s=min(dev),
               reps_wall=len(wall), reps_gpu=len(dev), buffers=len(xs))  # fmt: skip
    if training and timer.cuda:
        rec["retained_bytes"] = retained_memory(runner, inputs, timer)
    for x in xs:
        x.grad = None


def retained_memory(runner: Runner, inputs: Inputs, timer: Timer) -> int:
    """memory_allocated after a forward with grad minus after one without (outputs alive)."""
    import torch

    x, used = inputs.raw[0].detach(), []
    for forward, grad in ((runner.baseline_forward, False), (runner.forward, True)):
        runner.zero_grad()
        gc.collect()
        timer.sync()
        base = torch.cuda.memory_allocated()
        with torch.set_grad_enabled(grad):
            out = forward(x.requires_grad_(grad))
            timer.sync()
            used.append(torch.cuda.memory_allocated() - base)
        del out
    runner.zero_grad()
    return int(used[1] - used[0])


# --------------------------------------------------------------------------------------
# the workers
# --------------------------------------------------------------------------------------


class WorkerState:
    """A worker's device, timer, SpikingJelly, compiled functions and current inputs."""

    def __init__(self, kind: str, settings: dict[str, Any]) -> None:
        import torch

        self.kind, self.settings = kind, settings
        self.device = torch.device("cpu" if settings["dry_run"] else "cuda")
        if self.device.type == "cuda":
            torch.cuda.init()
            torch.zeros(1, device=self.device)
        self.timer = Timer(self.device)
        self.inputs: Inputs | None = None
        self.compiled: dict[Any, Any] = {}
        self.sj = SpikingJelly(SJ_VERSION[kind]) if kind in ("sj014", "sj200") else None
        # the compile peer compiles a graph per (model, dtype, mode, T)
        limits = dict(cache_size_limit=1024, recompile_limit=1024)
        limits.update(accumulated_cache_size_limit=8192, accumulated_recompile_limit=8192)
        for name, value in limits.items():
            if kind == "main" and hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, value)

    def meta(self) -> dict[str, Any]:
        out = {"worker": self.kind, "versions": versions(), **device_info(self.device)}
        out["sleep_cycles_per_s"] = self.timer.cycles_per_s
        if self.sj is not None:
            out.update(spikingjelly=self.sj.version, spikingjelly_file=self.sj.file)
        return out

    def copy(self, nbytes: int) -> dict[str, Any]:
        """The device-to-device copy bandwidth of the floor model (bytes read + written)."""
        import torch

        bufs = [torch.ones(nbytes // 4, device=self.device) for _ in range(2)]
        for _ in range(3):
            bufs[1].copy_(bufs[0])
        times = self.timer.device(lambda _: bufs[1].copy_(bufs[0]), 20, 1e-5)
        nbytes = bufs[0].numel() * 4
        bufs.clear()
        self._free()
        t = statistics.median(times)
        out = {
            "bytes": nbytes,
            "gpu_s": t,
            "gpu_min_s": min(times),
            "bandwidth_Bps": 2 * nbytes / t,
        }
        return {**out, "counted": "bytes read + bytes written"}

    def _free(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            self.timer.torch.cuda.empty_cache()

    def _runner(self, peer: str, cfg: dict[str, Any]) -> Runner:
        args = (cfg["model"], torch_dtype(cfg["dtype"]), self.device)
        training = cfg["mode"] == "training"
        if peer in ("symneuron", "torch"):
            return SymneuronRunner(*args, training, "cuda" if peer == "symneuron" else "torch")
        if peer == "compile":
            n = None if self.settings["compile_dynamic_n"] else cfg["N"]
            key = (cfg["model"], cfg["dtype"], cfg["mode"], cfg["T"], n)
            return CompileRunner(*args, training, key, self.compiled, self.settings)
        assert self.sj is not None
        return SJRunner(peer, self.sj, *args)

    def inputs_for(self, cfg: dict[str, Any]) -> Inputs:
        same = ("model", "T", "N", "dtype")  # the two modes share inputs and reference
        if self.inputs is None or any(self.inputs.cfg[k] != cfg[k] for k in same):
            self.inputs = None
            self._free()
            self.inputs = Inputs(cfg, self.device, self.settings)
        return self.inputs

    def bench(self, cfg: dict[str, Any], peers: list[str]) -> dict[str, Any]:
        """One record per peer of ``cfg``; ``exit`` 3 once the CUDA context is unusable."""
        try:
            inputs = self.inputs_for(cfg)
        except Exception as exc:  # noqa: BLE001
            error = f"inputs/reference: {short_error(exc)}"
            recs = [{**cfg, "peer": p, "status": "error", "error": error} for p in peers]
            return {"records": recs, **({"exit": 3} if is_sticky_cuda(exc) else {})}
        records: list[Rec] = []
        for peer in peers:
            rec: Rec = {**cfg, "peer": peer, "status": "error", "buffers": inputs.nbuf}
            records.append(rec)
            if self.sj is not None:
                self.sj.clear()
            try:
                runner = self._runner(peer, cfg)
                half_sj = isinstance(runner, SJRunner) and inputs.half
                measure(runner, inputs, cfg["mode"], self.timer, self.settings, rec,
                        runner.cast_params if half_sj else None)  # fmt: skip
            except Exception as exc:  # noqa: BLE001
                rec.update(status=_status_of(exc), error=short_error(exc))
                log(f"[{self.kind}] {config_key(cfg)} {peer}: {rec['status']}: {exc!r:.300}")
                if is_sticky_cuda(exc):  # answer, then exit so that the parent restarts us
                    why = "not run: an earlier peer left the CUDA context unusable"
                    rest = [{**cfg, "peer": p, "status": "error", "error": why}
                            for p in peers[len(records) :]]  # fmt: skip
                    return {"records": records + rest, "exit": 3}
            finally:
                if peer == "sj200" and self.sj is not None:
                    rec["implementation"] = self.sj.implementation(cfg["model"], self.device)
                runner = None
                self._free()
        return {"records": records}


def firstcall(impl: str, settings: dict[str, Any], models: list[str]) -> dict[str, Any]:
    """First forward+backward in a fresh process; cache dirs come from the environment."""
    out: dict[str, Any] = {"impl": impl, "env": {k: os.environ.get(k) for k in CACHE_VARS}}
    out.update(T=settings["fc_T"], N=settings["fc_N"], models={})
    t0 = time.perf_counter()
    import torch

    out["import_torch_s"] = time.perf_counter() - t0
    device = torch.device("cpu" if settings["dry_run"] else "cuda")
    t0 = time.perf_counter()
    torch.zeros(1, device=device)
    # torch's own one-off costs (the autograd engine's device thread, the first reduction
    # and fill kernels), paid by any first backward whatever the model, kept out
    (torch.rand(8, 8, device=device, requires_grad=True) * 2.0).sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    out["cuda_init_s"] = time.perf_counter() - t0
    timer = Timer(device)
    t0 = time.perf_counter()
    sj = None if impl == "symneuron" else SpikingJelly(SJ_VERSION[impl])
    if sj is None:
        __import__("symneuron")
    out["import_s"] = time.perf_counter() - t0
    if sj is not None:
        out["spikingjelly"] = sj.version
    elif device.type == "cuda":
        out["runtime_init_s"] = _runtime_start()
    gen = torch.Generator(device=device).manual_seed(0)
    for model in models:
        rec: dict[str, Any] = out["models"].setdefault(model, {})
        try:
            x = 2.2 * torch.rand((settings["fc_T"], settings["fc_N"]), generator=gen,
                                 device=device) - 0.2  # fmt: skip
            args = (model, torch.float32, device)
            runner = (
                SymneuronRunner(*args, True, "cuda") if sj is None else SJRunner(impl, sj, *args)
            )
            for key in ("first_s", "second_s", "third_s"):
                runner.zero_grad()
                rec[key] = _first_call(runner, x.detach().requires_grad_(), True, timer)[1]
            rec["note"] = runner.describe()
        except Exception as exc:  # noqa: BLE001
            rec["error"] = short_error(exc)
    return out


def _runtime_start() -> float:
    """One-time runtime start: CuPy import, NVRTC library load, module load of a trivial
    kernel. A user's very first call pays this once on top of the first model's time."""
    t0 = time.perf_counter()
    import cupy

    code = 'extern "C" __global__ void symneuron_bench_noop() {}'
    cupy.RawModule(code=code, options=("-std=c++17",)).get_function("symneuron_bench_noop")
    return time.perf_counter() - t0


def derive(model: str) -> dict[str, Any]:
    """Symbolic derivation time of one zoo model in a fresh process."""
    out: dict[str, Any] = {"model": model}

    def timed(key: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        value = fn()
        out[key] = time.perf_counter() - t0
        return value

    sn = timed("import_s", lambda: __import__("symneuron"))
    # SymPy's one-off costs (its lazy imports on first use, e.g. sympy.tensor from
    # Add.flatten, ~50 ms locally) land on whichever neuron a process derives first;
    # they are measured on a throwaway neuron and reported apart from the model's time
    warm = sn.Neuron(sn.V + (sn.X - sn.V) / 3, name="bench_warmup")
    timed("sympy_first_use_s", lambda: (warm.spec(), warm.source("cuda", "float32")))
    neuron = timed("ctor_s", lambda: bn.make_neuron(model))
    timed("spec_s", neuron.spec)
    out["source_chars"] = len(timed("source_s", lambda: neuron.source("cuda", "float32")))
    out["total_s"] = out["ctor_s"] + out["spec_s"] + out["source_s"]
    return out


def worker_main(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    """``--worker``: a long-lived peer worker, or a one-shot measurement into a file."""
    import json

    from core import serve

    if args.worker in ("firstcall", "derive"):
        try:
            if args.worker == "derive":
                out = derive(args.impl)
            else:
                out = firstcall(args.impl, settings, args.models or ["LIF"])
        except Exception as exc:  # noqa: BLE001
            out = {"error": short_error(exc)}
        Path(args.result_file).write_text(json.dumps(out, indent=1, default=str))
        return 0
    ops = {
        "copy": lambda state, req: {"copy": state.copy(int(req["bytes"]))},
        "bench": lambda state, req: state.bench(req["cfg"], req["peers"]),
    }
    return serve(lambda: WorkerState(args.worker, settings), ops)
