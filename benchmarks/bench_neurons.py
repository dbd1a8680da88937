#!/usr/bin/env python3
"""symneuron against its peers, side by side, on one GPU in one invocation.

Peers (``--peers``):

* ``symneuron``  ``sn.simulate(neuron, x, backend="cuda", store_v_seq=False)``
* ``sj014``      SpikingJelly 0.0.0.0.14, its CuPy backend (``backend="cupy"``)
* ``sj200``      SpikingJelly 2.0.0, its default CUDA implementation (Triton)
* ``torch``      a plain PyTorch loop over t (eager)
* ``compile``    the same loop under ``torch.compile`` (whole loop, N dynamic)

Models: the single-state zoo (IF, LIF, PLIF, QIF, EIF; the default matrix) and, with
``--models``, the stateful ``Izhikevich`` (a = 0.3, b = 0.2 on every side; SpikingJelly's
``IzhikevichNode``, CuPy in 0.0.0.0.14, fp32 only) and ``ALIF`` (no SpikingJelly
counterpart: those peers are recorded as unsupported).

plus a 1 GiB device-to-device copy, whose bytes read + written over time is the
bandwidth floor of DESIGN.md §5. Each configuration (model, T, N, dtype, mode)
is checked against symneuron's float64 torch reference before it is timed.

Process layout. The parent only orchestrates (it never touches the GPU). Timing
runs in long-lived worker processes, one at a time: ``main`` (symneuron, torch,
compile, the copy), ``sj014`` and ``sj200`` (each with its SpikingJelly on
PYTHONPATH, since the two versions conflict). They answer one JSON line per
request; a worker that dies or hangs is killed and restarted, and its configs
are recorded as errors, so no peer can end the run. Fresh short-lived processes
measure the symbolic derivation time and the first-call latencies (fresh and
warm on-disk compile caches).

Examples::

    python3 benchmarks/bench_neurons.py --quick --sj014-path /tmp/sj014 --sj200-path /tmp/sj200
    python3 benchmarks/bench_neurons.py --models LIF --T 16 --dtypes fp32 --peers symneuron,torch
    python3 benchmarks/bench_neurons.py --models Izhikevich,ALIF --T 16,64 --N 2^20 \
        --dtypes fp32,bf16 --peers symneuron,sj014,sj200
    python3 benchmarks/bench_neurons.py --dry-run          # CPU smoke test of the whole pipeline

Results go to ``<out-dir>/<gpu>-<date>.json`` with a PNG next to it;
``benchmarks/report.py`` turns them into ``docs/performance.md``.
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
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if str(HERE) not in sys.path:
    sys.path.insert(1, str(HERE))

SCHEMA = "symneuron-bench/1"
MARK_READY = "@@READY "
MARK_RESULT = "@@RESULT "

#: single-state zoo models: the default matrix
SINGLE_MODELS = ["IF", "LIF", "PLIF", "QIF", "EIF"]
#: models with extra state variables (``sn.models.STATEFUL``); only with ``--models``
STATEFUL_MODELS = ["Izhikevich", "ALIF"]
ALL_MODELS = SINGLE_MODELS + STATEFUL_MODELS
#: constructor arguments of the benchmarked neuron (the same constants on every side)
MODEL_KWARGS: dict[str, dict[str, float]] = {"Izhikevich": {"a": 0.3, "b": 0.2}}
ALL_T = [4, 16, 64, 256]
ALL_N = [2**20, 2**14]
ALL_DTYPES = ["fp32", "fp16", "bf16"]
ALL_MODES = ["inference", "training"]
ALL_PEERS = ["symneuron", "sj014", "sj200", "torch", "compile"]
PEER_WORKER = {
    "symneuron": "main",
    "torch": "main",
    "compile": "main",
    "sj014": "sj014",
    "sj200": "sj200",
}
QUICK = dict(
    models=["LIF", "PLIF", "QIF"], T=[4, 16, 64], N=[2**20, 2**14], dtypes=["fp32", "bf16"]
)
DRY = dict(models=["LIF", "PLIF"], T=[4, 8], N=[2**8, 2**10], dtypes=["fp32", "bf16"])

SJ_CLASSES = {
    "IF": "IFNode",
    "LIF": "LIFNode",
    "PLIF": "ParametricLIFNode",
    "QIF": "QIFNode",
    "EIF": "EIFNode",
    "Izhikevich": "IzhikevichNode",
}
#: SpikingJelly 2.0.0's name of each model in ``functional.neuron_implementation``
SJ_IMPL_NAMES = {
    "IF": "if",
    "LIF": "lif",
    "PLIF": "plif",
    "QIF": "qif",
    "EIF": "eif",
    "Izhikevich": "izhikevich",
}
SURROGATE_ALPHA = 4.0  # sn.surrogate.Sigmoid() and SpikingJelly's Sigmoid() default


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------


def peer_unsupported(peer: str, model: str) -> str | None:
    """Why ``peer`` cannot run ``model`` at all (None when it can)."""
    if peer in ("sj014", "sj200") and model not in SJ_CLASSES:
        return f"SpikingJelly has no {model} neuron"
    return None


def _parse_n(text: str) -> int:
    text = text.strip()
    if "^" in text:
        base, exp = text.split("^")
        return int(base) ** int(exp)
    if "**" in text:
        base, exp = text.split("**")
        return int(base) ** int(exp)
    value = int(text)
    return 2**value if value <= 40 else value  # "20" means 2^20


def _csv(kind: type, allowed: list[Any] | None = None) -> Any:
    def parse(text: str) -> list[Any]:
        items = [s for s in (p.strip() for p in text.split(",")) if s]
        out = [_parse_n(s) if kind is _parse_n else kind(s) for s in items]  # type: ignore[comparison-overlap]
        if allowed is not None:
            bad = [o for o in out if o not in allowed]
            if bad:
                raise argparse.ArgumentTypeError(f"{bad} not in {allowed}")
        return out

    return parse


def _dtype_alias(text: str) -> str:
    aliases = {
        "float32": "fp32",
        "float": "fp32",
        "float16": "fp16",
        "half": "fp16",
        "bfloat16": "bf16",
    }
    return aliases.get(text, text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    g = p.add_argument_group("matrix")
    g.add_argument(
        "--models",
        type=_csv(str, ALL_MODELS),
        default=None,
        help=",".join(ALL_MODELS) + f" (default {','.join(SINGLE_MODELS)})",
    )
    g.add_argument("--T", type=_csv(int), default=None, help="e.g. 4,16,64,256")
    g.add_argument("--N", type=_csv(_parse_n), default=None, help="e.g. 2^20,2^14 (or 20,14)")
    g.add_argument(
        "--dtypes",
        type=lambda s: _csv(str, ALL_DTYPES)(
            ",".join(_dtype_alias(x.strip()) for x in s.split(","))
        ),
        default=None,
        help="fp32,fp16,bf16 (float32, float16, bfloat16 accepted)",
    )
    g.add_argument("--modes", type=_csv(str, ALL_MODES), default=None, help=",".join(ALL_MODES))
    g.add_argument("--peers", type=_csv(str, ALL_PEERS), default=None, help=",".join(ALL_PEERS))
    g.add_argument(
        "--quick",
        action="store_true",
        help="LIF,PLIF,QIF x T 4,16,64 x N 2^20,2^14 x fp32,bf16 (explicit filters win)",
    )
    g.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU smoke test: tiny sizes, C/torch backends, perf_counter timing",
    )
    g.add_argument("--list", action="store_true", help="print the planned configurations and exit")
    g = p.add_argument_group("paths")
    g.add_argument(
        "--out-dir", default=None, help="default benchmarks/results (dry run: a temp dir)"
    )
    g.add_argument("--sj014-path", default=os.environ.get("SJ014_PATH", "/tmp/sj014"))
    g.add_argument("--sj200-path", default=os.environ.get("SJ200_PATH", "/tmp/sj200"))
    g.add_argument("--tag", default="", help="appended to the result file name")
    g = p.add_argument_group("timing")
    g.add_argument(
        "--target-ms", type=float, default=50.0, help="time per measurement (wall, GPU each)"
    )
    g.add_argument("--min-reps", type=int, default=5)
    g.add_argument("--max-reps", type=int, default=200)
    g.add_argument(
        "--warmup", type=int, default=2, help="warm-up calls after the first (checked) call"
    )
    g.add_argument(
        "--rotate-mb",
        type=float,
        default=256.0,
        help="rotate among input copies totalling about this many MiB (L2 defeat)",
    )
    g.add_argument("--max-bufs", type=int, default=8)
    g.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure each configuration this many times, peers taking turns in alternating "
        "order; the median of the rounds is reported (robust ratios on a noisy host)",
    )
    g.add_argument("--copy-gib", type=float, default=1.0)
    g = p.add_argument_group("budget")
    g.add_argument(
        "--time-budget-s",
        type=float,
        default=450.0,
        help="stop starting new configurations after this many seconds (results are kept)",
    )
    g.add_argument(
        "--compile-budget-s",
        type=float,
        default=180.0,
        help="total torch.compile first-call time; after it the compile peer is skipped",
    )
    g.add_argument("--compile-max-T", type=int, default=64, help="skip torch.compile above this T")
    g.add_argument("--compile-mode", default="default")
    g.add_argument(
        "--no-compile-dynamic-n",
        dest="compile_dynamic_n",
        action="store_false",
        help="compile each N separately (default: N marked dynamic, one graph per T)",
    )
    g.add_argument("--request-timeout-s", type=float, default=300.0)
    g.add_argument("--worker-start-timeout-s", type=float, default=240.0)
    g = p.add_argument_group("checks")
    g.add_argument(
        "--fp32-max-mismatch",
        type=float,
        default=1e-5,
        help="fp32 passes if at most this fraction of spikes differ from the float64 "
        "reference (threshold ties flip a few per 10^7; the count is recorded)",
    )
    g.add_argument("--half-min-match", type=float, default=0.99)
    g.add_argument(
        "--grad-slice",
        type=int,
        default=4096,
        help="neurons whose dL/dX is compared with the reference (training)",
    )
    g = p.add_argument_group("latency")
    g.add_argument("--skip-first-call", action="store_true")
    g.add_argument("--skip-derivation", action="store_true")
    g.add_argument("--fc-T", type=int, default=16)
    g.add_argument("--fc-N", type=_parse_n, default=2**16)
    g.add_argument("--no-plot", action="store_true")
    g = p.add_argument_group("internal")
    g.add_argument(
        "--worker",
        choices=["main", "sj014", "sj200", "firstcall", "derive"],
        default=None,
        help=argparse.SUPPRESS,
    )
    g.add_argument("--settings", default=None, help=argparse.SUPPRESS)
    g.add_argument("--impl", default=None, help=argparse.SUPPRESS)
    g.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    return p


def resolve_matrix(args: argparse.Namespace) -> dict[str, list[Any]]:
    base: dict[str, list[Any]] = dict(models=SINGLE_MODELS, T=ALL_T, N=ALL_N, dtypes=ALL_DTYPES)
    if args.quick:
        base.update(QUICK)
    if args.dry_run:
        base.update(DRY)
    out = {
        "models": args.models or base["models"],
        "T": args.T or base["T"],
        "N": args.N or base["N"],
        "dtypes": args.dtypes or base["dtypes"],
        "modes": args.modes or ALL_MODES,
        "peers": args.peers or ALL_PEERS,
    }
    return out


def plan_configs(matrix: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Most important first (fp32, then bf16, fp16; large N first); mode innermost so that
    a worker reuses inputs and reference across the two modes of one (model, T, N, dtype)."""
    drank = {d: i for i, d in enumerate(["fp32", "bf16", "fp16"])}
    configs = []
    for dtype in sorted(matrix["dtypes"], key=lambda d: drank[d]):
        for n in sorted(matrix["N"], reverse=True):
            for model in [m for m in ALL_MODELS if m in matrix["models"]]:
                for t in sorted(matrix["T"]):
                    for mode in [m for m in ALL_MODES if m in matrix["modes"]]:
                        configs.append(dict(model=model, T=t, N=n, dtype=dtype, mode=mode))
    return configs


def config_key(cfg: dict[str, Any]) -> str:
    return f"{cfg['model']}/T{cfg['T']}/N{cfg['N']}/{cfg['dtype']}/{cfg['mode']}"


# --------------------------------------------------------------------------------------
# worker side: shared helpers (import torch lazily so that the parent stays light)
# --------------------------------------------------------------------------------------


def _torch_dtype(name: str) -> Any:
    import torch

    return {
        "fp32": torch.float32,
        "fp16": torch.float16,
        "bf16": torch.bfloat16,
        "fp64": torch.float64,
    }[name]


class Timer:
    """Wall and device timing; CUDA events on a GPU, perf_counter on the CPU (dry run)."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.cuda = device.type == "cuda"
        self.cycles_per_s: float | None = None
        self.gap_risk = 0
        if self.cuda:
            self._calibrate_sleep()

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def _calibrate_sleep(self) -> None:
        torch = self.torch
        try:
            torch.cuda._sleep(1000)
            torch.cuda.synchronize()
            cycles = 20_000_000
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.cuda._sleep(cycles)
            b.record()
            torch.cuda.synchronize()
            self.cycles_per_s = cycles / (a.elapsed_time(b) / 1e3)
        except Exception as exc:  # noqa: BLE001
            log(f"[timer] torch.cuda._sleep unavailable ({exc}); GPU times may include host gaps")
            self.cycles_per_s = None

    def wall(self, call: Any, xs: list[Any], reps: int) -> list[float]:
        out = []
        for i in range(reps):
            x = xs[i % len(xs)]
            self.sync()
            t0 = time.perf_counter()
            call(x)
            self.sync()
            out.append(time.perf_counter() - t0)
        return out

    def device(self, call: Any, xs: list[Any], reps: int, host_s: float) -> list[float]:
        """Per-call device time. A GPU sleep is queued ahead of each batch so that the host
        enqueues the whole batch before the GPU reaches it: events then bracket device work
        only, not host launch gaps (unless a call blocks the host or overflows the queue)."""
        if not self.cuda:
            out = []
            for i in range(reps):
                t0 = time.perf_counter()
                call(xs[i % len(xs)])
                out.append(time.perf_counter() - t0)
            return out
        torch = self.torch
        out: list[float] = []
        done = 0
        batch = 20
        per_call_host = host_s  # first guess: the wall time (an upper bound of the host time)
        self.gap_risk = 0
        while done < reps:
            k = min(batch, reps - done)
            events = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(k)
            ]
            torch.cuda.synchronize()
            sleep_s = 0.0
            if self.cycles_per_s:
                sleep_s = min(0.25, max(2e-4, 1.5 * k * per_call_host + 1e-4))
                torch.cuda._sleep(int(self.cycles_per_s * sleep_s))
            t0 = time.perf_counter()
            for j in range(k):
                x = xs[(done + j) % len(xs)]
                events[j][0].record()
                call(x)
                events[j][1].record()
            enqueue = time.perf_counter() - t0
            if enqueue > sleep_s:
                self.gap_risk += 1  # the GPU may have caught up with the host in this batch
            per_call_host = enqueue / k
            torch.cuda.synchronize()
            out.extend(a.elapsed_time(b) / 1e3 for a, b in events)
            done += k
        return out

    def allocated(self) -> int | None:
        if not self.cuda:
            return None
        return int(self.torch.cuda.memory_allocated())


def _reps(estimate_s: float, s: dict[str, Any]) -> int:
    if estimate_s <= 0:
        return s["max_reps"]
    return int(max(s["min_reps"], min(s["max_reps"], math.ceil(s["target_ms"] / 1e3 / estimate_s))))


def _short_error(exc: BaseException) -> str:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    last = "".join(tb[-3:]).strip()
    return f"{type(exc).__name__}: {exc}"[:600] + ("\n" + last[-900:] if last else "")


def _is_sticky_cuda(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    needles = (
        "illegal memory access",
        "CUDA error: an illegal",
        "unspecified launch failure",
        "misaligned address",
        "CUDA_ERROR_ILLEGAL",
        "cudaErrorIllegalAddress",
        "device-side assert",
        "CUDA_ERROR_LAUNCH_FAILED",
    )
    return any(n in text for n in needles)


def _status_of(exc: BaseException) -> str:
    if isinstance(exc, NotImplementedError):
        return "unsupported"
    text = str(exc).lower()
    if ("dtype" in text or "bfloat16" in text or "half" in text or "float16" in text) and (
        "support" in text or "not implemented" in text or "expected" in text
    ):
        return "unsupported"
    return "error"


def construct_neuron(model: str) -> Any:
    """The zoo model with the benchmark's constants (``MODEL_KWARGS``)."""
    import symneuron as sn

    ctor = sn.models.ZOO.get(model) or sn.models.STATEFUL[model]
    return ctor(**MODEL_KWARGS.get(model, {}))


def spikes_of(result: Any) -> Any:
    """The spike sequence of ``simulate``/``simulate_reference``: ``(spikes, v_seq)`` for a
    single-state neuron, ``(spikes, v_seq, states)`` for one with extra states."""
    return result[0]


def make_neuron(model: str) -> Any:
    neuron = construct_neuron(model)
    if getattr(neuron.surrogate, "name", "") != f"Sigmoid(alpha={SURROGATE_ALPHA})":
        raise RuntimeError(
            f"{model}: default surrogate is {neuron.surrogate.name}, the peers use "
            f"Sigmoid(alpha={SURROGATE_ALPHA}); update the benchmark"
        )
    return neuron


def sj_kwargs(model: str, neuron: Any) -> dict[str, Any]:
    """SpikingJelly constructor arguments with the same constants as the symneuron zoo model."""
    p = neuron.params
    kw: dict[str, Any] = dict(
        v_threshold=float(neuron.v_threshold),
        v_reset=neuron.v_reset,
        detach_reset=bool(neuron.detach_reset),
    )
    if model == "LIF":
        kw.update(tau=float(p["tau"]), decay_input=True)
    elif model == "PLIF":
        kw.update(init_tau=float(1.0 + math.exp(-p["w"])), decay_input=True)
    elif model == "QIF":
        kw.update(
            tau=float(p["tau"]), v_c=float(p["v_c"]), a0=float(p["a0"]), v_rest=float(p["v_rest"])
        )
    elif model == "EIF":
        kw.update(
            tau=float(p["tau"]),
            delta_T=float(p["delta_T"]),
            theta_rh=float(p["theta_rh"]),
            v_rest=float(p["v_rest"]),
        )
    elif model == "Izhikevich":
        kw.update(
            {name: float(p[name]) for name in ("tau", "v_c", "a0", "v_rest", "tau_w", "a", "b")},
            w_rest=float(neuron.states["W"].init),
        )
    elif model != "IF":
        raise NotImplementedError(f"SpikingJelly has no {model} neuron")
    return kw


class Inputs:
    """Inputs, rotation buffers and the float64 reference of one (model, T, N, dtype)."""

    def __init__(self, cfg: dict[str, Any], device: Any, settings: dict[str, Any]) -> None:
        import torch

        from symneuron.reference import simulate_reference

        self.cfg = cfg
        self.device = device
        self.dtype = _torch_dtype(cfg["dtype"])
        self.neuron = make_neuron(cfg["model"])
        t_len, n = cfg["T"], cfg["N"]
        seed = zlib.crc32(f"{cfg['model']}/{t_len}/{n}/{cfg['dtype']}".encode())
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        x_bytes = t_len * n * itemsize
        nbuf = int(
            max(1, min(settings["max_bufs"], math.ceil(settings["rotate_mb"] * 2**20 / x_bytes)))
        )
        self.raw = []
        for _ in range(nbuf):
            x = torch.rand((t_len, n), generator=gen, device=device, dtype=torch.float32)
            self.raw.append((2.2 * x - 0.2).to(self.dtype))
        self.nbuf = nbuf
        self.half = self.dtype in (torch.float16, torch.bfloat16)
        self._simulate_reference = simulate_reference
        with torch.no_grad():
            spikes = self._reference(self.raw[0])
        self.ref = spikes > 0.5
        self.spike_rate = float(self.ref.float().mean())
        del spikes
        self._ref_grad = None
        self.grad_slice = min(n, settings["grad_slice"])

    def _reference(self, x: Any) -> Any:
        import torch

        v0 = torch.full(
            x.shape[1:],
            0.0 if self.neuron.v_reset is None else self.neuron.v_reset,
            dtype=torch.float64,
            device=x.device,
        )
        out = self._simulate_reference(
            self.neuron,
            x.double(),
            v0,
            dict(self.neuron.params),
            store_v_seq=False,
            round_h_to=self.dtype if self.half else None,
        )
        return spikes_of(out)

    def ref_grad(self) -> Any:
        """dL/dX of L = sum(spikes) on the first ``grad_slice`` neurons (each is independent)."""
        import torch

        if self._ref_grad is None:
            with torch.enable_grad():
                xs = self.raw[0][:, : self.grad_slice].double().requires_grad_(True)
                s = self._reference(xs)
                s.sum().backward()
            self._ref_grad = xs.grad.detach()
        return self._ref_grad

    def xs(self, training: bool) -> list[Any]:
        if training:
            return [x.detach().requires_grad_(True) for x in self.raw]
        return [x.detach() for x in self.raw]


def check_spikes(spikes: Any, inputs: Inputs, settings: dict[str, Any]) -> dict[str, Any]:
    got = spikes.detach() != 0
    if tuple(got.shape) != tuple(inputs.ref.shape):
        return {"pass": False, "reason": f"shape {tuple(got.shape)} != {tuple(inputs.ref.shape)}"}
    mismatch = int((got != inputs.ref).sum())
    frac = mismatch / inputs.ref.numel()
    if inputs.half:
        ok = (1.0 - frac) >= settings["half_min_match"]
        rule = f">= {settings['half_min_match']:.0%} of spikes equal (float64 reference, H rounded)"
    else:
        ok = frac <= settings["fp32_max_mismatch"]
        rule = f"<= {settings['fp32_max_mismatch']:g} of spikes differ (float64 reference)"
    return {
        "pass": bool(ok),
        "mismatch": mismatch,
        "mismatch_frac": frac,
        "identical": mismatch == 0,
        "spike_rate": inputs.spike_rate,
        "rule": rule,
    }


def _relnorm(a: Any, b: Any) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# --------------------------------------------------------------------------------------
# peers
# --------------------------------------------------------------------------------------


class Runner:
    """One peer for one (model, dtype, mode): ``forward(x) -> spikes``."""

    label = "?"
    note = ""

    def forward(self, x: Any) -> Any:
        raise NotImplementedError

    def zero_grad(self) -> None:
        pass

    def baseline_forward(self, x: Any) -> Any:
        """Forward used under no_grad as the baseline of the retained-memory measurement."""
        return self.forward(x)

    def info(self) -> dict[str, Any]:
        return {"note": self.note} if self.note else {}


class SymneuronRunner(Runner):
    label = "symneuron"

    def __init__(self, model: str, dtype: Any, device: Any, training: bool) -> None:
        import torch

        import symneuron as sn
        from symneuron.runtime import cpu as sn_cpu

        self.sn = sn
        self.neuron = make_neuron(model)
        if device.type == "cuda":
            self.backend = "cuda"
        else:
            self.backend = "cpu" if sn_cpu.available() and dtype == torch.float32 else "torch"
            self.note = f"dry run: backend={self.backend}"
        self.params = {
            name: torch.tensor(
                self.neuron.params[name], dtype=torch.float32, device=device, requires_grad=training
            )
            for name in self.neuron.learnable
        }

    def forward(self, x: Any) -> Any:
        return spikes_of(
            self.sn.simulate(
                self.neuron, x, params=self.params or None, backend=self.backend, store_v_seq=False
            )
        )

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None


class _SigmoidSpike:
    """Heaviside forward, sigmoid surrogate backward, as a user writes it (autograd.Function)."""

    fn = None

    @classmethod
    def get(cls) -> Any:
        if cls.fn is None:
            import torch

            class SigmoidSpike(torch.autograd.Function):
                @staticmethod
                def forward(ctx: Any, u: Any) -> Any:  # noqa: D401
                    ctx.save_for_backward(u)
                    return (u >= 0).to(u.dtype)

                @staticmethod
                def backward(ctx: Any, grad: Any) -> Any:
                    (u,) = ctx.saved_tensors
                    sg = torch.sigmoid(SURROGATE_ALPHA * u)
                    return grad * (SURROGATE_ALPHA * sg * (1.0 - sg))

            cls.fn = SigmoidSpike
        return cls.fn


def make_torch_loop(model: str, neuron: Any, spike_impl: str) -> Any:
    """The plain PyTorch loop over t with the zoo model's constants.

    Stateful models carry their extra state through the loop as written in their
    docstrings: charge H from (V, W), pre-spike update W̃ (Izhikevich from H; ALIF's
    threshold b0 + β·Ã uses the updated Ã), spike, reset V, on-spike reset of W.
    """
    import torch

    p = dict(neuron.params)
    v_th = None if model == "ALIF" else float(neuron.v_threshold)
    v_reset = neuron.v_reset
    target = 0.0 if v_reset is None else float(v_reset)
    spike_fn = _SigmoidSpike.get()

    if spike_impl == "function":

        def spike(u: Any) -> Any:
            return spike_fn.apply(u)
    else:  # straight-through: Θ(u) forward, d sigmoid(αu)/du backward

        def spike(u: Any) -> Any:
            s = (u >= 0).to(u.dtype)
            if torch.is_grad_enabled():
                sg = torch.sigmoid(SURROGATE_ALPHA * u)
                s = s + (sg - sg.detach())
            return s

    if model == "IF":

        def charge(v: Any, x: Any, k: Any) -> Any:
            return v + x
    elif model == "LIF":
        tau = float(p["tau"])

        def charge(v: Any, x: Any, k: Any) -> Any:
            return v + (x - (v - target)) / tau
    elif model == "PLIF":

        def charge(v: Any, x: Any, k: Any) -> Any:
            return v + (x - (v - target)) * k
    elif model == "QIF":
        tau, a0, v_c, v_rest = (float(p[n]) for n in ("tau", "a0", "v_c", "v_rest"))

        def charge(v: Any, x: Any, k: Any) -> Any:
            return v + (x + a0 * (v - v_rest) * (v - v_c)) / tau
    elif model == "EIF":
        tau, d_t, theta, v_rest = (float(p[n]) for n in ("tau", "delta_T", "theta_rh", "v_rest"))

        def charge(v: Any, x: Any, k: Any) -> Any:
            return v + (x + v_rest - v + d_t * torch.exp((v - theta) / d_t)) / tau
    elif model not in ("Izhikevich", "ALIF"):
        raise NotImplementedError(f"no torch loop for {model}")

    if model in ("Izhikevich", "ALIF"):
        if model == "Izhikevich":
            tau, a0, v_c, v_rest, tau_w, a, b = (
                float(p[n]) for n in ("tau", "a0", "v_c", "v_rest", "tau_w", "a", "b")
            )
            w_init = float(neuron.states["W"].init)

            def step(v: Any, w: Any, x: Any) -> tuple[Any, Any, Any]:
                h = v + (x + a0 * (v - v_rest) * (v - v_c) - w) / tau
                return h, w + (a * (h - v_rest) - w) / tau_w, v_th

            def on_spike(w_tilde: Any, s: Any) -> Any:
                return w_tilde + b * s
        else:  # ALIF: adaptive threshold b0 + beta * A
            tau, rho, beta, b0 = (float(p[n]) for n in ("tau", "rho", "beta", "b0"))
            w_init = float(neuron.states["A"].init)

            def step(v: Any, w: Any, x: Any) -> tuple[Any, Any, Any]:
                a_tilde = rho * w
                return v + (x - v) / tau, a_tilde, b0 + beta * a_tilde

            def on_spike(w_tilde: Any, s: Any) -> Any:
                return w_tilde + (1.0 - rho) * s

        def loop_stateful(x_seq: Any) -> Any:
            v = torch.full_like(x_seq[0], target)
            w = torch.full_like(x_seq[0], w_init)
            spikes = []
            for t in range(x_seq.shape[0]):
                h, w_tilde, th = step(v, w, x_seq[t])
                s = spike(h - th)
                v = h - th * s if v_reset is None else h * (1.0 - s) + target * s
                w = on_spike(w_tilde, s)
                spikes.append(s)
            return torch.stack(spikes)

        return loop_stateful

    def loop(x_seq: Any, w: Any = None) -> Any:
        k = torch.sigmoid(w).to(x_seq.dtype) if w is not None else None
        v = torch.full_like(x_seq[0], target)
        spikes = []
        for t in range(x_seq.shape[0]):
            h = charge(v, x_seq[t], k)
            s = spike(h - v_th)
            v = h - v_th * s if v_reset is None else h * (1.0 - s) + target * s
            spikes.append(s)
        return torch.stack(spikes)

    return loop


class TorchLoopRunner(Runner):
    label = "torch"

    def __init__(
        self, model: str, dtype: Any, device: Any, training: bool, spike_impl: str = "function"
    ) -> None:
        import torch

        self.neuron = make_neuron(model)
        self.loop = make_torch_loop(model, self.neuron, spike_impl)
        self.w = None
        if model == "PLIF":
            self.w = torch.tensor(
                self.neuron.params["w"], dtype=torch.float32, device=device, requires_grad=training
            )
        self.spike_impl = spike_impl

    def forward(self, x: Any) -> Any:
        return self.loop(x, self.w) if self.w is not None else self.loop(x)

    def zero_grad(self) -> None:
        if self.w is not None:
            self.w.grad = None


class CompileRunner(TorchLoopRunner):
    label = "compile"

    def __init__(
        self,
        model: str,
        dtype: Any,
        device: Any,
        training: bool,
        cache: dict[Any, Any],
        key: Any,
        settings: dict[str, Any],
        spike_impl: str = "function",
    ) -> None:
        import torch

        super().__init__(model, dtype, device, training, spike_impl)
        self.dynamic_n = settings["compile_dynamic_n"]
        full_key = (*key, spike_impl, self.dynamic_n)
        self.fresh = full_key not in cache
        if self.fresh:
            cache[full_key] = torch.compile(
                self.loop,
                mode=None if settings["compile_mode"] == "default" else settings["compile_mode"],
            )
        self.compiled = cache[full_key]
        self.eager = self.loop
        self.note = (
            f"spike={spike_impl}, dynamic_n={self.dynamic_n}, mode={settings['compile_mode']}"
        )

    def forward(self, x: Any) -> Any:
        import torch

        if self.fresh and self.dynamic_n:
            torch._dynamo.mark_dynamic(x, 1)
        self.fresh = False
        return self.compiled(x, self.w) if self.w is not None else self.compiled(x)

    def baseline_forward(self, x: Any) -> Any:
        # The eager loop returns the same outputs; calling the compiled function under
        # no_grad would compile a second graph just for this measurement.
        return self.eager(x, self.w) if self.w is not None else self.eager(x)


class SJRunner(Runner):
    def __init__(
        self, version: str, sj: Any, model: str, dtype: Any, device: Any, training: bool
    ) -> None:
        self.label = version
        self.neuron_sn = make_neuron(model)
        kw = sj_kwargs(model, self.neuron_sn)
        kw["surrogate_function"] = sj["surrogate"].Sigmoid(alpha=SURROGATE_ALPHA)
        kw["step_mode"] = "m"
        if version == "sj014":
            kw["backend"] = "cupy" if device.type == "cuda" else "torch"
            if device.type != "cuda":
                self.note = "dry run: backend=torch"
        cls = getattr(sj["neuron"], SJ_CLASSES[model])
        self.node = cls(**kw).to(device)
        self.dtype = dtype
        self.cast = False

    def cast_params(self) -> None:
        self.node.to(self.dtype)
        self.cast = True
        self.note = (self.note + "; " if self.note else "") + "node params cast to the input dtype"

    def forward(self, x: Any) -> Any:
        self.node.reset()
        return self.node(x)

    def zero_grad(self) -> None:
        for p in self.node.parameters():
            p.grad = None


# --------------------------------------------------------------------------------------
# one measurement
# --------------------------------------------------------------------------------------


def measure(
    runner: Runner,
    inputs: Inputs,
    mode: str,
    timer: Timer,
    settings: dict[str, Any],
    rec: dict[str, Any],
    retry: Any = None,
) -> None:
    import torch

    training = mode == "training"
    xs = inputs.xs(training)
    grad_ctx = torch.enable_grad if training else torch.no_grad

    def call(x: Any) -> None:
        if training:
            x.grad = None
            runner.zero_grad()
            runner.forward(x).sum().backward()
        else:
            runner.forward(x)

    # first call: checked (compile time, kernel loading etc. land here)
    with grad_ctx():
        timer.sync()
        t0 = time.perf_counter()
        try:
            spikes = runner.forward(xs[0])
            if training:
                spikes.sum().backward()
            timer.sync()
        except Exception as exc:  # noqa: BLE001
            if retry is None or _is_sticky_cuda(exc):
                raise
            runner = retry(exc)
            rec["retried_after"] = f"{type(exc).__name__}: {exc}"[:300]
            timer.sync()
            t0 = time.perf_counter()
            spikes = runner.forward(xs[0])
            if training:
                spikes.sum().backward()
            timer.sync()
        rec["first_call_s"] = time.perf_counter() - t0
        rec.update(runner.info())
        rec["check"] = check_spikes(spikes, inputs, settings)
        if spikes.dtype != inputs.dtype:
            rec["check"]["spike_dtype"] = str(spikes.dtype)
        del spikes
        if training:
            grad = xs[0].grad
            if grad is None:
                rec["check"]["grad"] = "no gradient reached x"
                rec["check"]["pass"] = False
            else:
                rec["check"]["grad_finite"] = bool(torch.isfinite(grad).all())
                try:
                    rec["check"]["grad_relerr"] = _relnorm(
                        grad[:, : inputs.grad_slice], inputs.ref_grad()
                    )
                except Exception as exc:  # noqa: BLE001
                    rec["check"]["grad_relerr_error"] = str(exc)[:200]
            xs[0].grad = None

        # warm-up, then the estimate that sizes the repetitions
        est = []
        for i in range(max(1, settings["warmup"])):
            timer.sync()
            t0 = time.perf_counter()
            call(xs[(i + 1) % len(xs)])
            timer.sync()
            est.append(time.perf_counter() - t0)
        estimate = min(est)
        reps = _reps(estimate, settings)
        gc_was = gc.isenabled()
        gc.disable()
        try:
            wall = timer.wall(call, xs, reps)
            host = statistics.median(wall)
            dev = timer.device(call, xs, _reps(host, settings), host)
        finally:
            if gc_was:
                gc.enable()
    rec.update(
        status="ok",
        gpu_batches_host_slower=timer.gap_risk,
        wall_s=statistics.median(wall),
        gpu_s=statistics.median(dev),
        wall_min_s=min(wall),
        gpu_min_s=min(dev),
        reps_wall=len(wall),
        reps_gpu=len(dev),
        buffers=len(xs),
    )
    if training and timer.cuda:
        rec["retained_bytes"] = retained_memory(runner, inputs, timer)
    for x in xs:
        x.grad = None


def retained_memory(runner: Runner, inputs: Inputs, timer: Timer) -> int | None:
    """memory_allocated after a forward with grad minus after one without (outputs alive)."""
    import torch

    x_plain = inputs.raw[0].detach()
    x_grad = inputs.raw[0].detach().requires_grad_(True)
    runner.zero_grad()
    gc.collect()
    timer.sync()
    base = timer.allocated()
    with torch.no_grad():
        out = runner.baseline_forward(x_plain)
    timer.sync()
    without = timer.allocated() - base  # type: ignore[operator]
    del out
    gc.collect()
    timer.sync()
    base = timer.allocated()
    with torch.enable_grad():
        out = runner.forward(x_grad)
        timer.sync()
        with_grad = timer.allocated() - base  # type: ignore[operator]
        del out
    x_grad.grad = None
    runner.zero_grad()
    gc.collect()
    return int(with_grad - without)


# --------------------------------------------------------------------------------------
# workers
# --------------------------------------------------------------------------------------


def _versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version()}
    for name in ("torch", "numpy", "sympy", "cupy", "triton", "matplotlib"):
        try:
            mod = __import__(name)
            out[name] = getattr(mod, "__version__", "?")
        except Exception as exc:  # noqa: BLE001
            out[name] = None
            out[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:200]
    try:
        import torch

        out["torch_cuda"] = torch.version.cuda
    except Exception:  # noqa: BLE001
        pass
    try:
        import symneuron

        out["symneuron"] = symneuron.__version__
    except Exception as exc:  # noqa: BLE001
        out["symneuron_error"] = str(exc)[:200]
    digest = hashlib.sha256()
    for path in sorted((REPO / "symneuron").rglob("*.py")):
        digest.update(path.relative_to(REPO).as_posix().encode())
        digest.update(path.read_bytes())
    out["symneuron_source_sha256"] = digest.hexdigest()[:16]
    return out


def _device_info(device: Any) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"device": str(device)}
    if device.type != "cuda":
        info["gpu"] = f"cpu-{platform.machine()}"
        return info
    props = torch.cuda.get_device_properties(device)
    info.update(
        gpu=props.name,
        total_memory=props.total_memory,
        sm_count=props.multi_processor_count,
        capability=f"{props.major}.{props.minor}",
        l2_bytes=getattr(props, "L2_cache_size", None),
    )
    try:
        q = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
        fields = [f.strip() for f in q.stdout.strip().splitlines()[0].split(",")]
        info.update(
            nvidia_smi_name=fields[0],
            driver=fields[1],
            max_sm_clock=fields[2],
            max_mem_clock=fields[3],
            power_limit=fields[4],
        )
    except Exception as exc:  # noqa: BLE001
        info["driver_error"] = str(exc)[:200]
    return info


def _sj_modules(version: str) -> dict[str, Any]:
    import numpy

    if version == "sj014" and not hasattr(numpy, "int"):
        numpy.int = int  # type: ignore[attr-defined]  # removed in NumPy 1.24; 0.0.0.0.14 uses it
    import spikingjelly
    from spikingjelly.activation_based import neuron, surrogate

    try:
        from importlib import metadata

        dist_version = metadata.version("spikingjelly")
    except Exception:  # noqa: BLE001
        dist_version = None
    expected = {"sj014": "0.0.0.0.14", "sj200": "2.0.0"}[version]
    mods = {
        "neuron": neuron,
        "surrogate": surrogate,
        "version": dist_version,
        "file": spikingjelly.__file__,
    }
    if dist_version != expected:
        log(
            f"[{version}] warning: found spikingjelly {dist_version} at {spikingjelly.__file__}, "
            f"expected {expected}"
        )
    return mods


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
        self.sj: dict[str, Any] | None = None
        self.sj_log: list[str] = []
        self.sj_fallbacks: list[str] = []
        if kind in ("sj014", "sj200"):
            self.sj = _sj_modules(kind)
            if kind == "sj200":
                self._capture_sj_log()
                self._watch_sj_fallback()
        if kind == "main":
            self._configure_dynamo()

    def _capture_sj_log(self) -> None:
        try:
            from spikingjelly.logger import logger

            logger.enable("spikingjelly")
            logger.add(
                lambda m: self.sj_log.append(str(m).strip()),
                level="INFO",
                filter=lambda r: r["name"].startswith("spikingjelly"),
            )
        except Exception as exc:  # noqa: BLE001
            log(f"[sj200] could not capture its log: {exc}")

    def _watch_sj_fallback(self) -> None:
        """SpikingJelly 2.0.0 calls ``_require_automatic_torch`` (imported at call time) whenever
        it falls back to its torch reference loop, e.g. for 16-bit state; record those calls."""
        try:
            from spikingjelly._ops import selection

            original = selection._require_automatic_torch

            def wrapped(sel: Any, device: Any, reason: str) -> Any:
                self.sj_fallbacks.append(f"{getattr(sel, '_namespace', '?')}: {reason}")
                return original(sel, device, reason)

            selection._require_automatic_torch = wrapped
        except Exception as exc:  # noqa: BLE001
            log(f"[sj200] cannot watch for torch-reference fallbacks: {exc}")

    def _sj_implementation(self, model: str) -> str | None:
        if self.device.type != "cuda":
            return None
        try:
            from spikingjelly.activation_based import functional

            name = SJ_IMPL_NAMES[model]
            return str(functional.neuron_implementation(name, self.device)["implementation"])
        except Exception as exc:  # noqa: BLE001
            return f"unknown ({type(exc).__name__}: {exc})"[:200]

    @staticmethod
    def _configure_dynamo() -> None:
        import torch

        cfg = torch._dynamo.config
        for name, value in (
            ("cache_size_limit", 1024),
            ("recompile_limit", 1024),
            ("accumulated_cache_size_limit", 8192),
            ("accumulated_recompile_limit", 8192),
        ):
            if hasattr(cfg, name):
                setattr(cfg, name, value)

    def meta(self) -> dict[str, Any]:
        out = {
            "worker": self.kind,
            "versions": _versions(),
            **_device_info(self.device),
            "sleep_cycles_per_s": self.timer.cycles_per_s,
        }
        if self.sj is not None:
            out["spikingjelly"] = self.sj["version"]
            out["spikingjelly_file"] = self.sj["file"]
        return out

    def copy(self, nbytes: int) -> dict[str, Any]:
        import torch

        n = nbytes // 4
        src = torch.empty(n, dtype=torch.float32, device=self.device).fill_(1.0)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)

        bufs = [src, dst]
        del src, dst

        def call(_: Any) -> None:
            bufs[1].copy_(bufs[0])

        self.timer.sync()
        times = self.timer.device(call, [None], 20, 1e-5)
        t = statistics.median(times)
        bufs.clear()
        self._free()
        return {
            "bytes": int(n * 4),
            "gpu_s": t,
            "gpu_min_s": min(times),
            "bandwidth_Bps": 2 * n * 4 / t,
            "counted": "bytes read + bytes written",
        }

    def _free(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()

    def _inputs_for(self, cfg: dict[str, Any]) -> Inputs:
        key = (cfg["model"], cfg["T"], cfg["N"], cfg["dtype"])
        if (
            self.inputs is None
            or (
                self.inputs.cfg["model"],
                self.inputs.cfg["T"],
                self.inputs.cfg["N"],
                self.inputs.cfg["dtype"],
            )
            != key
        ):
            self.inputs = None
            self._free()
            self.inputs = Inputs(cfg, self.device, self.settings)
        return self.inputs

    def _runner(self, peer: str, cfg: dict[str, Any], spike_impl: str = "function") -> Runner:
        dtype = _torch_dtype(cfg["dtype"])
        training = cfg["mode"] == "training"
        if peer == "symneuron":
            return SymneuronRunner(cfg["model"], dtype, self.device, training)
        if peer == "torch":
            return TorchLoopRunner(cfg["model"], dtype, self.device, training)
        if peer == "compile":
            key = (
                cfg["model"],
                cfg["dtype"],
                cfg["mode"],
                cfg["T"],
                None if self.settings["compile_dynamic_n"] else cfg["N"],
            )
            return CompileRunner(
                cfg["model"],
                dtype,
                self.device,
                training,
                self.compiled,
                key,
                self.settings,
                spike_impl,
            )
        if peer in ("sj014", "sj200"):
            assert self.sj is not None
            return SJRunner(peer, self.sj, cfg["model"], dtype, self.device, training)
        raise ValueError(peer)

    def bench(self, cfg: dict[str, Any], peers: list[str]) -> list[dict[str, Any]]:
        records = []
        inputs: Inputs | None = None
        try:
            inputs = self._inputs_for(cfg)
        except Exception as exc:  # noqa: BLE001
            err = _short_error(exc)
            for peer in peers:
                records.append(
                    {**cfg, "peer": peer, "status": "error", "error": f"inputs/reference: {err}"}
                )
            if _is_sticky_cuda(exc):
                raise SystemExit(3) from exc
            return records
        poisoned = False
        for peer in peers:
            rec: dict[str, Any] = {**cfg, "peer": peer, "status": "error", "buffers": inputs.nbuf}
            self.sj_log.clear()
            self.sj_fallbacks.clear()
            runner: Runner | None = None
            try:
                _fault_hook(peer, cfg)
                runner = self._runner(peer, cfg)
                retry = None
                if peer == "compile":

                    def retry(exc: BaseException, cfg: dict[str, Any] = cfg) -> Runner:
                        log(
                            f"[main] compile failed with autograd.Function ({exc!r:.200}); "
                            "retrying with STE"
                        )
                        return self._runner("compile", cfg, spike_impl="ste")
                elif peer in ("sj014", "sj200") and inputs.half:

                    def retry(exc: BaseException, runner: Runner = runner) -> Runner:
                        assert isinstance(runner, SJRunner)
                        runner.cast_params()
                        return runner

                measure(runner, inputs, cfg["mode"], self.timer, self.settings, rec, retry)
            except Exception as exc:  # noqa: BLE001
                rec["status"] = _status_of(exc)
                rec["error"] = _short_error(exc)
                log(f"[{self.kind}] {config_key(cfg)} {peer}: {rec['status']}: {exc!r:.300}")
                poisoned = _is_sticky_cuda(exc)
            finally:
                if self.sj_log:
                    rec["sj_log"] = self.sj_log[-3:]
                if peer == "sj200":
                    fallbacks = sorted(set(self.sj_fallbacks))
                    if fallbacks:
                        rec["implementation"] = "torch reference (" + "; ".join(fallbacks) + ")"
                    else:
                        rec["implementation"] = self._sj_implementation(cfg["model"])
                del runner
                self._free()
            records.append(rec)
            if poisoned:
                break
        if poisoned:
            # the CUDA context is unusable: answer, then exit so the parent restarts us
            for peer in peers[len(records) :]:
                records.append(
                    {
                        **cfg,
                        "peer": peer,
                        "status": "error",
                        "error": "not run: an earlier peer left the CUDA context unusable",
                    }
                )
            _reply({"records": records})
            raise SystemExit(3)
        return records


def _fault_hook(peer: str, cfg: dict[str, Any]) -> None:
    """Testing aid: SNBENCH_FAULT="peer:exit|hang|raise|notimpl[:dtype]" breaks that peer."""
    spec = os.environ.get("SNBENCH_FAULT", "")
    if not spec:
        return
    parts = spec.split(":")
    if parts[0] != peer or (len(parts) > 2 and parts[2] != cfg["dtype"]):
        return
    action = parts[1] if len(parts) > 1 else "raise"
    if action == "exit":
        os._exit(7)
    if action == "hang":
        time.sleep(10**6)
    if action == "notimpl":
        raise NotImplementedError(f"fault injected for {peer}")
    raise RuntimeError(f"fault injected for {peer}")


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(MARK_RESULT + json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def worker_main(kind: str, settings: dict[str, Any]) -> int:
    try:
        state = WorkerState(kind, settings)
        meta = state.meta()
    except Exception as exc:  # noqa: BLE001
        sys.stdout.write(MARK_READY + json.dumps({"error": _short_error(exc)}) + "\n")
        sys.stdout.flush()
        return 2
    sys.stdout.write(MARK_READY + json.dumps(meta, default=str) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        op = req.get("op")
        if op == "quit":
            return 0
        try:
            if op == "copy":
                _reply({"copy": state.copy(int(req["bytes"]))})
            elif op == "bench":
                _reply({"records": state.bench(req["cfg"], req["peers"])})
            else:
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
    out: dict[str, Any] = {
        "impl": impl,
        "env": {
            k: os.environ.get(k)
            for k in (
                "SYMNEURON_CACHE",
                "CUPY_CACHE_DIR",
                "TRITON_CACHE_DIR",
                "TORCHINDUCTOR_CACHE_DIR",
            )
        },
        "T": settings["fc_T"],
        "N": settings["fc_N"],
        "models": {},
    }
    try:
        t0 = time.perf_counter()
        import torch

        out["import_torch_s"] = time.perf_counter() - t0
        device = torch.device("cpu" if settings["dry_run"] else "cuda")
        t0 = time.perf_counter()
        if device.type == "cuda":
            torch.zeros(1, device=device)
            torch.cuda.synchronize()
        # torch's own one-off costs (the autograd engine's device thread, the first
        # reduction and fill kernels), paid by any first backward whatever the model
        # (same for every implementation), so they are kept out of the per-model times
        probe = torch.rand(8, 8, device=device, requires_grad=True)
        (probe * 2.0).sum().backward()
        sync_first = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync_first()
        out["cuda_init_s"] = time.perf_counter() - t0

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize()

        t0 = time.perf_counter()
        if impl == "symneuron":
            import symneuron as sn  # noqa: F401
        else:
            sj = _sj_modules(impl)
            out["spikingjelly"] = sj["version"]
        out["import_s"] = time.perf_counter() - t0
        if impl == "symneuron" and device.type == "cuda":
            # one-time runtime start: CuPy import, NVRTC library load, module load of a trivial
            # kernel. A user's very first call pays this once on top of the first model's time.
            t0 = time.perf_counter()
            import cupy

            cupy.RawModule(
                code='extern "C" __global__ void symneuron_bench_noop() {}', options=("-std=c++17",)
            ).get_function("symneuron_bench_noop")
            out["runtime_init_s"] = time.perf_counter() - t0
        gen = torch.Generator(device=device)
        gen.manual_seed(0)
        for model in models:
            rec: dict[str, Any] = {}
            try:
                x = (
                    2.2
                    * torch.rand((settings["fc_T"], settings["fc_N"]), generator=gen, device=device)
                    - 0.2
                )
                if impl == "symneuron":
                    runner: Runner = SymneuronRunner(model, torch.float32, device, True)
                else:
                    runner = SJRunner(impl, sj, model, torch.float32, device, True)
                times = []
                for _ in range(3):
                    xg = x.detach().requires_grad_(True)
                    runner.zero_grad()
                    sync()
                    t0 = time.perf_counter()
                    runner.forward(xg).sum().backward()
                    sync()
                    times.append(time.perf_counter() - t0)
                rec.update(first_s=times[0], second_s=times[1], third_s=times[2], note=runner.note)
            except Exception as exc:  # noqa: BLE001
                rec["error"] = _short_error(exc)
            out["models"][model] = rec
    except Exception as exc:  # noqa: BLE001
        out["error"] = _short_error(exc)
    Path(result_file).write_text(json.dumps(out, indent=1, default=str))
    return 0


def derive_main(model: str, result_file: str) -> int:
    """Symbolic derivation time of one zoo model in a fresh process."""
    out: dict[str, Any] = {"model": model}
    try:
        t0 = time.perf_counter()
        import symneuron  # noqa: F401  (import time is measured)

        out["import_s"] = time.perf_counter() - t0
        # SymPy's one-off costs (its lazy imports on first use, e.g. sympy.tensor from
        # Add.flatten, ~50 ms locally) land on whichever neuron a process derives first;
        # they are measured on a throwaway neuron and reported apart from the model's time
        import symneuron as sn

        t0 = time.perf_counter()
        warm = sn.Neuron(sn.V + (sn.X - sn.V) / 3, name="bench_warmup")
        warm.spec()
        warm.source("cuda", "float32")
        out["sympy_first_use_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        neuron = construct_neuron(model)
        out["ctor_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        neuron.spec()
        out["spec_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        src = neuron.source("cuda", "float32")
        out["source_s"] = time.perf_counter() - t0
        out["source_chars"] = len(src)
        t0 = time.perf_counter()
        for dtype in ("float16", "bfloat16", "float64"):
            neuron.source("cuda", dtype)
        out["source_other_dtypes_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        construct_neuron(model).spec()
        out["spec_again_s"] = time.perf_counter() - t0
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
        self.kind = kind
        self.args = args
        self.settings = settings
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.meta: dict[str, Any] | None = None
        self.starts = 0
        self.failures = 0
        self.dead_reason: str | None = None

    def env(self) -> dict[str, str]:
        return worker_env(self.kind, self.args)

    def start(self) -> None:
        self.starts += 1
        cmd = [
            sys.executable,
            "-u",
            str(Path(__file__).resolve()),
            "--worker",
            self.kind,
            "--settings",
            json.dumps(self.settings),
        ]
        log(f"[bench] starting worker {self.kind} (start #{self.starts})")
        self.lines = queue.Queue()
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            text=True,
            bufsize=1,
            env=self.env(),
            cwd=str(REPO),
        )
        threading.Thread(target=self._reader, args=(self.proc, self.lines), daemon=True).start()
        kind, payload = self._next(self.args.worker_start_timeout_s)
        if kind != "ready":
            self.stop()
            raise WorkerDied(f"worker {self.kind} did not start: {payload}")
        if "error" in payload:
            self.stop()
            raise WorkerDied(f"worker {self.kind} failed at start: {payload['error']}")
        self.meta = payload

    def _reader(self, proc: subprocess.Popen[str], lines: queue.Queue[tuple[str, Any]]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(MARK_READY):
                lines.put(("ready", json.loads(line[len(MARK_READY) :])))
            elif line.startswith(MARK_RESULT):
                lines.put(("result", json.loads(line[len(MARK_RESULT) :])))
            else:
                sys.stderr.write(f"[{self.kind}] {line}")
        lines.put(("eof", proc.wait()))

    def _next(self, timeout: float) -> tuple[str, Any]:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return ("timeout", f"no answer within {timeout:.0f} s")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def request(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.dead_reason:
            raise WorkerDied(self.dead_reason)
        if not self.alive():
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
            self.dead_reason = (
                f"worker {self.kind} failed {self.failures} times; last: {kind} {payload}"
            )
        raise WorkerDied(f"worker {self.kind}: {kind} ({payload})")

    def stop(self, graceful: bool = True) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if graceful and proc.poll() is None:
            try:
                assert proc.stdin is not None
                proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                proc.stdin.flush()
                proc.wait(timeout=10)
            except Exception:  # noqa: BLE001
                pass
        if proc.poll() is None:
            proc.kill()  # only this worker's own pid
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)


def worker_env(kind: str, args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    # keep each SpikingJelly out of the others' processes
    paths = [
        p
        for p in paths
        if Path(p).resolve()
        not in {Path(args.sj014_path).resolve(), Path(args.sj200_path).resolve()}
    ]
    if kind == "sj014":
        paths.insert(0, args.sj014_path)
    elif kind == "sj200":
        paths.insert(0, args.sj200_path)
    paths.insert(0, str(REPO))
    env["PYTHONPATH"] = os.pathsep.join(paths)
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
        text = Path(path).read_text() if Path(path).stat().st_size else ""
        if proc.stderr.strip():
            for line in proc.stderr.strip().splitlines()[-8:]:
                log(f"  [{argv[1]}] {line}")
        if not text:
            return {
                "error": f"rc={proc.returncode}; stderr: {proc.stderr[-800:]}",
                "process_s": wall,
            }
        out = json.loads(text)
        out["process_s"] = wall
        return out
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
    if not ok:
        return recs[0]
    out = dict(ok[0])
    if len(recs) == 1:
        return out
    for key in ("wall_s", "gpu_s"):
        out[key] = statistics.median(r[key] for r in ok)
        out[f"rounds_{key}"] = [r[key] for r in ok]
    for key in ("wall_min_s", "gpu_min_s"):
        out[key] = min(r[key] for r in ok)
    for key in ("reps_wall", "reps_gpu"):
        out[key] = sum(r[key] for r in ok)
    out["rounds"] = len(ok)
    out["check"] = dict(ok[0].get("check") or {})
    out["check"]["pass"] = all((r.get("check") or {}).get("pass", True) for r in ok)
    if len(ok) < len(recs):
        out["rounds_failed"] = [r.get("error") for r in recs if r.get("status") != "ok"]
    return out


def measure_derivation(args: argparse.Namespace, models: list[str]) -> dict[str, Any]:
    """One fresh process per model, run side by side (CPU only; the GPU is idle meanwhile)."""
    out: dict[str, Any] = {}
    env = worker_env("derive", args)

    def one(model: str) -> None:
        out[model] = run_oneshot(["--worker", "derive", "--impl", model], env, 300)

    # a few at a time: each is single-threaded, and contention would inflate the figures
    width = max(1, min(len(models), (os.cpu_count() or 1) // 4))
    for i in range(0, len(models), width):
        threads = [threading.Thread(target=one, args=(m,)) for m in models[i : i + width]]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    for model in models:
        r = out[model]
        log(
            f"[bench] derivation {model}: spec {r.get('spec_s', float('nan')):.3f} s, "
            f"source {r.get('source_s', float('nan')):.3f} s {r.get('error', '')[:200]}"
        )
    return out


def measure_first_calls(
    args: argparse.Namespace, settings: dict[str, Any], models: list[str], peers: list[str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    jobs: list[tuple[str, list[str]]] = []
    if "symneuron" in peers:
        jobs.append(("symneuron", models))
    # SpikingJelly: LIF as the reference point, plus the stateful models it has
    sj_models = ["LIF"] + [m for m in models if m in STATEFUL_MODELS and m in SJ_CLASSES]
    for sj in ("sj014", "sj200"):
        if sj in peers:
            jobs.append((sj, sj_models))
    base = Path(tempfile.mkdtemp(prefix="snbench-cache-"))
    try:
        for impl, impl_models in jobs:
            sj_path = {"sj014": args.sj014_path, "sj200": args.sj200_path}.get(impl)
            if sj_path and not Path(sj_path, "spikingjelly").is_dir():
                out[impl] = {"error": f"SpikingJelly not found under {sj_path}"}
                continue
            caches = {
                "SYMNEURON_CACHE": base / impl / "symneuron",
                "CUPY_CACHE_DIR": base / impl / "cupy",
                "TRITON_CACHE_DIR": base / impl / "triton",
                "TORCHINDUCTOR_CACHE_DIR": base / impl / "inductor",
            }
            for path in caches.values():
                path.mkdir(parents=True, exist_ok=True)
            env = worker_env(impl if impl != "symneuron" else "main", args)
            env.update({k: str(v) for k, v in caches.items()})
            out[impl] = {}
            for phase in ("cold", "warm"):
                res = run_oneshot(
                    [
                        "--worker",
                        "firstcall",
                        "--impl",
                        impl,
                        "--models",
                        ",".join(impl_models),
                        "--settings",
                        json.dumps(settings),
                    ],
                    env,
                    400,
                )
                out[impl][phase] = res
                summary = {
                    m: round(r.get("first_s", float("nan")), 4)
                    for m, r in res.get("models", {}).items()
                }
                log(
                    f"[bench] first call {impl} ({phase} cache): {summary} "
                    f"{res.get('error', '')[:300]}"
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


# --------------------------------------------------------------------------------------
# parent: orchestration
# --------------------------------------------------------------------------------------


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return dict(
        dry_run=args.dry_run,
        target_ms=args.target_ms,
        min_reps=args.min_reps,
        max_reps=args.max_reps,
        warmup=args.warmup,
        rotate_mb=args.rotate_mb if not args.dry_run else 1.0,
        max_bufs=args.max_bufs,
        compile_max_T=args.compile_max_T,
        compile_mode=args.compile_mode,
        compile_dynamic_n=args.compile_dynamic_n,
        fp32_max_mismatch=args.fp32_max_mismatch,
        half_min_match=args.half_min_match,
        grad_slice=args.grad_slice,
        fc_T=args.fc_T,
        fc_N=args.fc_N if not args.dry_run else 256,
    )


def _result_path(out_dir: Path, gpu: str, tag: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-") or "unknown"
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    stem = f"{name}-{date}" + (f"-{tag}" if tag else "")
    path = out_dir / f"{stem}.json"
    if path.exists():
        path = out_dir / f"{stem}-{_dt.datetime.now(_dt.timezone.utc).strftime('%H%M%S')}.json"
    return path


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t_start = time.monotonic()
        self.matrix = resolve_matrix(args)
        self.configs = plan_configs(self.matrix)
        self.settings = _settings(args)
        self.workers: dict[str, WorkerProc] = {}
        self.path: Path | None = None
        self.out_dir = (
            Path(args.out_dir)
            if args.out_dir
            else (
                Path(tempfile.gettempdir()) / "symneuron-bench-dryrun"
                if args.dry_run
                else HERE / "results"
            )
        )
        self.compile_spent = 0.0
        self.results: dict[str, Any] = {
            "schema": SCHEMA,
            "complete": False,
            "meta": {
                "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "argv": sys.argv[1:],
                "host": platform.node(),
                "dry_run": args.dry_run,
                "matrix": self.matrix,
                "notes": [
                    "N = 2^14: the whole working set fits in L2, so those figures are L2 "
                    "bandwidth, "
                    "not HBM; the floor fractions there can exceed 1.",
                    "GPU time: CUDA events around each call, with a GPU sleep queued ahead of each "
                    "batch so that host launch gaps are excluded where the host can run ahead.",
                    "Wall time: synchronize, perf_counter, call (+ backward), synchronize; median.",
                ],
            },
            "settings": self.settings,
            "copy": None,
            "workers": {},
            "records": [],
            "first_call": {},
            "derivation": {},
            "events": [],
        }

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

    # -- output ---------------------------------------------------------------
    def write(self) -> Path:
        import report

        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.path is None:
            gpu = self.results["meta"].get("gpu") or "unknown"
            self.path = _result_path(
                self.out_dir, ("dryrun-" if self.args.dry_run else "") + gpu, self.args.tag
            )
        report.annotate(self.results)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.results, indent=1, default=str))
        tmp.replace(self.path)
        return self.path

    # -- phases ---------------------------------------------------------------
    def start_main(self) -> None:
        main = self.worker("main")
        try:
            main.start()
            assert main.meta is not None
            meta = {k: v for k, v in main.meta.items() if k != "worker"}
            self.results["meta"].update(meta)
            self.results["workers"]["main"] = main.meta
            copy = main.request(
                {
                    "op": "copy",
                    "bytes": int(
                        self.args.copy_gib * 2**30 if not self.args.dry_run else 64 * 2**20
                    ),
                },
                self.args.request_timeout_s,
            )
            self.results["copy"] = copy.get("copy") or {"error": copy.get("error")}
            bw = (self.results["copy"] or {}).get("bandwidth_Bps")
            self.event(
                f"device {meta.get('gpu')} driver {meta.get('driver')}; copy floor "
                f"{bw / 1e9 if bw else float('nan'):.0f} GB/s"
            )
        except WorkerDied as exc:
            self.event(f"main worker failed: {exc}")

    def start_sj(self, kind: str) -> None:
        w = self.worker(kind)
        if w.meta is not None or w.dead_reason:
            return
        path = self.args.sj014_path if kind == "sj014" else self.args.sj200_path
        if not Path(path, "spikingjelly").is_dir():
            w.dead_reason = f"SpikingJelly for {kind} not found under {path} (--{kind}-path)"
            self.results["workers"][kind] = {"error": w.dead_reason}
            self.event(w.dead_reason)
            return
        try:
            w.start()
            self.results["workers"][kind] = w.meta
            self.event(
                f"worker {kind}: spikingjelly {w.meta.get('spikingjelly') if w.meta else '?'}"
            )
        except WorkerDied as exc:
            w.failures += 1
            self.results["workers"][kind] = {"error": str(exc)[:1500]}
            self.event(f"worker {kind} failed to start: {exc}")
            if w.failures >= 2:
                w.dead_reason = str(exc)

    def run_config(self, cfg: dict[str, Any]) -> None:
        peers = self.matrix["peers"]
        remaining = self.args.time_budget_s - self.elapsed()
        by_worker: dict[str, list[str]] = {}
        for peer in peers:
            why = peer_unsupported(peer, cfg["model"])
            if why:
                self.results["records"].append(
                    {**cfg, "peer": peer, "status": "unsupported", "error": why}
                )
                continue
            if peer == "compile":
                if cfg["T"] > self.args.compile_max_T:
                    self.skip(cfg, peer, f"T > --compile-max-T ({self.args.compile_max_T})")
                    continue
                if self.compile_spent >= self.args.compile_budget_s:
                    self.skip(
                        cfg, peer, f"compile budget ({self.args.compile_budget_s:.0f} s) spent"
                    )
                    continue
                if remaining < 60:
                    self.skip(cfg, peer, "less than 60 s of the time budget left")
                    continue
            by_worker.setdefault(PEER_WORKER[peer], []).append(peer)
        # --rounds R: the workers take turns R times, in alternating order, so that a slow
        # phase of the host (seconds long on a VM) does not land on one peer only
        order = [kind for kind in ("main", "sj014", "sj200") if by_worker.get(kind)]
        per_peer: dict[str, list[dict[str, Any]]] = {}
        for round_ in range(max(1, self.args.rounds)):
            for kind in order if round_ % 2 == 0 else order[::-1]:
                wpeers = by_worker[kind]
                if kind != "main":
                    self.start_sj(kind)
                w = self.worker(kind)
                try:
                    reply = w.request(
                        {"op": "bench", "cfg": cfg, "peers": wpeers}, self.args.request_timeout_s
                    )
                    if "records" in reply:
                        for rec in reply["records"]:
                            per_peer.setdefault(rec["peer"], []).append(rec)
                    else:
                        for peer in wpeers:
                            err = {
                                **cfg,
                                "peer": peer,
                                "status": "error",
                                "error": reply.get("error"),
                            }
                            per_peer.setdefault(peer, []).append(err)
                except WorkerDied as exc:
                    self.event(f"{config_key(cfg)}: {exc}")
                    for peer in wpeers:
                        err = {**cfg, "peer": peer, "status": "error", "error": f"worker: {exc}"}
                        per_peer.setdefault(peer, []).append(err)
        for recs in per_peer.values():
            self.add(merge_rounds(recs))

    def add(self, rec: dict[str, Any]) -> None:
        if rec.get("peer") == "compile" and rec.get("first_call_s"):
            self.compile_spent += float(rec["first_call_s"])
        self.results["records"].append(rec)

    def skip(self, cfg: dict[str, Any], peer: str, why: str) -> None:
        self.results["records"].append({**cfg, "peer": peer, "status": "skipped", "error": why})

    def run(self) -> int:
        args = self.args
        n_cfg = len(self.configs)
        self.event(
            f"{n_cfg} configurations x {len(self.matrix['peers'])} peers; "
            f"budget {args.time_budget_s:.0f} s"
        )
        if not args.skip_derivation:
            self.results["derivation"] = measure_derivation(args, self.matrix["models"])
        if not args.skip_first_call:
            self.results["first_call"] = measure_first_calls(
                args, self.settings, self.matrix["models"], self.matrix["peers"]
            )
        self.start_main()
        self.write()
        last_write = time.monotonic()
        for i, cfg in enumerate(self.configs):
            if self.elapsed() > args.time_budget_s:
                for rest in self.configs[i:]:
                    for peer in self.matrix["peers"]:
                        self.skip(rest, peer, "time budget spent")
                self.event(f"time budget spent after {i} of {n_cfg} configurations")
                break
            t0 = time.monotonic()
            self.run_config(cfg)
            log(
                f"[bench] {i + 1}/{n_cfg} {config_key(cfg)} {time.monotonic() - t0:.1f} s "
                f"(elapsed {self.elapsed():.0f} s) " + self._line(cfg)
            )
            if time.monotonic() - last_write > 20:
                self.write()
                last_write = time.monotonic()
        else:
            self.results["complete"] = True
        self.stop_workers()
        self.results["meta"]["elapsed_s"] = round(self.elapsed(), 1)
        path = self.write()
        log(f"[bench] wrote {path}")
        if not args.no_plot:
            try:
                import report

                png = report.plot(self.results, path.with_suffix(".png"))
                log(f"[bench] wrote {png}")
            except Exception as exc:  # noqa: BLE001
                self.event(f"plot failed: {_short_error(exc)}")
                self.write()
        import report

        print(report.short_table(self.results), flush=True)
        return 0

    def _line(self, cfg: dict[str, Any]) -> str:
        parts = []
        for rec in self.results["records"]:
            if all(rec.get(k) == cfg[k] for k in cfg):
                if rec.get("status") == "ok":
                    chk = "" if rec.get("check", {}).get("pass") else "!"
                    parts.append(
                        f"{rec['peer']}={rec['wall_s'] * 1e6:.0f}/{rec['gpu_s'] * 1e6:.0f}us{chk}"
                    )
                else:
                    parts.append(f"{rec['peer']}={rec.get('status')}")
        return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        settings = json.loads(args.settings) if args.settings else {}
        if args.worker in ("main", "sj014", "sj200"):
            return worker_main(args.worker, settings)
        if args.worker == "firstcall":
            return firstcall_main(args.impl, settings, args.models or ["LIF"], args.result_file)
        if args.worker == "derive":
            return derive_main(args.impl, args.result_file)
    bench = Bench(args)
    if args.list:
        for cfg in bench.configs:
            print(config_key(cfg))
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


if __name__ == "__main__":
    sys.exit(main())
