#!/usr/bin/env python3
"""symneuron's benchmark: the peer comparison, kernel-only sweeps and host-overhead parts.

Modes (``--dry-run`` runs any of them on the CPU with tiny sizes, as a smoke test):

* default, the **peer comparison**: each configuration (model, T, N, dtype, mode) of the
  matrix, every peer checked against symneuron's float64 reference, then timed (wall and
  GPU); JSON + PNG in ``--out-dir``, a short table on stdout (``report.py``: the docs).
* ``--quick``: the comparison on a small matrix (``QUICK``); with ``--peers symneuron
  --skip-first-call --skip-derivation``, symneuron alone, for iteration.
* ``--sweep block,lanes,surrogate``: **kernel-only** times of the generated forward and
  backward kernels (no autograd, no host overhead; T = 64, N = 2^20) with threads per block
  or the vector width varied through ``symneuron.runtime.settings``, or per surrogate form.
* ``--overhead``: the **host-overhead parts** of a small training call (LIF, T = 4,
  N = 2^14): symneuron's calls, torch's own floor, the kernel launches alone and in a bare
  ``autograd.Function``, then a torch profile and a cProfile of the training call.

Peers (``--peers``): ``symneuron`` (``sn.simulate(..., backend="cuda")``); ``sj014``
(SpikingJelly 0.0.0.0.14, ``backend="cupy"``); ``sj200`` (SpikingJelly 2.0.0, its default
Triton implementation); ``torch`` (symneuron's torch reference, ``sn.simulate(...,
backend="torch")``, eager) and ``compile`` (``simulate_reference`` under ``torch.compile``).

Models: the single-state zoo (IF, LIF, PLIF, QIF, EIF; the default) and, with ``--models``
(``--models zoo``: all 20, the models no peer implements run symneuron alone),
``Izhikevich`` (a = 0.3, b = 0.2 on every side) and ``ALIF`` (no SpikingJelly counterpart).
A device-to-device copy gives the bandwidth of the floor model (``floor.py``).

Process layout (comparison): the parent only orchestrates; timing runs in long-lived
workers, one at a time: ``main`` (symneuron, torch, compile, the copy), ``sj014`` and
``sj200`` (each with its own SpikingJelly on PYTHONPATH: the two conflict), answering one
JSON line per request. A worker that dies or hangs is restarted and its configurations
recorded as errors, so no peer can end the run. Fresh processes measure the derivation
and the first calls (fresh and warm disk caches).

Examples::

    python3 benchmarks/bench_neurons.py --quick --sj014-path /tmp/sj014 --sj200-path /tmp/sj200
    python3 benchmarks/bench_neurons.py --models Izhikevich,ALIF --T 16,64 --N 2^20 \
        --dtypes fp32,bf16 --peers symneuron,sj014,sj200
    python3 benchmarks/bench_neurons.py --sweep block,surrogate --models LIF,QIF,PLIF,EIF
    python3 benchmarks/bench_neurons.py --overhead
    python3 benchmarks/bench_neurons.py --dry-run
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import hashlib
import json
import math
import os
import platform
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _path in (str(REPO), str(HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import floor  # noqa: E402  (benchmarks/floor.py)

SCHEMA = "symneuron-bench/1"
MARK_READY, MARK_RESULT = "@@READY ", "@@RESULT "
SINGLE_MODELS = ["IF", "LIF", "PLIF", "QIF", "EIF"]
STATEFUL_MODELS = ["Izhikevich", "ALIF"]
#: paper models (symneuron only: no peer implements them); each counted with its own floor
PAPER_MODELS = ["Izhikevich2003", "HodgkinHuxley"]
#: the rest of the zoo (symneuron only), so that every model has a measured floor fraction
OTHER_MODELS = ["ThresholdLIF", "CuLIF", "AdEx", "AdEx2005", "FitzHughNagumo",
                "ResonateAndFire", "AdLIF", "IafCondExp", "IafPscExp", "ThetaNeuron",
                "RefractoryLIF"]  # fmt: skip
#: input scale of the models in their own units (mV/pA models need a current that fires):
#: the inputs are scale * U(-0.2, 2), scales chosen so that the float64 reference fires
#: (rates over 64 steps: CuLIF 0.10, AdEx2005 0.09, FitzHugh-Nagumo 0.02, resonate-and-fire
#: 0.19, AdLIF 0.24, iaf_cond_exp 0.17, iaf_psc_exp 0.08, theta 0.15; unlisted: scale 1)
INPUT_SCALE = {"Izhikevich2003": 10.0, "HodgkinHuxley": 25.0, "CuLIF": 0.25,
               "AdEx2005": 1e4, "ResonateAndFire": 16.0, "AdLIF": 16.0, "IafCondExp": 300.0,
               "IafPscExp": 3e3, "ThetaNeuron": 64.0}  # fmt: skip
ALL_MODELS = SINGLE_MODELS + STATEFUL_MODELS + PAPER_MODELS + OTHER_MODELS
#: constructor arguments of the benchmarked neuron (the same constants on every side)
MODEL_KWARGS: dict[str, dict[str, float]] = {"Izhikevich": {"a": 0.3, "b": 0.2}}
ALL_T, ALL_N = [4, 16, 64, 256], [2**20, 2**14]
ALL_DTYPES = ["fp32", "fp16", "bf16"]
ALL_MODES = ["inference", "training"]
ALL_PEERS = ["symneuron", "sj014", "sj200", "torch", "compile"]
PEER_WORKER = {"symneuron": "main", "torch": "main", "compile": "main"}
QUICK = dict(models=["LIF", "PLIF", "QIF"], T=[4, 16, 64], N=ALL_N, dtypes=["fp32", "bf16"])
DRY = dict(models=["LIF", "PLIF"], T=[4, 8], N=[2**8, 2**10], dtypes=["fp32", "bf16"])
#: SpikingJelly's class of each model, and the constants it takes from the zoo's params
SJ_CLASSES = {"IF": "IFNode", "LIF": "LIFNode", "PLIF": "ParametricLIFNode", "QIF": "QIFNode",
              "EIF": "EIFNode", "Izhikevich": "IzhikevichNode"}  # fmt: skip
SJ_PARAMS = {"LIF": ("tau",), "QIF": ("tau", "v_c", "a0", "v_rest"),
             "EIF": ("tau", "delta_T", "theta_rh", "v_rest"),
             "Izhikevich": ("tau", "v_c", "a0", "v_rest", "tau_w", "a", "b")}  # fmt: skip
SURROGATE_ALPHA = 4.0  # sn.surrogate.Sigmoid() and SpikingJelly's Sigmoid() default
CACHE_VARS = ("SYMNEURON_CACHE", "CUPY_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------


def _parse_n(text: str) -> int:
    """ "2^20", "2**20", "20" (an exponent up to 40) or "1048576"."""
    for sep in ("^", "**"):
        if sep in text:
            base, exp = text.split(sep)
            return int(base) ** int(exp)
    value = int(text)
    return 2**value if value <= 40 else value


DTYPE_ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}


def _csv(kind: Callable[[str], Any], allowed: list[Any] | None = None, aliases: Any = None) -> Any:
    """A comma-separated list of ``kind``, each in ``allowed`` (after ``aliases``)."""

    def parse(text: str) -> list[Any]:
        out = [kind((aliases or {}).get(s, s)) for s in text.replace(" ", "").split(",") if s]
        bad = [o for o in out if allowed is not None and o not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad} not in {allowed}")
        return out

    return parse


def _models(text: str) -> list[str]:
    """``--models``: names from :data:`ALL_MODELS`, or ``zoo`` for all of them."""
    return list(ALL_MODELS) if text.strip() == "zoo" else _csv(str, ALL_MODELS)(text)


# fmt: off
#: settings handed to the workers, one flag each: (flag, type, default, help)
SETTINGS = [
    ("target-ms", float, 50.0, "time per measurement (wall, GPU each)"),
    ("min-reps", int, 5, None),
    ("max-reps", int, 200, None),
    ("warmup", int, 2, "warm-up calls after the first (checked) call"),
    ("rotate-mb", float, 256.0, "rotate among input copies of about this many MiB (L2 defeat)"),
    ("max-bufs", int, 8, None),
    ("compile-max-T", int, 64, "skip torch.compile above this T"),
    ("compile-mode", str, "default", None),
    ("fp32-max-mismatch", float, 1e-5, "fp32 passes if at most this fraction of spikes differ "
     "from the float64 reference (threshold ties flip a few per 10^7; the count is recorded)"),
    ("half-min-match", float, 0.99, "16-bit passes if at least this fraction of spikes match"),
    ("grad-slice", int, 4096, "neurons whose dL/dX is compared with the reference (training)"),
    ("fc-T", int, 16, "T of the first-call measurement"),
    ("fc-N", _parse_n, 2**16, "N of the first-call measurement"),
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    g = p.add_argument_group("mode (default: the peer comparison)")
    m = g.add_mutually_exclusive_group()
    m.add_argument("--sweep", type=_csv(str, list(SWEEPS)), default=None, help="kernel-only: "
                   "any of block,lanes,surrogate (models default LIF,QIF,PLIF,EIF; fp32,bf16)")
    m.add_argument("--overhead", action="store_true", help="host-overhead parts (LIF, T=4, N=2^14)")
    g.add_argument("--dry-run", action="store_true", help="CPU smoke test: tiny sizes, C/torch "
                   "backends, perf_counter timing")
    g.add_argument("--list", action="store_true", help="print the planned configurations, exit")
    g = p.add_argument_group("matrix")
    g.add_argument("--models", type=_models, default=None,
                   help=",".join(ALL_MODELS) + f", or zoo: all (default {','.join(SINGLE_MODELS)})")
    g.add_argument("--T", type=_csv(int), default=None, help="e.g. 4,16,64,256")
    g.add_argument("--N", type=_csv(_parse_n), default=None, help="e.g. 2^20,2^14 (or 20,14)")
    g.add_argument("--dtypes", type=_csv(str, ALL_DTYPES, DTYPE_ALIASES), default=None,
                   help="fp32,fp16,bf16 (float32, float16, bfloat16 accepted)")
    g.add_argument("--modes", type=_csv(str, ALL_MODES), default=None, help=",".join(ALL_MODES))
    g.add_argument("--peers", type=_csv(str, ALL_PEERS), default=None, help=",".join(ALL_PEERS))
    g.add_argument("--quick", action="store_true", help=f"{QUICK} (explicit filters win)")
    g = p.add_argument_group("paths")
    g.add_argument("--out-dir", default=None, help="default benchmarks/results (dry run: temp)")
    g.add_argument("--sj014-path", default=os.environ.get("SJ014_PATH", "/tmp/sj014"))
    g.add_argument("--sj200-path", default=os.environ.get("SJ200_PATH", "/tmp/sj200"))
    g.add_argument("--tag", default="", help="appended to the result file name")
    g = p.add_argument_group("timing and checks (handed to the workers)")
    for flag, kind, default, text in SETTINGS:
        g.add_argument(f"--{flag}", type=kind, default=default, help=text)
    g.add_argument("--no-compile-dynamic-n", dest="compile_dynamic_n", action="store_false",
                   help="compile each N separately (default: N marked dynamic)")
    g = p.add_argument_group("run")
    g.add_argument("--rounds", type=int, default=1, help="measure each configuration this many "
                   "times, peers taking turns in alternating order; median of the rounds")
    g.add_argument("--copy-gib", type=float, default=1.0)
    g.add_argument("--time-budget-s", type=float, default=450.0,
                   help="stop starting new configurations after this many seconds")
    g.add_argument("--compile-budget-s", type=float, default=180.0,
                   help="total torch.compile first-call time; after it the compile peer is skipped")
    g.add_argument("--request-timeout-s", type=float, default=300.0)
    g.add_argument("--worker-start-timeout-s", type=float, default=240.0)
    g.add_argument("--skip-first-call", action="store_true")
    g.add_argument("--skip-derivation", action="store_true")
    g.add_argument("--no-plot", action="store_true")
    g = p.add_argument_group("internal")
    g.add_argument("--worker", choices=["main", "sj014", "sj200", "firstcall", "derive"],
                   default=None, help=argparse.SUPPRESS)
    for flag in ("--settings", "--impl", "--result-file"):
        g.add_argument(flag, default=None, help=argparse.SUPPRESS)
    return p
# fmt: on


def worker_settings(args: argparse.Namespace) -> dict[str, Any]:
    out = {"dry_run": args.dry_run, "compile_dynamic_n": args.compile_dynamic_n}
    for flag, *_ in SETTINGS:
        out[flag.replace("-", "_")] = getattr(args, flag.replace("-", "_"))
    if args.dry_run:
        out.update(rotate_mb=1.0, fc_N=256)
    return out


def resolve_matrix(args: argparse.Namespace) -> dict[str, list[Any]]:
    base: dict[str, list[Any]] = dict(models=SINGLE_MODELS, T=ALL_T, N=ALL_N, dtypes=ALL_DTYPES)
    base.update(QUICK if args.quick else {})
    base.update(DRY if args.dry_run else {})
    base.update(modes=ALL_MODES, peers=ALL_PEERS)
    return {k: getattr(args, k) or v for k, v in base.items()}


def plan_configs(matrix: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Most important first (fp32, then bf16, fp16; large N first); mode innermost so that
    a worker reuses inputs and reference across the two modes of one (model, T, N, dtype)."""
    drank = {d: i for i, d in enumerate(["fp32", "bf16", "fp16"])}
    return [
        dict(model=model, T=t, N=n, dtype=dtype, mode=mode)
        for dtype in sorted(matrix["dtypes"], key=lambda d: drank[d])
        for n in sorted(matrix["N"], reverse=True)
        for model in [m for m in ALL_MODELS if m in matrix["models"]]
        for t in sorted(matrix["T"])
        for mode in [m for m in ALL_MODES if m in matrix["modes"]]
    ]


def config_key(cfg: dict[str, Any]) -> str:
    return f"{cfg['model']}/T{cfg['T']}/N{cfg['N']}/{cfg['dtype']}/{cfg['mode']}"


# --------------------------------------------------------------------------------------
# shared helpers (torch is imported lazily so that the parent stays light)
# --------------------------------------------------------------------------------------


def _torch_dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


class Timer:
    """Wall and device timing; CUDA events on a GPU, perf_counter on the CPU (dry run)."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.cuda = device.type == "cuda"
        self.cycles_per_s: float | None = None
        self.gap_risk = 0
        if self.cuda:
            try:  # calibrate torch.cuda._sleep, used to queue work ahead of each batch
                torch.cuda._sleep(1000)
                self.sync()
                cycles, ((a, b),) = 20_000_000, self._events(1)
                a.record()
                torch.cuda._sleep(cycles)
                b.record()
                self.sync()
                self.cycles_per_s = cycles / (a.elapsed_time(b) / 1e3)
            except Exception as exc:  # noqa: BLE001
                log(f"[timer] torch.cuda._sleep unavailable ({exc}); GPU times may include gaps")

    def _events(self, k: int) -> list[tuple[Any, Any]]:
        event = self.torch.cuda.Event
        return [(event(enable_timing=True), event(enable_timing=True)) for _ in range(k)]

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def wall(self, call: Any, xs: list[Any], reps: int) -> list[float]:
        out = []
        for i in range(reps):
            self.sync()
            t0 = time.perf_counter()
            call(xs[i % len(xs)])
            self.sync()
            out.append(time.perf_counter() - t0)
        return out

    def device(self, call: Any, xs: list[Any], reps: int, host_s: float) -> list[float]:
        """Per-call device time. A GPU sleep is queued ahead of each batch so that the host
        enqueues the whole batch before the GPU reaches it: events then bracket device work
        only, not host launch gaps (unless a call blocks the host or overflows the queue)."""
        if not self.cuda:
            return self.wall(call, xs, reps)
        out: list[float] = []
        per_call_host = host_s  # first guess: the wall time (an upper bound of the host time)
        self.gap_risk = 0
        while len(out) < reps:
            done, k = len(out), min(20, reps - len(out))
            events = self._events(k)
            self.sync()
            sleep_s = 0.0
            if self.cycles_per_s:
                sleep_s = min(0.25, max(2e-4, 1.5 * k * per_call_host + 1e-4))
                self.torch.cuda._sleep(int(self.cycles_per_s * sleep_s))
            t0 = time.perf_counter()
            for j, (a, b) in enumerate(events):
                a.record()
                call(xs[(done + j) % len(xs)])
                b.record()
            enqueue = time.perf_counter() - t0
            self.gap_risk += enqueue > sleep_s  # the GPU may have caught up with the host
            per_call_host = enqueue / k
            self.sync()
            out.extend(a.elapsed_time(b) / 1e3 for a, b in events)
        return out

    def back_to_back(self, call: Callable[[], Any], reps: int, host: bool = False) -> float:
        """Seconds per call of ``reps`` calls issued back to back after a few warm-up calls:
        between CUDA events (device time), or wall time with ``host`` or on the CPU."""
        for _ in range(max(3, reps // 15)):
            call()
        self.sync()
        ((a, b),) = self._events(1) if self.cuda and not host else [(None, None)]
        t0 = time.perf_counter()
        if a is not None:
            a.record()
        for _ in range(reps):
            call()
        if a is None:
            self.sync()
            return (time.perf_counter() - t0) / reps
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3 / reps

    def allocated(self) -> int:
        return int(self.torch.cuda.memory_allocated()) if self.cuda else 0


def _reps(estimate_s: float, s: dict[str, Any]) -> int:
    if estimate_s <= 0:
        return s["max_reps"]
    return int(max(s["min_reps"], min(s["max_reps"], math.ceil(s["target_ms"] / 1e3 / estimate_s))))


def _short_error(exc: BaseException) -> str:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    last = "".join(tb[-3:]).strip()
    return f"{type(exc).__name__}: {exc}"[:600] + ("\n" + last[-900:] if last else "")


STICKY_CUDA = ("illegal memory access", "CUDA error: an illegal", "unspecified launch failure",
               "misaligned address", "CUDA_ERROR_ILLEGAL", "cudaErrorIllegalAddress",
               "device-side assert", "CUDA_ERROR_LAUNCH_FAILED")  # fmt: skip


def _is_sticky_cuda(exc: BaseException) -> bool:
    """Whether ``exc`` leaves the CUDA context unusable (the worker must restart)."""
    return any(n in f"{type(exc).__name__}: {exc}" for n in STICKY_CUDA)


def _status_of(exc: BaseException) -> str:
    text = str(exc).lower()
    dtype = any(w in text for w in ("dtype", "bfloat16", "half", "float16"))
    said = any(w in text for w in ("support", "not implemented", "expected"))
    return "unsupported" if isinstance(exc, NotImplementedError) or dtype and said else "error"


def make_neuron(model: str, **kw: Any) -> Any:
    """The zoo model with the benchmark's constants (``MODEL_KWARGS``); the peers use
    SpikingJelly's default Sigmoid(alpha=4) surrogate, so the zoo's default must be it."""
    import symneuron as sn

    neuron = getattr(sn.models, model)(**MODEL_KWARGS.get(model, {}), **kw)
    expected = f"Sigmoid(alpha={SURROGATE_ALPHA})"
    if not kw and getattr(neuron.surrogate, "name", "") != expected:
        raise RuntimeError(f"{model}: default surrogate is {neuron.surrogate.name}, not {expected}")
    return neuron


def sj_kwargs(model: str, neuron: Any) -> dict[str, Any]:
    """SpikingJelly constructor arguments with the same constants as the symneuron zoo model."""
    if model not in SJ_CLASSES:
        raise NotImplementedError(f"SpikingJelly has no {model} neuron")
    p = {k: float(v) for k, v in neuron.params.items()}
    kw = {name: p[name] for name in SJ_PARAMS.get(model, ())}
    kw.update(v_threshold=float(neuron.v_threshold), v_reset=neuron.v_reset)
    kw.update(detach_reset=bool(neuron.detach_reset))
    if model in ("LIF", "PLIF"):
        kw["decay_input"] = True
    if model == "PLIF":
        kw["init_tau"] = 1.0 + math.exp(-p["w"])
    if model == "Izhikevich":
        kw["w_rest"] = float(neuron.states["W"].init)
    return kw


def bench_input(model: str, shape: tuple[int, ...], gen: Any, device: Any) -> Any:
    """The benchmark's input for ``model``: U(-0.2, 2) times its ``INPUT_SCALE`` (float32)."""
    import torch

    scale = INPUT_SCALE.get(model, 1.0)
    return scale * (2.2 * torch.rand(shape, generator=gen, device=device) - 0.2)


def reference_spikes(neuron: Any, x: Any, params: dict[str, Any], round_h_to: Any = None) -> Any:
    """The spikes of symneuron's torch reference, started where ``sn.simulate`` starts
    without a ``v_init``: the neuron's ``v_init``, else v_reset (0 under soft reset)."""
    from symneuron.reference import simulate_reference
    from symneuron.simulate import _default_v_init

    values = {**neuron.params, **params}
    v0 = _default_v_init(neuron, x, x.shape[1:], values)
    out = simulate_reference(neuron, x, v0, values, store_v_seq=False, round_h_to=round_h_to)
    return out[0]  # (spikes, v_seq) or (spikes, v_seq, states)


class Inputs:
    """Inputs, rotation buffers and the float64 reference of one (model, T, N, dtype)."""

    def __init__(self, cfg: dict[str, Any], device: Any, settings: dict[str, Any]) -> None:
        import torch

        self.cfg = cfg
        self.dtype = _torch_dtype(cfg["dtype"])
        self.neuron = make_neuron(cfg["model"])
        t_len, n = cfg["T"], cfg["N"]
        gen = torch.Generator(device=device)
        gen.manual_seed(zlib.crc32(f"{cfg['model']}/{t_len}/{n}/{cfg['dtype']}".encode()))
        x_bytes = t_len * n * torch.empty((), dtype=self.dtype).element_size()
        nbuf = math.ceil(settings["rotate_mb"] * 2**20 / x_bytes)
        self.nbuf = int(max(1, min(settings["max_bufs"], nbuf)))
        self.raw = [
            bench_input(cfg["model"], (t_len, n), gen, device).to(self.dtype)
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


def check_spikes(spikes: Any, inputs: Inputs, settings: dict[str, Any]) -> dict[str, Any]:
    got, ref = spikes.detach() != 0, inputs.ref
    if got.shape != ref.shape:
        return {"pass": False, "reason": f"shape {tuple(got.shape)} != {tuple(ref.shape)}"}
    mismatch = int((got != ref).sum())
    frac = mismatch / ref.numel()
    if inputs.half:
        ok = (1.0 - frac) >= settings["half_min_match"]
        rule = f">= {settings['half_min_match']:.0%} of spikes equal (float64 reference, H rounded)"
    else:
        ok = frac <= settings["fp32_max_mismatch"]
        rule = f"<= {settings['fp32_max_mismatch']:g} of spikes differ (float64 reference)"
    return {"pass": bool(ok), "mismatch": mismatch, "mismatch_frac": frac,
            "identical": mismatch == 0, "spike_rate": inputs.spike_rate, "rule": rule}  # fmt: skip


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
        self.neuron = make_neuron(model)
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
    def __init__(self, version: str, sj: Any, model: str, dtype: Any, device: Any) -> None:
        kw = sj_kwargs(model, make_neuron(model))
        kw.update(surrogate_function=sj["surrogate"].Sigmoid(alpha=SURROGATE_ALPHA), step_mode="m")
        if version == "sj014":
            kw["backend"] = "cupy" if device.type == "cuda" else "torch"
            self.note = "" if device.type == "cuda" else "dry run: backend=torch"
        self.node = getattr(sj["neuron"], SJ_CLASSES[model])(**kw).to(device)
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


def measure(
    runner: Runner,
    inputs: Inputs,
    mode: str,
    timer: Timer,
    settings: dict[str, Any],
    rec: dict[str, Any],
    retry: Callable[[], Runner] | None = None,
) -> None:
    """Check ``runner``'s first call against the reference, then time it into ``rec``;
    ``retry`` gives a runner to try once more when the first call fails."""
    import torch

    training = mode == "training"
    xs = inputs.xs(training)

    def call(x: Any) -> None:
        if training:
            x.grad = None
            runner.zero_grad()
            runner.forward(x).sum().backward()
        else:
            runner.forward(x)

    with torch.enable_grad() if training else torch.no_grad():
        # first call: checked (compile time, kernel loading etc. land here)
        try:
            spikes, rec["first_call_s"] = _first_call(runner, xs[0], training, timer)
        except Exception as exc:  # noqa: BLE001
            if retry is None or _is_sticky_cuda(exc):
                raise
            runner = retry()
            rec["retried_after"] = f"{type(exc).__name__}: {exc}"[:300]
            spikes, rec["first_call_s"] = _first_call(runner, xs[0], training, timer)
        rec["check"] = check = check_spikes(spikes, inputs, settings)
        if spikes.dtype != inputs.dtype:
            check["spike_dtype"] = str(spikes.dtype)
        del spikes
        grad = xs[0].grad
        if training and grad is None:
            check["grad"], check["pass"] = "no gradient reached x", False
        elif training:
            check["grad_finite"] = bool(torch.isfinite(grad).all())
            ref = inputs.ref_grad().double()
            diff = grad[:, : inputs.grad_slice].double() - ref
            check["grad_relerr"] = float(diff.norm() / ref.norm().clamp_min(1e-30))
        xs[0].grad = None

        # warm-up, then the estimate that sizes the repetitions
        est = [timer.wall(call, xs[1:] or xs, 1)[0] for _ in range(max(1, settings["warmup"]))]
        gc_was = gc.isenabled()
        gc.disable()
        try:
            wall = timer.wall(call, xs, _reps(min(est), settings))
            host = statistics.median(wall)
            dev = timer.device(call, xs, _reps(host, settings), host)
        finally:
            if gc_was:
                gc.enable()
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
        base = timer.allocated()
        with torch.set_grad_enabled(grad):
            out = forward(x.requires_grad_(grad))
            timer.sync()
            used.append(timer.allocated() - base)
        del out
    runner.zero_grad()
    return int(used[1] - used[0])


# --------------------------------------------------------------------------------------
# workers
# --------------------------------------------------------------------------------------


def _versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version()}
    for name in ("torch", "numpy", "sympy", "cupy", "triton", "matplotlib", "symneuron"):
        try:
            out[name] = getattr(__import__(name), "__version__", "?")
        except Exception as exc:  # noqa: BLE001
            out[name], out[f"{name}_error"] = None, f"{type(exc).__name__}: {exc}"[:200]
    with contextlib.suppress(Exception):
        out["torch_cuda"] = __import__("torch").version.cuda
    digest = hashlib.sha256()
    for path in sorted((REPO / "symneuron").rglob("*.py")):
        digest.update(path.relative_to(REPO).as_posix().encode())
        digest.update(path.read_bytes())
    out["symneuron_source_sha256"] = digest.hexdigest()[:16]
    return out


def _device_info(device: Any) -> dict[str, Any]:
    import torch

    if device.type != "cuda":
        return {"device": str(device), "gpu": f"cpu-{platform.machine()}"}
    props = torch.cuda.get_device_properties(device)
    info: dict[str, Any] = dict(device=str(device), gpu=props.name, total_memory=props.total_memory)
    info.update(sm_count=props.multi_processor_count, capability=f"{props.major}.{props.minor}")
    info["l2_bytes"] = getattr(props, "L2_cache_size", None)
    fields = ("nvidia_smi_name", "driver", "max_sm_clock", "max_mem_clock", "power_limit")
    query = "name,driver_version,clocks.max.sm,clocks.max.mem,power.limit"
    try:
        cmd = ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"]
        q = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        values = [f.strip() for f in q.stdout.splitlines()[0].split(",")]
        info.update(zip(fields, values, strict=False))
    except Exception as exc:  # noqa: BLE001
        info["driver_error"] = str(exc)[:200]
    return info


def _sj_modules(version: str) -> dict[str, Any]:
    import numpy

    if version == "sj014" and not hasattr(numpy, "int"):
        numpy.int = int  # type: ignore[attr-defined]  # removed in NumPy 1.24; 0.0.0.0.14 uses it
    from importlib import metadata

    import spikingjelly
    from spikingjelly.activation_based import neuron, surrogate

    found = None
    with contextlib.suppress(Exception):
        found = metadata.version("spikingjelly")
    expected = {"sj014": "0.0.0.0.14", "sj200": "2.0.0"}[version]
    if found != expected:
        log(f"[{version}] warning: spikingjelly {found} at {spikingjelly.__file__}, not {expected}")
    return dict(neuron=neuron, surrogate=surrogate, version=found, file=spikingjelly.__file__)


class WorkerState:
    def __init__(self, kind: str, settings: dict[str, Any]) -> None:
        import torch

        self.kind = kind
        self.settings = settings
        self.device = torch.device("cpu" if settings["dry_run"] else "cuda")
        if self.device.type == "cuda":
            torch.cuda.init()
            torch.zeros(1, device=self.device)
        self.timer = Timer(self.device)
        self.inputs: Inputs | None = None
        self.compiled: dict[Any, Any] = {}
        self.sj = _sj_modules(kind) if kind in ("sj014", "sj200") else None
        self.sj_fallbacks: list[str] = []
        if kind == "sj200":
            self._watch_sj200()
        # the compile peer compiles a graph per (model, dtype, mode, T)
        limits = dict(cache_size_limit=1024, recompile_limit=1024)
        limits.update(accumulated_cache_size_limit=8192, accumulated_recompile_limit=8192)
        for name, value in limits.items():
            if kind == "main" and hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, value)

    def _watch_sj200(self) -> None:
        """Record SpikingJelly 2.0.0's fallbacks to its torch reference loop (e.g. for
        16-bit state): it calls ``_require_automatic_torch`` (looked up at call time)."""
        try:
            from spikingjelly._ops import selection

            original = selection._require_automatic_torch

            def wrapped(sel: Any, device: Any, reason: str) -> Any:
                self.sj_fallbacks.append(f"{getattr(sel, '_namespace', '?')}: {reason}")
                return original(sel, device, reason)

            selection._require_automatic_torch = wrapped
        except Exception as exc:  # noqa: BLE001
            log(f"[sj200] cannot watch for fallbacks: {exc}")

    def _sj200_implementation(self, model: str) -> str | None:
        if self.sj_fallbacks:
            return "torch reference (" + "; ".join(sorted(set(self.sj_fallbacks))) + ")"
        if self.device.type != "cuda":
            return None
        try:
            from spikingjelly.activation_based import functional

            impl = functional.neuron_implementation(model.lower(), self.device)
            return str(impl["implementation"])
        except Exception as exc:  # noqa: BLE001
            return f"unknown ({type(exc).__name__}: {exc})"[:200]

    def meta(self) -> dict[str, Any]:
        out = {"worker": self.kind, "versions": _versions(), **_device_info(self.device)}
        out["sleep_cycles_per_s"] = self.timer.cycles_per_s
        if self.sj is not None:
            out.update(spikingjelly=self.sj["version"], spikingjelly_file=self.sj["file"])
        return out

    def copy(self, nbytes: int) -> dict[str, Any]:
        import torch

        bufs = [torch.ones(nbytes // 4, device=self.device) for _ in range(2)]
        for _ in range(3):
            bufs[1].copy_(bufs[0])
        times = self.timer.device(lambda _: bufs[1].copy_(bufs[0]), [None], 20, 1e-5)
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
        args = (cfg["model"], _torch_dtype(cfg["dtype"]), self.device)
        training = cfg["mode"] == "training"
        if peer in ("symneuron", "torch"):
            return SymneuronRunner(*args, training, "cuda" if peer == "symneuron" else "torch")
        if peer == "compile":
            n = None if self.settings["compile_dynamic_n"] else cfg["N"]
            key = (cfg["model"], cfg["dtype"], cfg["mode"], cfg["T"], n)
            return CompileRunner(*args, training, key, self.compiled, self.settings)
        return SJRunner(peer, self.sj, *args)

    def bench(self, cfg: dict[str, Any], peers: list[str]) -> list[dict[str, Any]]:
        def failed(peer: str, error: str) -> dict[str, Any]:
            return {**cfg, "peer": peer, "status": "error", "error": error}

        try:
            same = ("model", "T", "N", "dtype")  # the two modes share inputs and reference
            if self.inputs is None or any(self.inputs.cfg[k] != cfg[k] for k in same):
                self.inputs = None
                self._free()
                self.inputs = Inputs(cfg, self.device, self.settings)
            inputs = self.inputs
        except Exception as exc:  # noqa: BLE001
            if _is_sticky_cuda(exc):
                raise SystemExit(3) from exc
            return [failed(p, f"inputs/reference: {_short_error(exc)}") for p in peers]
        records = []
        for peer in peers:
            rec: dict[str, Any] = {**cfg, "peer": peer, "status": "error", "buffers": inputs.nbuf}
            self.sj_fallbacks.clear()
            runner: Runner | None = None
            try:
                _fault_hook(peer, cfg)
                runner = self._runner(peer, cfg)
                retry = runner.cast_params if isinstance(runner, SJRunner) and inputs.half else None
                measure(runner, inputs, cfg["mode"], self.timer, self.settings, rec, retry)
            except Exception as exc:  # noqa: BLE001
                rec.update(status=_status_of(exc), error=_short_error(exc))
                log(f"[{self.kind}] {config_key(cfg)} {peer}: {rec['status']}: {exc!r:.300}")
                if _is_sticky_cuda(exc):
                    # the CUDA context is unusable: answer, then exit so the parent restarts us
                    why = "not run: an earlier peer left the CUDA context unusable"
                    rest = [failed(p, why) for p in peers[len(records) + 1 :]]
                    _reply({"records": [*records, rec, *rest]})
                    raise SystemExit(3) from exc
            finally:
                if peer == "sj200":
                    rec["implementation"] = self._sj200_implementation(cfg["model"])
                del runner
                self._free()
            records.append(rec)
        return records


def _fault_hook(peer: str, cfg: dict[str, Any]) -> None:
    """Testing aid: SNBENCH_FAULT="peer:exit|hang|raise|notimpl[:dtype]" breaks that peer."""
    parts = os.environ.get("SNBENCH_FAULT", "").split(":") + ["raise"]
    if parts[0] != peer or (len(parts) > 3 and parts[2] != cfg["dtype"]):
        return
    if parts[1] == "exit":
        os._exit(7)
    if parts[1] == "hang":
        time.sleep(10**6)
    error = NotImplementedError if parts[1] == "notimpl" else RuntimeError
    raise error(f"fault injected for {peer}")


def _reply(obj: dict[str, Any], mark: str = MARK_RESULT) -> None:
    sys.stdout.write(mark + json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def worker_main(kind: str, settings: dict[str, Any]) -> int:
    try:
        state = WorkerState(kind, settings)
        _reply(state.meta(), MARK_READY)
    except Exception as exc:  # noqa: BLE001
        _reply({"error": _short_error(exc)}, MARK_READY)
        return 2
    for line in sys.stdin:
        req = json.loads(line) if line.strip() else {}
        op = req.get("op")
        if op == "quit":
            return 0
        try:
            if op == "copy":
                _reply({"copy": state.copy(int(req["bytes"]))})
            elif op == "bench":
                _reply({"records": state.bench(req["cfg"], req["peers"])})
            elif op is not None:
                _reply({"error": f"unknown op {op!r}"})
        except SystemExit:
            raise
        except Exception as exc:  # noqa: BLE001
            _reply({"error": _short_error(exc)})
            if _is_sticky_cuda(exc):
                return 3
    return 0


def firstcall_main(impl: str, settings: dict[str, Any], models: list[str], result_file: str) -> int:
    """First forward+backward in a fresh process; cache dirs come from the environment."""
    out: dict[str, Any] = {"impl": impl, "env": {k: os.environ.get(k) for k in CACHE_VARS}}
    out.update(T=settings["fc_T"], N=settings["fc_N"], models={})
    try:
        t0 = time.perf_counter()
        import torch

        out["import_torch_s"] = time.perf_counter() - t0
        device = torch.device("cpu" if settings["dry_run"] else "cuda")
        t0 = time.perf_counter()
        torch.zeros(1, device=device)
        # torch's own one-off costs (the autograd engine's device thread, the first
        # reduction and fill kernels), paid by any first backward whatever the model
        # (same for every implementation), so they are kept out of the per-model times
        (torch.rand(8, 8, device=device, requires_grad=True) * 2.0).sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        out["cuda_init_s"] = time.perf_counter() - t0
        timer = Timer(device)
        t0 = time.perf_counter()
        sj = __import__("symneuron") if impl == "symneuron" else _sj_modules(impl)
        out["import_s"] = time.perf_counter() - t0
        if impl != "symneuron":
            out["spikingjelly"] = sj["version"]
        elif device.type == "cuda":
            # one-time runtime start: CuPy import, NVRTC library load, module load of a trivial
            # kernel. A user's very first call pays this once on top of the first model's time.
            t0 = time.perf_counter()
            import cupy

            code = 'extern "C" __global__ void symneuron_bench_noop() {}'
            cupy.RawModule(code=code, options=("-std=c++17",)).get_function("symneuron_bench_noop")
            out["runtime_init_s"] = time.perf_counter() - t0
        gen = torch.Generator(device=device)
        gen.manual_seed(0)
        for model in models:
            rec: dict[str, Any] = {}
            out["models"][model] = rec
            try:
                shape = (settings["fc_T"], settings["fc_N"])
                x = 2.2 * torch.rand(shape, generator=gen, device=device) - 0.2
                args = (model, torch.float32, device)
                runner: Runner
                if impl == "symneuron":
                    runner = SymneuronRunner(*args, True, "cuda")
                else:
                    runner = SJRunner(impl, sj, *args)
                for key in ("first_s", "second_s", "third_s"):
                    runner.zero_grad()
                    rec[key] = _first_call(runner, x.detach().requires_grad_(), True, timer)[1]
                rec["note"] = runner.describe()
            except Exception as exc:  # noqa: BLE001
                rec["error"] = _short_error(exc)
    except Exception as exc:  # noqa: BLE001
        out["error"] = _short_error(exc)
    Path(result_file).write_text(json.dumps(out, indent=1, default=str))
    return 0


def derive_main(model: str, result_file: str) -> int:
    """Symbolic derivation time of one zoo model in a fresh process."""
    out: dict[str, Any] = {"model": model}

    def timed(key: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        value = fn()
        out[key] = time.perf_counter() - t0
        return value

    try:
        sn = timed("import_s", lambda: __import__("symneuron"))
        # SymPy's one-off costs (its lazy imports on first use, e.g. sympy.tensor from
        # Add.flatten, ~50 ms locally) land on whichever neuron a process derives first;
        # they are measured on a throwaway neuron and reported apart from the model's time
        warm = sn.Neuron(sn.V + (sn.X - sn.V) / 3, name="bench_warmup")
        timed("sympy_first_use_s", lambda: (warm.spec(), warm.source("cuda", "float32")))
        neuron = timed("ctor_s", lambda: make_neuron(model))
        timed("spec_s", neuron.spec)
        out["source_chars"] = len(timed("source_s", lambda: neuron.source("cuda", "float32")))
        out["total_s"] = out["ctor_s"] + out["spec_s"] + out["source_s"]
    except Exception as exc:  # noqa: BLE001
        out["error"] = _short_error(exc)
    Path(result_file).write_text(json.dumps(out, indent=1))
    return 0


# --------------------------------------------------------------------------------------
# parent: worker processes
# --------------------------------------------------------------------------------------


class WorkerDied(RuntimeError):
    pass


class WorkerProc:
    """A long-lived worker answering one JSON line per request."""

    def __init__(self, kind: str, args: argparse.Namespace, settings: dict[str, Any]) -> None:
        self.kind, self.args, self.settings = kind, args, settings
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.meta: dict[str, Any] | None = None
        self.starts = self.failures = 0
        self.dead_reason: str | None = None

    def start(self) -> None:
        self.starts += 1
        cmd = [sys.executable, "-u", str(Path(__file__).resolve()), "--worker", self.kind]
        cmd += ["--settings", json.dumps(self.settings)]
        log(f"[bench] starting worker {self.kind} (start #{self.starts})")
        self.lines = queue.Queue()
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=worker_env(self.kind, self.args),
            cwd=str(REPO),
        )
        threading.Thread(target=self._reader, args=(self.proc, self.lines), daemon=True).start()
        kind, payload = self._next(self.args.worker_start_timeout_s)
        if kind != "ready" or "error" in payload:
            self.stop()
            why = payload.get("error") if kind == "ready" else payload
            raise WorkerDied(f"worker {self.kind} did not start: {why}")
        self.meta = payload

    def _reader(self, proc: subprocess.Popen[str], lines: queue.Queue[tuple[str, Any]]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            for kind, mark in (("ready", MARK_READY), ("result", MARK_RESULT)):
                if line.startswith(mark):
                    lines.put((kind, json.loads(line[len(mark) :])))
                    break
            else:
                sys.stderr.write(f"[{self.kind}] {line}")
        lines.put(("eof", proc.wait()))

    def _next(self, timeout: float) -> tuple[str, Any]:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return ("timeout", f"no answer within {timeout:.0f} s")

    def request(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.dead_reason:
            raise WorkerDied(self.dead_reason)
        if self.proc is None or self.proc.poll() is not None:
            try:
                self.start()
            except WorkerDied as exc:
                self.failures += 1
                if self.failures >= 2:
                    self.dead_reason = f"{exc} (gave up after {self.failures} failed starts)"
                raise
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            self.stop()
            raise WorkerDied(f"worker {self.kind} pipe closed: {exc}") from None
        kind, payload = self._next(timeout)
        if kind == "result":
            self.failures = 0  # only consecutive failures retire a worker
            return payload
        self.stop(graceful=kind != "timeout")
        self.failures += 1
        if self.failures >= 4:
            self.dead_reason = f"worker {self.kind} failed {self.failures} times; last: {kind}"
        raise WorkerDied(f"worker {self.kind}: {kind} ({payload})")

    def stop(self, graceful: bool = True) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if graceful and proc.poll() is None:
            with contextlib.suppress(Exception):
                assert proc.stdin is not None
                proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                proc.stdin.flush()
                proc.wait(timeout=10)
        if proc.poll() is None:
            proc.kill()  # only this worker's own pid
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)


def worker_env(kind: str, args: argparse.Namespace) -> dict[str, str]:
    """A worker's environment: the repository and only its own SpikingJelly on PYTHONPATH."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    sj_paths = {"sj014": args.sj014_path, "sj200": args.sj200_path}
    others = {Path(p).resolve() for p in sj_paths.values()}
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = [p for p in paths if Path(p).resolve() not in others]
    paths[:0] = [str(REPO)] + ([sj_paths[kind]] if kind in sj_paths else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if args.dry_run:  # torch.compile's caches in a private TMPDIR (others may clean /tmp's)
        env["TMPDIR"] = str(Path(tempfile.gettempdir(), "snbench-dryrun-tmp"))
        Path(env["TMPDIR"]).mkdir(exist_ok=True)
    return env


def run_oneshot(argv: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    fd, path = tempfile.mkstemp(suffix=".json", prefix="snbench-")
    os.close(fd)
    try:
        cmd = [sys.executable, "-u", str(Path(__file__).resolve()), *argv, "--result-file", path]
        t0 = time.perf_counter()
        proc = subprocess.run(
            cmd, env=env, cwd=str(REPO), timeout=timeout, capture_output=True, text=True
        )
        wall = time.perf_counter() - t0
        for line in proc.stderr.strip().splitlines()[-8:]:
            log(f"  [{argv[1]}] {line}")
        text = Path(path).read_text()
        if not text:
            return {
                "error": f"rc={proc.returncode}; stderr: {proc.stderr[-800:]}",
                "process_s": wall,
            }
        return {**json.loads(text), "process_s": wall}
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    except Exception as exc:  # noqa: BLE001
        return {"error": _short_error(exc)}
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def merge_rounds(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from a peer's rounds of one configuration: the median of the rounds'
    medians (wall and GPU), the overall minima, the round values kept for inspection.
    A round that failed leaves the others standing; all failed: the first failure."""
    ok = [r for r in recs if r.get("status") == "ok"]
    if not ok or len(recs) == 1:
        return dict((ok or recs)[0])
    out = dict(ok[0], rounds=len(ok), check=dict(ok[0].get("check") or {}))
    for key in ("wall_s", "gpu_s"):
        out[key] = statistics.median(r[key] for r in ok)
        out[f"rounds_{key}"] = [r[key] for r in ok]
    for key, agg in (
        ("wall_min_s", min),
        ("gpu_min_s", min),
        ("reps_wall", sum),
        ("reps_gpu", sum),
    ):
        out[key] = agg(r[key] for r in ok)
    out["check"]["pass"] = all((r.get("check") or {}).get("pass", True) for r in ok)
    if len(ok) < len(recs):
        out["rounds_failed"] = [r.get("error") for r in recs if r.get("status") != "ok"]
    return out


def measure_derivation(args: argparse.Namespace, models: list[str]) -> dict[str, Any]:
    """One fresh process per model, a few side by side (CPU only, while the GPU is idle;
    each is single-threaded, and contention would inflate the figures)."""
    out: dict[str, Any] = {}
    env = worker_env("derive", args)

    def one(model: str) -> None:
        out[model] = run_oneshot(["--worker", "derive", "--impl", model], env, 300)

    width = max(1, min(len(models), (os.cpu_count() or 1) // 4))
    for i in range(0, len(models), width):
        threads = [threading.Thread(target=one, args=(m,)) for m in models[i : i + width]]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    for model, r in out.items():
        log(f"[bench] derivation {model}: spec {r.get('spec_s', math.nan):.3f} s, "
            f"source {r.get('source_s', math.nan):.3f} s {r.get('error', '')[:200]}")  # fmt: skip
    return out


def measure_first_calls(
    args: argparse.Namespace, settings: dict[str, Any], models: list[str], peers: list[str]
) -> dict[str, Any]:
    """symneuron's first calls per model, SpikingJelly's on LIF and the stateful models it
    has; each in a fresh process, with empty (cold) then reused (warm) disk caches."""
    out: dict[str, Any] = {}
    sj_models = ["LIF"] + [m for m in models if m in STATEFUL_MODELS and m in SJ_CLASSES]
    jobs = {"symneuron": models, "sj014": sj_models, "sj200": sj_models}
    base = Path(tempfile.mkdtemp(prefix="snbench-cache-"))
    try:
        for impl, impl_models in ((k, v) for k, v in jobs.items() if k in peers):
            sj_path = {"sj014": args.sj014_path, "sj200": args.sj200_path}.get(impl)
            if sj_path and not Path(sj_path, "spikingjelly").is_dir():
                out[impl] = {"error": f"SpikingJelly not found under {sj_path}"}
                continue
            env = worker_env(impl if impl != "symneuron" else "main", args)
            for var in CACHE_VARS:
                env[var] = str(base / impl / var)
                Path(env[var]).mkdir(parents=True, exist_ok=True)
            out[impl] = {}
            argv = ["--worker", "firstcall", "--impl", impl, "--models", ",".join(impl_models)]
            argv += ["--settings", json.dumps(settings)]
            for phase in ("cold", "warm"):
                res = out[impl][phase] = run_oneshot(argv, env, 400)
                models = res.get("models", {})
                firsts = {m: round(r.get("first_s", math.nan), 4) for m, r in models.items()}
                log(f"[bench] first call {impl} ({phase}): {firsts} {res.get('error', '')[:300]}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


# --------------------------------------------------------------------------------------
# parent: the peer comparison
# --------------------------------------------------------------------------------------

NOTES = [
    "N = 2^14: the whole working set fits in L2, so those figures are L2 bandwidth, "
    "not HBM; the floor fractions there can exceed 1.",
    "GPU time: CUDA events around each call, with a GPU sleep queued ahead of each "
    "batch so that host launch gaps are excluded where the host can run ahead.",
    "Wall time: synchronize, perf_counter, call (+ backward), synchronize; median.",
]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t_start = time.monotonic()
        self.matrix = resolve_matrix(args)
        self.configs = plan_configs(self.matrix)
        self.settings = worker_settings(args)
        self.workers: dict[str, WorkerProc] = {}
        self.path: Path | None = None
        dry_dir = Path(tempfile.gettempdir()) / "symneuron-bench-dryrun"
        self.out_dir = Path(args.out_dir or (dry_dir if args.dry_run else HERE / "results"))
        self.compile_spent = 0.0
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        meta = dict(date=now, argv=sys.argv[1:], host=platform.node(), dry_run=args.dry_run,
                    matrix=self.matrix, notes=NOTES)  # fmt: skip
        self.results: dict[str, Any] = dict(
            schema=SCHEMA, complete=False, meta=meta, settings=self.settings, copy=None,
            workers={}, records=[], first_call={}, derivation={}, events=[],
        )  # fmt: skip

    def elapsed(self) -> float:
        return time.monotonic() - self.t_start

    def event(self, text: str) -> None:
        log(f"[bench] {text}")
        self.results["events"].append({"t_s": round(self.elapsed(), 1), "text": text[:1500]})

    def worker(self, kind: str) -> WorkerProc:
        if kind not in self.workers:
            self.workers[kind] = WorkerProc(kind, self.args, self.settings)
        return self.workers[kind]

    def stop_workers(self) -> None:
        for w in self.workers.values():
            w.stop()

    def write(self) -> Path:
        import report

        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.path is None:
            gpu = self.results["meta"].get("gpu") or "unknown"
            name = re.sub(r"[^A-Za-z0-9]+", "-", ("dryrun-" if self.args.dry_run else "") + gpu)
            now = _dt.datetime.now(_dt.timezone.utc)
            stem = f"{name.strip('-')}-{now:%Y-%m-%d}"
            stem += f"-{self.args.tag}" if self.args.tag else ""
            self.path = self.out_dir / f"{stem}.json"
            if self.path.exists():
                self.path = self.out_dir / f"{stem}-{now:%H%M%S}.json"
        report.annotate(self.results)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.results, indent=1, default=str))
        tmp.replace(self.path)
        return self.path

    def start_main(self) -> None:
        main = self.worker("main")
        try:
            main.start()
            assert main.meta is not None
            self.results["meta"].update({k: v for k, v in main.meta.items() if k != "worker"})
            self.results["workers"]["main"] = main.meta
            nbytes = int(64 * 2**20 if self.args.dry_run else self.args.copy_gib * 2**30)
            copy = main.request({"op": "copy", "bytes": nbytes}, self.args.request_timeout_s)
            self.results["copy"] = copy.get("copy") or {"error": copy.get("error")}
            bw = self.results["copy"].get("bandwidth_Bps") or math.nan
            gpu, driver = main.meta.get("gpu"), main.meta.get("driver")
            self.event(f"device {gpu} driver {driver}; copy floor {bw / 1e9:.0f} GB/s")
        except WorkerDied as exc:
            self.event(f"main worker failed: {exc}")

    def start_sj(self, kind: str) -> None:
        w = self.worker(kind)
        if w.meta is not None or w.dead_reason:
            return
        path = self.args.sj014_path if kind == "sj014" else self.args.sj200_path
        try:
            if not Path(path, "spikingjelly").is_dir():
                raise FileNotFoundError(f"SpikingJelly not found under {path} (--{kind}-path)")
            w.start()
            self.results["workers"][kind] = w.meta
            self.event(f"worker {kind}: spikingjelly {(w.meta or {}).get('spikingjelly')}")
        except (WorkerDied, FileNotFoundError) as exc:
            w.failures += 1
            self.results["workers"][kind] = {"error": str(exc)[:1500]}
            self.event(f"worker {kind} failed to start: {exc}")
            if w.failures >= 2 or isinstance(exc, FileNotFoundError):
                w.dead_reason = str(exc)

    def why_skip(self, cfg: dict[str, Any], peer: str) -> tuple[str, str] | None:
        """(status, reason) of a peer that does not run ``cfg``; None when it does."""
        if peer in ("sj014", "sj200") and cfg["model"] not in SJ_CLASSES:
            return "unsupported", f"SpikingJelly has no {cfg['model']} neuron"
        if peer != "compile":
            return None
        if cfg["T"] > self.settings["compile_max_T"]:
            return "skipped", f"T > --compile-max-T ({self.settings['compile_max_T']})"
        if self.compile_spent >= self.args.compile_budget_s:
            return "skipped", f"compile budget ({self.args.compile_budget_s:.0f} s) spent"
        if self.args.time_budget_s - self.elapsed() < 60:
            return "skipped", "less than 60 s of the time budget left"
        return None

    def run_config(self, cfg: dict[str, Any]) -> None:
        by_worker: dict[str, list[str]] = {}
        for peer in self.matrix["peers"]:
            skip = self.why_skip(cfg, peer)
            if skip:
                self.results["records"].append(
                    {**cfg, "peer": peer, "status": skip[0], "error": skip[1]}
                )
            else:
                by_worker.setdefault(PEER_WORKER.get(peer, peer), []).append(peer)
        # --rounds R: the workers take turns R times, in alternating order, so that a slow
        # phase of the host (seconds long on a VM) does not land on one peer only
        order = [kind for kind in ("main", "sj014", "sj200") if kind in by_worker]
        per_peer: dict[str, list[dict[str, Any]]] = {}
        for round_ in range(max(1, self.args.rounds)):
            for kind in order if round_ % 2 == 0 else order[::-1]:
                if kind != "main":
                    self.start_sj(kind)
                try:
                    req = {"op": "bench", "cfg": cfg, "peers": by_worker[kind]}
                    reply = self.worker(kind).request(req, self.args.request_timeout_s)
                    error = reply.get("error")
                except WorkerDied as exc:
                    self.event(f"{config_key(cfg)}: {exc}")
                    reply, error = {}, f"worker: {exc}"
                fail = [
                    {**cfg, "peer": p, "status": "error", "error": error} for p in by_worker[kind]
                ]
                for rec in reply.get("records", fail):
                    per_peer.setdefault(rec["peer"], []).append(rec)
        for recs in per_peer.values():
            rec = merge_rounds(recs)
            if rec.get("peer") == "compile" and rec.get("first_call_s"):
                self.compile_spent += float(rec["first_call_s"])
            self.results["records"].append(rec)

    def run(self) -> int:
        args, n_cfg, peers = self.args, len(self.configs), self.matrix["peers"]
        self.event(
            f"{n_cfg} configurations x {len(peers)} peers; budget {args.time_budget_s:.0f} s"
        )
        if not args.skip_derivation:
            self.results["derivation"] = measure_derivation(args, self.matrix["models"])
        if not args.skip_first_call:
            fc = measure_first_calls(args, self.settings, self.matrix["models"], peers)
            self.results["first_call"] = fc
        self.start_main()
        self.write()
        last_write = time.monotonic()
        for i, cfg in enumerate(self.configs):
            if self.elapsed() > args.time_budget_s:
                skipped = dict(status="skipped", error="time budget spent")
                self.results["records"] += [
                    {**c, "peer": p, **skipped} for c in self.configs[i:] for p in peers
                ]
                self.event(f"time budget spent after {i} of {n_cfg} configurations")
                break
            t0 = time.monotonic()
            self.run_config(cfg)
            log(f"[bench] {i + 1}/{n_cfg} {config_key(cfg)} {time.monotonic() - t0:.1f} s "
                f"(elapsed {self.elapsed():.0f} s) {self._line(cfg)}")  # fmt: skip
            if time.monotonic() - last_write > 20:
                self.write()
                last_write = time.monotonic()
        else:
            self.results["complete"] = True
        self.stop_workers()
        self.results["meta"]["elapsed_s"] = round(self.elapsed(), 1)
        path = self.write()
        log(f"[bench] wrote {path}")
        import report

        if not args.no_plot:
            try:
                log(f"[bench] wrote {report.plot(self.results, path.with_suffix('.png'))}")
            except Exception as exc:  # noqa: BLE001
                self.event(f"plot failed: {_short_error(exc)}")
                self.write()
        print(report.short_table(self.results), flush=True)
        return 0

    def _line(self, cfg: dict[str, Any]) -> str:
        parts = []
        for rec in self.results["records"]:
            if any(rec.get(k) != v for k, v in cfg.items()):
                continue
            if rec.get("status") == "ok":
                chk = "" if rec.get("check", {}).get("pass") else "!"
                wall, gpu = rec["wall_s"] * 1e6, rec["gpu_s"] * 1e6
                parts.append(f"{rec['peer']}={wall:.0f}/{gpu:.0f}us{chk}")
            else:
                parts.append(f"{rec['peer']}={rec.get('status')}")
        return " ".join(parts)


def compare_main(args: argparse.Namespace) -> int:
    bench = Bench(args)
    if args.list:
        print("\n".join(config_key(cfg) for cfg in bench.configs))
        print(f"{len(bench.configs)} configurations; peers {bench.matrix['peers']}")
        return 0

    def on_signal(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        bench.event(f"signal {signum}: writing partial results")
        bench.stop_workers()
        bench.results["meta"]["elapsed_s"] = round(bench.elapsed(), 1)
        with contextlib.suppress(Exception):
            log(f"[bench] wrote {bench.write()}")
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return bench.run()
    finally:
        bench.stop_workers()


# --------------------------------------------------------------------------------------
# in-process modes: kernel-only sweeps and host-overhead parts
# --------------------------------------------------------------------------------------


class Local:
    """The device, backend and timer of an in-process mode (``--sweep``, ``--overhead``)."""

    def __init__(self, dry_run: bool) -> None:
        import torch

        self.torch = torch
        self.device = torch.device("cpu" if dry_run else "cuda")
        self.backend = "cpu" if dry_run else "cuda"
        self.timer = Timer(self.device)
        print(f"# {'CPU dry run' if dry_run else torch.cuda.get_device_name()}", flush=True)

    def program(self, neuron: Any) -> Any:
        """The compiled kernels of ``neuron`` (``symneuron.runtime.kernels.program``)."""
        from symneuron.runtime import kernels

        return kernels.program(neuron, self.backend)

    def params(self, neuron: Any, n: int, dtype: Any) -> list[Any]:
        """One [N] tensor per param, in the compute dtype (float32 for 16-bit storage)."""
        torch = self.torch
        compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        values = [float(v) for v in neuron.params.values()]
        return [torch.full((), v, dtype=compute, device=self.device).expand(n) for v in values]


def kernel_times(local: Local, neuron: Any, dtype: Any, t_len: int, n: int) -> str:
    """The forward (training variant) and backward kernels' times and rates, in floor
    bytes per second (dL/dS is a stride-0 broadcast the backward does not read)."""
    program = local.program(neuron)
    x = local.torch.rand(t_len, n, device=local.device, dtype=dtype) * 1.5
    params = local.params(neuron, n, dtype)
    grad = local.torch.ones((), device=local.device, dtype=dtype).expand(t_len, n)
    x_saved = x if program.needs_x else None

    def forward() -> Any:
        return program.forward(x, None, None, params, True, "last")

    _, _, h, _, wt = forward()

    def backward() -> Any:
        return program.backward(grad, None, None, "none", h, wt, x_saved, None, None, params)

    from symneuron import derivation

    k = derivation.derive(neuron).saved_states  # as floor.extra_states
    size = x.element_size() * t_len * n
    passes = [("fwd", forward, floor.tensors("forward", k))]
    passes += [("bwd", backward, floor.tensors("backward", k, grad_spike_read=False))]
    out = []
    for label, call, tensors in passes:
        sec = local.timer.back_to_back(call, 20)
        out.append(f"{label} {sec * 1e6:7.1f}us {tensors * size / sec / 1e9:6.0f}GB/s")
    return "  ".join(out)


@contextlib.contextmanager
def runtime_settings(**values: Any) -> Iterator[None]:
    """Set attributes of ``symneuron.runtime.settings`` for a block, restored afterwards."""
    from symneuron.runtime import settings

    old = {name: getattr(settings, name) for name in values}
    try:
        for name, value in values.items():
            setattr(settings, name, value)
        yield
    finally:
        for name, value in old.items():
            setattr(settings, name, value)


def sigmoid_exp(alpha: float = SURROGATE_ALPHA) -> Any:
    """The Sigmoid surrogate's function written piecewise with exp (never overflowing)."""
    import sympy as sp

    import symneuron as sn

    u, a = sn.surrogate.u, sp.Float(alpha)
    primitive = sp.Piecewise(
        (1 / (1 + sp.exp(-a * u)), u >= 0), (sp.exp(a * u) / (1 + sp.exp(a * u)), True)
    )
    return sn.surrogate.Surrogate(primitive, u, name=f"SigmoidExp(alpha={alpha})")


def _surrogates() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    import symneuron as sn

    forms = [("Sigmoid(tanh)", sn.surrogate.Sigmoid()), ("Sigmoid(exp)", sigmoid_exp())]
    for label, surrogate in [*forms, ("ATan", sn.surrogate.ATan())]:
        yield label, {}, {"surrogate": surrogate}


#: sweep -> rows of (label, ``symneuron.runtime.settings`` values, neuron constructor args)
SWEEPS: dict[str, Callable[[], Iterator[tuple[str, dict[str, Any], dict[str, Any]]]]] = {
    "block": lambda: ((f"block={b}", {"cuda_block": b}, {}) for b in (128, 256, 512, 1024)),
    "lanes": lambda: ((f"max_lanes={k}", {"max_lanes": k}, {}) for k in (None, 4, 2, 1)),
    "surrogate": _surrogates,
}


def sweep_main(args: argparse.Namespace) -> int:
    """Kernel-only sweeps: each row times one kernel back to back between CUDA events."""
    local = Local(args.dry_run)
    t_len = (args.T or [8 if args.dry_run else 64])[0]
    n = (args.N or [2**10 if args.dry_run else 2**20])[0]
    models = args.models or ["LIF", "QIF", "PLIF", "EIF"]
    dtypes = args.dtypes or (["fp32"] if args.dry_run else ["fp32", "bf16"])
    print(f"# kernel-only, T={t_len} N={n}; GB/s = floor bytes / time", flush=True)
    for name in args.sweep:
        for label, settings, ctor_kw in SWEEPS[name]():
            for dtype in dtypes:
                for model in models:
                    try:
                        with runtime_settings(**settings):
                            neuron = make_neuron(model, **ctor_kw)
                            res = kernel_times(local, neuron, _torch_dtype(dtype), t_len, n)
                    except (ImportError, AttributeError) as exc:  # an older symneuron
                        print(f"needs symneuron.runtime.settings and kernels.program: {exc}")
                        return 2
                    except Exception as exc:  # noqa: BLE001  e.g. too many registers per block
                        res = f"failed: {type(exc).__name__}: {exc}"[:200]
                    print(f"{label:14} {dtype:5} {model:10} {res}", flush=True)
    return 0


def overhead_main(args: argparse.Namespace) -> int:
    """Where a small training call's host time goes: symneuron's calls, torch's own floor,
    the two kernel launches alone and in a bare ``autograd.Function`` (300 pipelined calls
    each), then a torch profile (the autograd nodes, the Python backward's time included)
    and a cProfile (the calling thread's Python) of the training call."""
    import cProfile
    import pstats

    import symneuron as sn

    local = Local(args.dry_run)
    torch = local.torch
    neuron = make_neuron((args.models or ["LIF"])[0])
    t_len, n = (args.T or [4])[0], (args.N or [2**14])[0]
    x = torch.rand(t_len, n, device=local.device).requires_grad_()
    x0 = x.detach()

    def simulate(inp: Any) -> Any:
        return sn.simulate(neuron, inp, backend=local.backend, store_v_seq=False)[0]

    def train(out: Any) -> None:
        x.grad = None
        out.sum().backward()

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, a: Any) -> Any:
            return a * 2.0

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return g * 2.0

    parts: dict[str, Callable[[], Any]] = {
        "symneuron training": lambda: train(simulate(x)),
        "symneuron forward, grad": lambda: simulate(x),
        "symneuron inference": torch.no_grad()(lambda: simulate(x0)),
        "torch (x*2).sum().backward()": lambda: train(x * 2.0),
        "torch x*2": lambda: x * 2.0,
        "torch.empty": lambda: torch.empty(t_len, n, device=local.device),
        "trivial autograd.Function": lambda: train(Double.apply(x)),
    }
    try:
        parts.update(_launch_parts(local, neuron, x, train))
    except (ImportError, AttributeError) as exc:  # an older symneuron
        print(f"# launch parts left out: symneuron.runtime.kernels.program: {exc}", flush=True)
    for name, call in parts.items():
        try:
            us = local.timer.back_to_back(call, 300, host=True) * 1e6
            print(f"{name:36} {us:8.1f} us/call", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"{name:36} failed: {type(exc).__name__}: {exc}"[:200], flush=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    activities += [torch.profiler.ProfilerActivity.CUDA] if local.timer.cuda else []
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(20):
            parts["symneuron training"]()
        local.timer.sync()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25), flush=True)
    profile = cProfile.Profile()
    profile.runcall(
        lambda: ([parts["symneuron training"]() for _ in range(200)], local.timer.sync())
    )
    pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(20)
    return 0


def _launch_parts(
    local: Local, neuron: Any, x: Any, train: Callable[[Any], None]
) -> dict[str, Callable[[], Any]]:
    """symneuron's two kernel launches called directly, and in the barest
    ``autograd.Function`` (no simulate, no argument checks): the binding's own cost on top."""
    program = local.program(neuron)
    t_len, n = x.shape
    x0 = x.detach()
    params = local.params(neuron, n, x.dtype)
    _, _, h, _, wt = program.forward(x0, None, None, params, True, "last")
    grad = local.torch.ones((), device=local.device).expand(t_len, n)

    def backward(g: Any, h_seq: Any, wt_seq: Any, x_seq: Any) -> Any:
        x_saved = x_seq if program.needs_x else None
        return program.backward(g, None, None, "none", h_seq, wt_seq, x_saved, None, None, params)

    class Launches(local.torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, a: Any) -> Any:
            spike, v_out, h_seq, _, ctx.wt = program.forward(a, None, None, params, True, "last")
            ctx.save_for_backward(h_seq, a)
            return spike, v_out

        @staticmethod
        def backward(ctx: Any, g: Any, _gv: Any) -> Any:
            h_seq, a = ctx.saved_tensors
            return backward(g, h_seq, ctx.wt, a)[0]

    return {
        "kernels: forward launch": lambda: program.forward(x0, None, None, params, True, "last"),
        "kernels: backward launch": lambda: backward(grad, h, wt, x0),
        "kernels in a bare autograd.Function": lambda: train(Launches.apply(x)[0]),
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = json.loads(args.settings) if args.settings else {}
    if args.worker in ("main", "sj014", "sj200"):
        return worker_main(args.worker, settings)
    if args.worker == "firstcall":
        return firstcall_main(args.impl, settings, args.models or ["LIF"], args.result_file)
    if args.worker == "derive":
        return derive_main(args.impl, args.result_file)
    if args.sweep:
        return sweep_main(args)
    if args.overhead:
        return overhead_main(args)
    return compare_main(args)


if __name__ == "__main__":
    sys.exit(main())
