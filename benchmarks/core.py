"""What the benchmark programs share: the command line, the machine, timing, SpikingJelly,
worker processes and their parent, and the output (JSON, markdown tables, plots).

``bench_neurons.py`` and ``bench_e2e.py`` run each library in a long-lived worker process
of its own (the two SpikingJelly versions conflict): a :class:`Parent` starts the
:class:`Worker` processes, each serving a :class:`WorkerBase`.
torch is imported lazily, so that a parent and the reports stay light.
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
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _path in (str(REPO), str(HERE)):  # the repository's symneuron, and the benchmarks
    if _path not in sys.path:
        sys.path.insert(0, _path)

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64"}
DTYPE_ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}
#: worker kind -> the SpikingJelly version it imports (sjtorch: any, its torch backend)
SJ_VERSION = {"sj014": "0.0.0.0.14", "sj200": "2.0.0", "sjtorch": "2.0.0"}
STICKY_CUDA = (
    "illegal memory access",
    "CUDA error: an illegal",
    "unspecified launch failure",
    "misaligned address",
    "CUDA_ERROR_ILLEGAL",
    "cudaErrorIllegalAddress",
    "device-side assert",
    "CUDA_ERROR_LAUNCH_FAILED",
)
Rec = dict[str, Any]


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def parse_n(text: str) -> int:
    """ "2^20", "2**20", "20" (an exponent up to 40) or "1048576"."""
    for sep in ("^", "**"):
        if sep in text:
            base, exp = text.split(sep)
            return int(base) ** int(exp)
    return 2 ** int(text) if int(text) <= 40 else int(text)


def csv_list(kind: Callable[[str], Any] = str, allowed: Any = None, aliases: Any = None) -> Any:
    """An argparse type: a comma-separated list of ``kind``, each in ``allowed``."""

    def parse(text: str) -> list[Any]:
        out = [kind((aliases or {}).get(s, s)) for s in text.replace(" ", "").split(",") if s]
        bad = [o for o in out if allowed is not None and o not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad} not in {list(allowed)}")
        return out

    return parse


#: flags several programs take: name -> ``add_argument``'s keywords
FLAGS: dict[str, dict[str, Any]] = {
    "--dry-run": dict(action="store_true", help="CPU smoke test, tiny sizes"),
    "--T": dict(type=int, default=64),
    "--N": dict(type=parse_n, default=2**20, help="e.g. 2^20 (or 20)"),
    "--dtypes": dict(type=csv_list(str, DTYPES, DTYPE_ALIASES), default=["fp32", "bf16"]),
    "--wheels": dict(default=str(REPO / ".whl"), help="SpikingJelly/loguru wheels"),
}


def parser(doc: str | None, *flags: str) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of ``doc`` (a module docstring), taking
    ``flags`` (names in :data:`FLAGS`)."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0], formatter_class=fmt)
    for flag in flags:
        p.add_argument(flag, **FLAGS[flag])
    return p


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, DTYPES[name])


def short_error(exc: BaseException) -> str:
    """``Type: message`` and the last frames of the traceback."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:]).strip()
    return f"{type(exc).__name__}: {exc}"[:600] + ("\n" + tb[-900:] if tb else "")


def is_sticky_cuda(exc: BaseException) -> bool:
    """Whether ``exc`` leaves the CUDA context unusable (the worker must restart)."""
    return any(n in f"{type(exc).__name__}: {exc}" for n in STICKY_CUDA)


def versions() -> dict[str, Any]:
    """Python's and the libraries' versions, and a hash of symneuron's sources."""
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
        digest.update(path.relative_to(REPO).as_posix().encode() + path.read_bytes())
    return {**out, "symneuron_source_sha256": digest.hexdigest()[:16]}


def device_info(device: Any) -> dict[str, Any]:
    """The GPU's name, size, L2, driver and clocks (torch and nvidia-smi)."""
    import torch

    if device.type != "cuda":
        return {"device": str(device), "gpu": f"cpu-{platform.machine()}"}
    p = torch.cuda.get_device_properties(device)
    info: dict[str, Any] = dict(
        device=str(device),
        gpu=p.name,
        total_memory=p.total_memory,
        sm_count=p.multi_processor_count,
        capability=f"{p.major}.{p.minor}",
        l2_bytes=getattr(p, "L2_cache_size", None),
    )
    fields = ("nvidia_smi_name", "driver", "max_sm_clock", "max_mem_clock", "power_limit")
    query = "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit"
    try:
        q = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        info.update(
            zip(fields, [f.strip() for f in q.stdout.splitlines()[0].split(",")], strict=False)
        )
    except Exception as exc:  # noqa: BLE001
        info["driver_error"] = str(exc)[:200]
    return info


# ------------------------------------------------------------------------------- timing


class Timer:
    """Wall and device timing: CUDA events on a GPU, ``perf_counter`` on the CPU. Every
    method times ``call(i)`` for i = 0, 1, ...: the caller picks the input of repetition i
    (e.g. rotating among copies, so that a repeat does not hit L2)."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch, self.cuda = torch, device.type == "cuda"
        self.cycles_per_s: float | None = None
        self.gap_risk, self.enqueue_s = 0, 0.0
        if self.cuda:
            try:  # calibrate torch.cuda._sleep, used to queue work ahead of each batch
                torch.cuda._sleep(1000)
                cycles = 20_000_000
                self.cycles_per_s = cycles / self.events(lambda i: torch.cuda._sleep(cycles), 1)[0]
            except Exception as exc:  # noqa: BLE001
                log(f"[timer] torch.cuda._sleep unavailable ({exc}); GPU times may include gaps")

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def wall(self, call: Callable[[int], Any], reps: int) -> list[float]:
        """Seconds per call, each call between two synchronizations (host time counts)."""
        out = []
        for i in range(reps):
            self.sync()
            t0 = time.perf_counter()
            call(i)
            self.sync()
            out.append(time.perf_counter() - t0)
        return out

    def events(self, call: Callable[[int], Any], reps: int, sleep_s: float = 0.0) -> list[float]:
        """Seconds per call between CUDA events, the calls issued back to back (as in a
        training loop) after a GPU sleep of ``sleep_s``; the wall time on the CPU."""
        if not self.cuda:
            return self.wall(call, reps)
        event = self.torch.cuda.Event
        events = [(event(enable_timing=True), event(enable_timing=True)) for _ in range(reps)]
        self.sync()
        slept = sleep_s if self.cycles_per_s else 0.0
        if slept:
            self.torch.cuda._sleep(int(self.cycles_per_s * slept))  # type: ignore[operator]
        t0 = time.perf_counter()
        for i, (a, b) in enumerate(events):
            a.record()
            call(i)
            b.record()
        self.enqueue_s = time.perf_counter() - t0
        self.gap_risk += self.enqueue_s > slept  # the GPU may have caught up with the host
        self.sync()
        return [a.elapsed_time(b) / 1e3 for a, b in events]

    def device(self, call: Callable[[int], Any], reps: int, host_s: float) -> list[float]:
        """Per-call device time. A GPU sleep is queued ahead of each batch of 20 so that the
        host enqueues the whole batch before the GPU reaches it: events then bracket device
        work only, not host launch gaps (unless a call blocks the host)."""
        out: list[float] = []
        per_call_host, self.gap_risk = host_s, 0  # first guess: the wall time (an upper bound)
        while len(out) < reps:
            done, k = len(out), min(20, reps - len(out))
            sleep_s = min(0.25, max(2e-4, 1.5 * k * per_call_host + 1e-4))
            out += self.events(lambda j, d=done: call(d + j), k, sleep_s)  # type: ignore[misc]
            per_call_host = self.enqueue_s / k if self.cuda else per_call_host
        return out


def cuda_graph(step: Callable[[], Any], optimizer: Any, warmup: int) -> Callable[[], Any]:
    """A whole training step (``step``: ``zero_grad(set_to_none=True)``, forward, backward,
    ``optimizer.step()``) captured in a CUDA graph after ``warmup`` calls on a side stream
    (torch's whole-network recipe); returns the graph's ``replay`` (static inputs)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)  # backward allocates the grads from the graph's pool
    with torch.cuda.graph(graph):
        step()
    return graph.replay


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The garbage collector off for a block (no collection lands inside a timing)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def alternate(kinds: list[str], rounds: int) -> Iterator[str]:
    """``kinds`` ``rounds`` times, every other round reversed: a slow phase of the host
    (seconds long on a VM) does not land on one peer only."""
    for r in range(max(1, rounds)):
        yield from kinds if r % 2 == 0 else kinds[::-1]


# ------------------------------------------------------------------------- SpikingJelly


def locate_sj(kind: str, wheels: Path) -> list[str]:
    """PYTHONPATH entries giving a worker SpikingJelly ``kind`` (:data:`SJ_VERSION`; sjtorch:
    any version): its wheel (and loguru's) from ``wheels`` installed into a temporary
    directory, else ``[]`` when this Python has that version; FileNotFoundError otherwise."""
    from importlib import metadata

    version = SJ_VERSION.get(kind, "2.0.0")
    target = Path(tempfile.gettempdir(), f"snbench-sj-{version}")
    found_wheels = sorted(wheels.glob(f"spikingjelly-{version}-*.whl"))[:1]
    for wheel in found_wheels + sorted(wheels.glob("loguru-*.whl"))[: len(found_wheels)]:
        if not (target / wheel.name.split("-")[0]).is_dir():
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--upgrade",
                "--target",
                str(target),
                str(wheel),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
            if proc.returncode:
                raise RuntimeError(f"pip could not install {wheel.name}: {proc.stderr[-400:]}")
    if found_wheels:
        return [str(target)]
    found = None
    with contextlib.suppress(Exception):
        found = metadata.version("spikingjelly")
    if found == version or (kind == "sjtorch" and found):
        return []
    raise FileNotFoundError(
        f"SpikingJelly {version} not found: no wheel in {wheels}, this "
        f"Python has {found or 'none'} (pip install spikingjelly=={version})"
    )


class SpikingJelly:
    """The SpikingJelly on this process's path: its ``neuron`` and ``surrogate`` modules,
    and (2.0.0) the fallbacks to its torch reference loop it took since :meth:`clear`."""

    def __init__(self, expected: str) -> None:
        import numpy

        if expected == "0.0.0.0.14" and not hasattr(numpy, "int"):
            numpy.int = int  # type: ignore[attr-defined]  # removed in NumPy 1.24; 0.0.0.0.14 uses it
        from importlib import metadata

        import spikingjelly
        from spikingjelly.activation_based import neuron, surrogate

        self.neuron, self.surrogate, self.file = neuron, surrogate, spikingjelly.__file__
        self.version = None
        with contextlib.suppress(Exception):
            self.version = metadata.version("spikingjelly")
        if self.version != expected:
            log(f"[sj] warning: spikingjelly {self.version} at {self.file}, not {expected}")
        self.fallbacks: list[str] = []
        with contextlib.suppress(Exception):  # 2.0.0 falls back to its torch loop (e.g. for
            from spikingjelly._ops import selection  # 16-bit state) through this: record it

            original = selection._require_automatic_torch

            def wrapped(sel: Any, device: Any, reason: str) -> Any:
                self.fallbacks.append(f"{getattr(sel, '_namespace', '?')}: {reason}")
                return original(sel, device, reason)

            selection._require_automatic_torch = wrapped

    def clear(self) -> None:
        self.fallbacks.clear()

    def implementation(self, model: str, device: Any) -> str | None:
        """What ran ``model``: the torch loop it fell back to, or 2.0.0's choice (Triton)."""
        if self.fallbacks:
            return "torch reference (" + "; ".join(sorted(set(self.fallbacks))) + ")"
        if device.type != "cuda":
            return None
        try:
            from spikingjelly.activation_based import functional

            return str(functional.neuron_implementation(model.lower(), device)["implementation"])
        except Exception as exc:  # noqa: BLE001
            return f"unknown ({type(exc).__name__}: {exc})"[:200]


# ---------------------------------------------------------- the models on every side
#: the benchmarked models and their constants, shared by bench_neurons.py, peers.py,
#: bench_e2e.py, report.py and profile_ncu.py (here, so that none imports another)

SINGLE_MODELS = ["IF", "LIF", "PLIF", "QIF", "EIF"]
STATEFUL_MODELS = ["Izhikevich", "ALIF"]
#: paper models and the rest of the zoo (symneuron only), each counted with its own floor
PAPER_MODELS = ["Izhikevich2003", "HodgkinHuxley"]
OTHER_MODELS = [
    "ThresholdLIF",
    "CuLIF",
    "AdEx",
    "AdEx2005",
    "FitzHughNagumo",
    "ResonateAndFire",
    "AdLIF",
    "IafCondExp",
    "IafPscExp",
    "ThetaNeuron",
    "RefractoryLIF",
]
ALL_MODELS = SINGLE_MODELS + STATEFUL_MODELS + PAPER_MODELS + OTHER_MODELS
#: input scale of the models in their own units (mV/pA models need a current that fires):
#: the inputs are scale * U(-0.2, 2), scales chosen so that the float64 reference fires
#: (rates over 64 steps: CuLIF 0.10, AdEx2005 0.09, FitzHugh-Nagumo 0.02, resonate-and-fire
#: 0.19, AdLIF 0.24, iaf_cond_exp 0.17, iaf_psc_exp 0.08, theta 0.15; unlisted: scale 1)
INPUT_SCALE = {
    "Izhikevich2003": 10.0,
    "HodgkinHuxley": 25.0,
    "CuLIF": 0.25,
    "AdEx2005": 1e4,
    "ResonateAndFire": 16.0,
    "AdLIF": 16.0,
    "IafCondExp": 300.0,
    "IafPscExp": 3e3,
    "ThetaNeuron": 64.0,
}
#: constructor arguments of the benchmarked neuron (the same constants on every side)
MODEL_KWARGS: dict[str, dict[str, float]] = {"Izhikevich": {"a": 0.3, "b": 0.2}}
SJ_CLASSES = {
    "IF": "IFNode",
    "LIF": "LIFNode",
    "PLIF": "ParametricLIFNode",
    "QIF": "QIFNode",
    "EIF": "EIFNode",
    "Izhikevich": "IzhikevichNode",
}
SJ_PARAMS = {
    "LIF": ("tau",),
    "QIF": ("tau", "v_c", "a0", "v_rest"),
    "EIF": ("tau", "delta_T", "theta_rh", "v_rest"),
    "Izhikevich": ("tau", "v_c", "a0", "v_rest", "tau_w", "a", "b"),
}
SURROGATE_ALPHA = 4.0  # sn.surrogate.Sigmoid() and SpikingJelly's Sigmoid() default


def make_neuron(model: str, **kw: Any) -> Any:
    """The zoo model with the benchmark's constants (``MODEL_KWARGS``); the peers use
    SpikingJelly's default Sigmoid(alpha=4) surrogate, so the zoo's default must be it."""
    import symneuron as sn

    neuron = getattr(sn.models, model)(**MODEL_KWARGS.get(model, {}), **kw)
    expected = f"Sigmoid(alpha={SURROGATE_ALPHA})"
    if not kw and getattr(neuron.surrogate, "name", "") != expected:
        raise RuntimeError(f"{model}: default surrogate is {neuron.surrogate.name}, not {expected}")
    return neuron


def sj_node(sj: Any, model: str, **kw: Any) -> Any:
    """SpikingJelly's multi-step node of ``model`` with the zoo's constants and surrogate."""
    if model not in SJ_CLASSES:
        raise NotImplementedError(f"SpikingJelly has no {model} neuron")
    neuron = make_neuron(model)
    p = {k: float(v) for k, v in neuron.params.items()}
    kw.update({name: p[name] for name in SJ_PARAMS.get(model, ())}, step_mode="m")
    kw.update(
        v_threshold=float(neuron.v_threshold),
        v_reset=neuron.v_reset,
        detach_reset=bool(neuron.detach_reset),
    )
    if model in ("LIF", "PLIF"):
        kw["decay_input"] = True
    if model == "PLIF":
        kw["init_tau"] = 1.0 + math.exp(-p["w"])
    if model == "Izhikevich":
        kw["w_rest"] = float(neuron.states["W"].init)
    kw["surrogate_function"] = sj.surrogate.Sigmoid(alpha=SURROGATE_ALPHA)
    return getattr(sj.neuron, SJ_CLASSES[model])(**kw)


def bench_input(model: str, shape: tuple[int, ...], gen: Any, device: Any) -> Any:
    """The benchmark's input for ``model``: U(-0.2, 2) times its ``INPUT_SCALE`` (float32)."""
    import torch

    scale = INPUT_SCALE.get(model, 1.0)
    return scale * (2.2 * torch.rand(shape, generator=gen, device=device) - 0.2)


# --------------------------------------------------------------------- worker processes


class WorkerDied(RuntimeError):
    """A worker exited, hung or could not start."""


class WorkerBase:
    """A worker process's state: its device, timer, SpikingJelly (by its ``kind``) and the
    entries of the current configuration. A request names entries: ``prepare`` builds each
    (:meth:`build`: first call, checks, warm-up), ``measure`` times each once (:meth:`time`),
    ``drop`` forgets them; every answer holds one record per entry (``name``, ``status``)."""

    def __init__(self, kind: str, settings: dict[str, Any]) -> None:
        import torch

        self.torch, self.kind, self.settings = torch, kind, settings
        self.cuda = not settings["dry_run"]
        if self.cuda and not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device (use --dry-run on a CPU)")
        self.device = torch.device("cuda" if self.cuda else "cpu")
        if self.cuda:
            torch.zeros(1, device=self.device)
        self.timer = Timer(self.device)
        self.sj = SpikingJelly(SJ_VERSION[kind]) if kind in SJ_VERSION else None
        self.entries: dict[str, Any] = {}

    def meta(self) -> dict[str, Any]:
        out = {"worker": self.kind, "versions": versions(), **device_info(self.device)}
        out["sleep_cycles_per_s"] = self.timer.cycles_per_s
        if self.sj is not None:
            out.update(spikingjelly=self.sj.version, spikingjelly_file=self.sj.file)
        return out

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()

    def build(self, cfg: dict[str, Any], name: str, rec: Rec) -> Any:
        raise NotImplementedError

    def time(self, entry: Any) -> Rec:
        raise NotImplementedError

    def status_of(self, exc: BaseException) -> str:
        """The status of an entry that failed to build (one that fails to run: error)."""
        return "error"

    def _each(
        self,
        names: list[str],
        work: Callable[[str, Rec], None],
        status_of: Callable[[BaseException], str],
    ) -> dict[str, Any]:
        """``work(name, rec)`` per entry, failures recorded; after one that leaves the CUDA
        context unusable the rest are not run and the worker exits (the parent restarts it)."""
        records: list[Rec] = []
        for name in names:
            records.append(rec := {"name": name, "status": "ok"})
            try:
                work(name, rec)
            except Exception as exc:  # noqa: BLE001
                rec.update(status=status_of(exc), error=short_error(exc))
                self.entries.pop(name, None)
                log(f"[{self.kind}] {name}: {rec['status']}: {exc!r:.300}")
                if is_sticky_cuda(exc):
                    why = "not run: an earlier entry left the CUDA context unusable"
                    rest = [
                        {"name": n, "status": "error", "error": why} for n in names[len(records) :]
                    ]
                    return {"records": records + rest, "exit": 3}
            finally:
                self.free()
        return {"records": records}

    def op_prepare(self, req: Rec) -> Rec:
        def work(name: str, rec: Rec) -> None:
            if self.sj is not None:
                self.sj.clear()
            self.entries[name] = self.build(req["cfg"], name, rec)

        return self._each(req["names"], work, self.status_of)

    def op_measure(self, req: Rec) -> Rec:
        def work(name: str, rec: Rec) -> None:
            if name not in self.entries:
                raise RuntimeError("not prepared (its worker restarted)")
            with no_gc():
                rec.update(self.time(self.entries[name]))

        return self._each(req["names"], work, lambda exc: "error")

    def op_drop(self, req: Rec) -> Rec:
        self.entries.clear()
        self.free()
        return {"records": []}


def _serve(
    conn: Any,
    start: type[WorkerBase],
    kind: str,
    settings: Rec,
    paths: list[str],
    env: dict[str, str],
) -> None:
    """A worker process's main loop: ``start(kind, settings)`` builds its state (answered with
    ``{"ready": state.meta()}``), then each request ``{"op": name, ...}`` is answered with
    ``state.op_<name>(request)``; an answer holding ``"exit"`` ends the worker once sent."""
    os.dup2(2, 1)  # whatever the libraries print goes to the log, not the parent's stdout
    sys.path[:0] = paths
    os.environ.update(env)
    try:
        state = start(kind, settings)
        conn.send({"ready": state.meta()})
    except Exception as exc:  # noqa: BLE001
        return conn.send({"error": short_error(exc)})
    while (req := conn.recv()).get("op") != "quit":
        try:
            answer = getattr(state, f"op_{req.get('op')}")(req)
        except Exception as exc:  # noqa: BLE001
            answer = {"error": short_error(exc)}
        conn.send(answer)
        if "exit" in answer:
            return


class Worker:
    """A worker process (``start``, a :class:`WorkerBase` subclass, in a spawned process with
    ``paths`` first on sys.path and ``env`` set) answering one request at a time; restarted
    after it dies, retired after ``max_failures`` failures in a row."""

    def __init__(self, kind: str, start: type[WorkerBase], settings: Rec, max_failures: int):
        self.kind, self.start, self.settings = kind, start, settings
        self.max_failures, self.paths = max_failures, []
        self.env: dict[str, str] = {}
        self.proc: Any = None
        self.meta: dict[str, Any] = {}
        self.failures, self.dead = 0, ""

    def launch(self) -> None:
        """Start the process without waiting for it (see :meth:`ready`)."""
        import multiprocessing

        log(f"[bench] starting worker {self.kind}")
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        args = (child, self.start, self.kind, self.settings, self.paths, self.env)
        self.proc = ctx.Process(target=_serve, args=args, name=f"bench-{self.kind}")
        self.proc.start()
        child.close()

    def _fail(self, why: str) -> WorkerDied:
        self.stop(graceful=False)
        self.failures += 1
        if self.failures >= self.max_failures:
            self.dead = f"{why} (gave up after {self.failures} failures)"
        return WorkerDied(why)

    def _next(self, timeout: float) -> dict[str, Any]:
        if not self.conn.poll(timeout):
            raise self._fail(f"worker {self.kind} gave no answer in {timeout:.0f} s")
        try:
            return dict(self.conn.recv())
        except (EOFError, OSError):
            self.proc.join(5)
            raise self._fail(f"worker {self.kind} exited (code {self.proc.exitcode})") from None

    def ready(self, timeout: float) -> None:
        """Wait for the started process's first answer: its ``meta``."""
        answer = self._next(timeout)
        if "error" in answer:
            raise self._fail(f"worker {self.kind} could not start: {answer['error']}")
        self.meta = answer["ready"]

    def request(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The worker's answer to ``req`` (started, or restarted, first when needed)."""
        if self.dead:
            raise WorkerDied(self.dead)
        if self.proc is None or not self.proc.is_alive():
            self.launch()
            self.ready(timeout)
        try:
            self.conn.send(req)
        except OSError as exc:
            raise self._fail(f"worker {self.kind}: pipe closed ({exc})") from None
        answer = self._next(timeout)
        self.failures = 0  # only failures in a row retire a worker
        return answer

    def stop(self, graceful: bool = True) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and graceful and proc.is_alive():
            with contextlib.suppress(Exception):
                self.conn.send({"op": "quit"})
                proc.join(10)
        if proc is not None and proc.is_alive():
            proc.kill()  # this worker's own process only
            proc.join(10)


class Parent:
    """A benchmark's parent process: its workers (``script --worker kind --settings``), the
    results (``meta``, ``settings``, ``workers``, ``records``, ``events``) and the run over
    the configurations, which writes the partial results on SIGTERM/SIGINT."""

    max_failures, rounds, medians, digits, request_timeout_s = 3, 1, ("wall_s",), None, 300.0

    def __init__(self, args: argparse.Namespace, schema: str, settings: dict[str, Any]) -> None:
        self.args, self.settings = args, settings
        self.t0 = time.monotonic()
        self.workers: dict[str, Worker] = {}
        meta = dict(date=now_iso(), argv=sys.argv[1:], host=platform.node(), dry_run=args.dry_run)
        self.results: dict[str, Any] = dict(
            schema=schema,
            complete=False,
            meta=meta,
            settings=settings,
            workers={},
            records=[],
            events=[],
        )

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def event(self, text: str) -> None:
        log(f"[bench {self.elapsed():5.1f}s] {text}")
        self.results["events"].append({"t_s": round(self.elapsed(), 1), "text": text[:1500]})

    def env(self, kind: str) -> tuple[list[str], dict[str, str]]:
        """A worker's sys.path entries (only its own SpikingJelly: FileNotFoundError when it has
        none) and environment (a dry run's torch.compile caches in a private TMPDIR)."""
        paths = locate_sj(kind, Path(self.args.wheels)) if kind in SJ_VERSION else []
        tmp = Path(tempfile.gettempdir(), "snbench-dryrun-tmp")
        return paths, {"TMPDIR": str(tmp)} if self.args.dry_run else {}

    def start(self, kinds: list[str], state: type[WorkerBase]) -> None:
        """Start the workers ``kinds`` (each a ``state``) at once, then wait for each; one
        that cannot start is recorded and marked dead."""
        for kind in kinds:
            w = self.workers[kind] = Worker(kind, state, self.settings, self.max_failures)
            try:
                w.paths, w.env = self.env(kind)
                Path(w.env.get("TMPDIR", ".")).mkdir(exist_ok=True)
                w.launch()
            except Exception as exc:  # noqa: BLE001
                w.dead = f"{type(exc).__name__}: {exc}"[:1500]
        for kind in kinds:
            w = self.workers[kind]
            try:
                if not w.dead:
                    w.ready(self.request_timeout_s)
            except WorkerDied as exc:
                w.dead = str(exc)[:1500]
            self.results["workers"][kind] = {"error": w.dead} if w.dead else w.meta
            gpu, sj = w.meta.get("gpu"), w.meta.get("spikingjelly", "-")
            self.event(f"worker {kind}: " + (w.dead or f"ready, {gpu}, spikingjelly {sj}"))
        main = self.results["workers"].get("main") or {}
        self.results["meta"].update({k: v for k, v in main.items() if k != "worker"})

    def ask(self, kind: str, req: dict[str, Any]) -> list[Rec]:
        """The worker's records for ``req`` (one per name; errors when it cannot answer)."""
        worker = self.workers[kind]
        try:
            if worker.dead:  # said once, when it died
                raise WorkerDied(worker.dead)
            answer = worker.request(req, self.request_timeout_s)

            if "error" in answer:
                raise WorkerDied(f"worker {kind}: {answer['error']}")
            return list(answer["records"])
        except WorkerDied as exc:
            if not str(exc) == worker.dead:
                self.event(str(exc))
            why = f"worker: {exc}"[:1500]
            return [{"name": n, "status": "error", "error": why} for n in req.get("names", [])]

    def measure(self, cfg: dict[str, Any], jobs: dict[str, list[str]]) -> dict[str, Rec]:
        """Name -> one record of each job (worker kind -> entry names) on ``cfg``: every entry
        prepared, then timed :attr:`rounds` times, the workers taking turns in alternating
        order (the median of the rounds' :attr:`medians`, each round's kept), then dropped."""
        prep = {
            r["name"]: r
            for k, names in jobs.items()
            for r in self.ask(k, {"op": "prepare", "cfg": cfg, "names": names})
        }
        rounds: dict[str, list[Rec]] = {name: [] for name in prep}
        for kind in alternate(list(jobs), self.rounds):
            names = [n for n in jobs[kind] if prep[n]["status"] == "ok"]
            for rec in self.ask(kind, {"op": "measure", "names": names}) if names else ():
                rounds[rec["name"]].append(rec)
        for kind in jobs:
            self.ask(kind, {"op": "drop"})
        return {name: {**rec, **self.merge(rounds[name])} for name, rec in prep.items()}

    def merge(self, rounds: list[Rec]) -> Rec:
        """One entry's rounds as one record: the median of each of :attr:`medians`, each
        round's value kept (``rounds_<field>``); none ok: the first failure."""
        ok = [r for r in rounds if r["status"] == "ok"]
        if not ok:
            return rounds[0] if rounds else {}
        out = {**ok[0], "rounds": len(ok)}
        for key in self.medians:
            values = [r[key] if self.digits is None else round(r[key], self.digits) for r in ok]
            out.update({key: statistics.median(r[key] for r in ok), f"rounds_{key}": values})
        return out

    def write(self) -> None:
        """Write the results so far (a subclass's)."""

    def over_budget(self, left: list[Any]) -> None:
        """Record the configurations ``left`` unrun (a subclass's)."""

    def run(self, configs: list[Any], run_config: Callable[[Any], None], budget_s: float) -> None:
        """``run_config`` of each configuration until ``budget_s`` is spent."""

        def on_signal(signum: int, _frame: Any) -> None:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)
            self.event(f"signal {signum}: writing partial results")
            self.stop()
            with contextlib.suppress(Exception):
                self.write()
            sys.exit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        last_write = time.monotonic()
        try:
            for i, cfg in enumerate(configs):
                if self.elapsed() > budget_s:
                    self.event(f"time budget spent after {i} of {len(configs)} configurations")
                    self.over_budget(configs[i:])
                    break
                run_config(cfg)
                if time.monotonic() - last_write > 20:
                    self.write()
                    last_write = time.monotonic()
            else:
                self.results["complete"] = True
        finally:
            self.stop()

    def stop(self) -> None:
        self.results["elapsed_s"] = round(self.elapsed(), 1)
        for w in self.workers.values():
            w.stop()


# ------------------------------------------------------------------------------- output


def write_json(path: Path, obj: Any) -> Path:
    """Write ``obj`` to ``path`` through a temporary file (a reader never sees half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)
    return path


def result_path(
    directory: Path, gpu: str, prefix: str = "", suffix: str = "", unique: bool = False
) -> Path:
    """``directory/<prefix><gpu><suffix>.json``, each run of characters other than letters
    and digits in the GPU's name one ``-``; ``unique``: ``-HHMMSS`` added if the file exists."""
    stem = prefix + re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-") + suffix
    if unique and (directory / f"{stem}.json").exists():
        stem += time.strftime("-%H%M%S", time.gmtime())
    return directory / f"{stem}.json"


def md_table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """A markdown table; ``align`` holds one letter per column, ``r`` right-aligned."""
    sep = ["---:" if a == "r" else "---" for a in (align or "l" * len(header))]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def grouped_bars(
    ax: Any, groups: int, series: list[tuple[list[Any], dict[str, Any]]], missing: str = ""
) -> None:
    """Bars of each series side by side at groups 0, 1, ...: ``(heights, ax.bar keywords)``;
    a height None is no bar (``missing`` written there instead, if given)."""
    width = 0.8 / max(1, len(series))
    for i, (heights, style) in enumerate(series):
        shift = (i - (len(series) - 1) / 2) * width
        for j, height in enumerate(heights):
            if height is None and missing:
                ax.text(j + shift, 0, missing, rotation=90, ha="center", va="bottom", fontsize=6)
        values = [math.nan if h is None else h for h in heights]
        ax.bar([j + shift for j in range(groups)], values, width, **style)


def save_figure(fig: Any, path: str | Path, title: str, dpi: int, **layout: Any) -> Path:
    """``fig`` with its title, laid out, written to ``path`` and closed."""
    fig.suptitle(title)
    fig.tight_layout(**layout)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return Path(path)


def pow2(n: int) -> str:
    """``2^k`` for a power of two, else the number."""
    e = math.log2(n) if n > 0 else 0
    return f"2^{int(e)}" if e == int(e) else str(n)
