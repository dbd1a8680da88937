"""What the benchmark programs share: command-line lists, timing, SpikingJelly, worker
processes that answer one JSON line per request, and the output (JSON, markdown, plots).

``bench_neurons.py`` and ``bench_e2e.py`` run each library in a long-lived worker
process of its own (the two SpikingJelly versions conflict): the parent starts a
:class:`Worker`, the worker answers with :func:`serve`. torch is imported lazily, so
that a parent and the report scripts stay light.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
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

#: marks a worker's answer on its stdout (anything else it prints goes to the log)
MARK = "@@BENCH "
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
DTYPE_ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}
SJ_VERSION = {"sj014": "0.0.0.0.14", "sj200": "2.0.0"}
Rec = dict[str, Any]


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------


def parse_n(text: str) -> int:
    """ "2^20", "2**20", "20" (an exponent up to 40) or "1048576"."""
    for sep in ("^", "**"):
        if sep in text:
            base, exp = text.split(sep)
            return int(base) ** int(exp)
    value = int(text)
    return 2**value if value <= 40 else value


def csv_list(kind: Callable[[str], Any] = str, allowed: Any = None, aliases: Any = None) -> Any:
    """An argparse type: a comma-separated list of ``kind``, each in ``allowed``."""

    def parse(text: str) -> list[Any]:
        out = [kind((aliases or {}).get(s, s)) for s in text.replace(" ", "").split(",") if s]
        bad = [o for o in out if allowed is not None and o not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad} not in {list(allowed)}")
        return out

    return parse


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser whose description is the first paragraph of ``doc`` (a module docstring)."""
    return argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


# --------------------------------------------------------------------------------------
# torch, the machine, errors
# --------------------------------------------------------------------------------------


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, DTYPES[name])


def short_error(exc: BaseException) -> str:
    """``Type: message`` and the last frames of the traceback."""
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    last = "".join(tb[-3:]).strip()
    return f"{type(exc).__name__}: {exc}"[:600] + ("\n" + last[-900:] if last else "")


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
        digest.update(path.relative_to(REPO).as_posix().encode())
        digest.update(path.read_bytes())
    out["symneuron_source_sha256"] = digest.hexdigest()[:16]
    return out


def device_info(device: Any) -> dict[str, Any]:
    """The GPU's name, size, L2, driver and clocks (torch and nvidia-smi)."""
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


# --------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------


class Timer:
    """Wall and device timing: CUDA events on a GPU, ``perf_counter`` on the CPU.

    Every method times ``call(i)`` for i = 0, 1, ...: the caller picks the input of
    repetition i (e.g. rotating among copies, so that a repeat does not hit L2)."""

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

    def events(self, call: Callable[[int], Any], reps: int) -> list[float]:
        """Seconds per call between CUDA events, the calls issued back to back (as in a
        training loop); the wall time on the CPU."""
        if not self.cuda:
            return self.wall(call, reps)
        events = self._events(reps)
        for i, (a, b) in enumerate(events):
            a.record()
            call(i)
            b.record()
        self.sync()
        return [a.elapsed_time(b) / 1e3 for a, b in events]

    def device(self, call: Callable[[int], Any], reps: int, host_s: float) -> list[float]:
        """Per-call device time. A GPU sleep is queued ahead of each batch so that the host
        enqueues the whole batch before the GPU reaches it: events then bracket device work
        only, not host launch gaps (unless a call blocks the host or overflows the queue)."""
        if not self.cuda:
            return self.wall(call, reps)
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
                call(done + j)
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


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The garbage collector off for a block (no collection lands inside a timing)."""
    import gc

    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def merge_rounds(recs: list[Rec], medians: tuple[str, ...], digits: int | None = None) -> Rec:
    """One record from one entry's rounds: the median of the rounds' ``medians`` fields,
    each round's values kept (``rounds_<field>``, rounded to ``digits``), the failed rounds'
    errors listed. A round that failed leaves the others standing; all failed: the first
    failure."""
    ok = [r for r in recs if r.get("status") == "ok"]
    if not ok:
        return dict(recs[0])
    out = dict(ok[0], rounds=len(ok))
    for key in medians:
        out[key] = statistics.median(r[key] for r in ok)
        values = [r[key] for r in ok]
        out[f"rounds_{key}"] = values if digits is None else [round(v, digits) for v in values]
    if len(ok) < len(recs):
        failed = [r for r in recs if r.get("status") != "ok"]
        out["rounds_failed"] = [r.get("error", r.get("reason")) for r in failed]
    return out


def alternate(kinds: list[str], rounds: int) -> Iterator[str]:
    """``kinds`` ``rounds`` times, every other round reversed: a slow phase of the host
    (seconds long on a VM) does not land on one peer only."""
    for r in range(max(1, rounds)):
        yield from kinds if r % 2 == 0 else kinds[::-1]


# --------------------------------------------------------------------------------------
# SpikingJelly
# --------------------------------------------------------------------------------------


def locate_sj(kind: str, args: argparse.Namespace) -> list[str]:
    """PYTHONPATH entries giving a worker SpikingJelly ``kind`` ("sj014", "sj200", or
    "sjtorch": 2.0.0, any version will do): under ``args.sj014_path``/``sj200_path`` (as
    ``run_gpu.sh`` installs them), else its wheel from ``args.wheels`` installed into a
    temporary directory, else ``[]`` when this Python has it; raises FileNotFoundError
    with the reason otherwise."""
    version = SJ_VERSION.get(kind, "2.0.0")
    path = Path(args.sj014_path if kind == "sj014" else args.sj200_path)
    if (path / "spikingjelly").is_dir():  # run_gpu.sh puts loguru (2.0.0 needs it) in /tmp/site
        site = [] if kind == "sj014" or not Path("/tmp/site/loguru").is_dir() else ["/tmp/site"]
        return [str(path), *site]
    wheels = Path(getattr(args, "wheels", None) or REPO / ".whl")
    found_wheels = sorted(wheels.glob(f"spikingjelly-{version}-*.whl"))
    if found_wheels:
        target = Path(tempfile.gettempdir(), f"snbench-e2e-sj-{version}")
        if not (target / "spikingjelly").is_dir():
            _install(found_wheels[0], target)
            for loguru in sorted(wheels.glob("loguru-*.whl"))[:1]:
                _install(loguru, target)
        return [str(target)]
    from importlib import metadata

    found = None
    with contextlib.suppress(Exception):
        found = metadata.version("spikingjelly")
    if found == version or (kind == "sjtorch" and found):
        return []
    raise FileNotFoundError(
        f"SpikingJelly {version} not found: not under {path}, no wheel in {wheels}, "
        f"this Python has {found or 'none'} (pip install spikingjelly=={version})"
    )


def _install(wheel: Path, target: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--upgrade", "--target", str(target), str(wheel)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if proc.returncode:
        raise RuntimeError(f"pip could not install {wheel.name}: {proc.stderr[-400:]}")


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
        self._watch()

    def _watch(self) -> None:
        """SpikingJelly 2.0.0 falls back to its torch loop (e.g. for 16-bit state) through
        ``_require_automatic_torch``, looked up at call time: record each call."""
        with contextlib.suppress(Exception):
            from spikingjelly._ops import selection

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

            impl = functional.neuron_implementation(model.lower(), device)
            return str(impl["implementation"])
        except Exception as exc:  # noqa: BLE001
            return f"unknown ({type(exc).__name__}: {exc})"[:200]


# --------------------------------------------------------------------------------------
# worker processes
# --------------------------------------------------------------------------------------


class WorkerDied(RuntimeError):
    """A worker exited, hung or could not start."""


def reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def serve(start: Callable[[], Any], ops: dict[str, Callable[[Any, Rec], Rec]]) -> int:
    """A worker's main loop: ``start()`` builds its state (answered with ``{"ready":
    meta}``, the state's ``meta()``), then one JSON request per stdin line, ``{"op":
    name, ...}``, answered with ``ops[name](state, request)``. An answer holding
    ``"exit"`` ends the worker with that code once sent."""
    try:
        state = start()
        reply({"ready": state.meta()})
    except Exception as exc:  # noqa: BLE001
        reply({"error": short_error(exc)})
        return 2
    for line in sys.stdin:
        req = json.loads(line) if line.strip() else {}
        if req.get("op") == "quit":
            return 0
        try:
            answer = ops[req["op"]](state, req) if req.get("op") in ops else None
            answer = answer if answer is not None else {"error": f"unknown op {req.get('op')!r}"}
        except Exception as exc:  # noqa: BLE001
            answer = {"error": short_error(exc)}
        reply(answer)
        if "exit" in answer:
            return int(answer["exit"])
    return 0


class Worker:
    """A long-lived worker process (``script --worker kind``) answering one marked JSON
    line per request; restarted after it dies, retired after ``max_failures`` failures
    in a row."""

    def __init__(self, kind: str, argv: list[str], env: dict[str, str], max_failures: int) -> None:
        self.kind, self.argv, self.env, self.max_failures = kind, argv, env, max_failures
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.meta: dict[str, Any] | None = None
        self.failures = 0
        self.dead: str | None = None

    def launch(self) -> None:
        """Start the process without waiting for it (see :meth:`ready`)."""
        log(f"[bench] starting worker {self.kind}")
        self.lines = queue.Queue()
        self.proc = subprocess.Popen([sys.executable, "-u", *self.argv], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1, env=self.env,
                                     cwd=str(REPO))  # fmt: skip
        threading.Thread(target=self._read, args=(self.proc, self.lines), daemon=True).start()

    def _read(self, proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(MARK):
                lines.put(line[len(MARK) :])
            else:
                sys.stderr.write(f"[{self.kind}] {line}")
        lines.put(None)

    def _fail(self, why: str, graceful: bool = False) -> WorkerDied:
        self.stop(graceful)
        self.failures += 1
        if self.failures >= self.max_failures:
            self.dead = f"{why} (gave up after {self.failures} failures)"
        return WorkerDied(why)

    def _next(self, timeout: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise self._fail(f"worker {self.kind} gave no answer in {timeout:.0f} s") from None
        if line is None:
            code = self.proc.poll() if self.proc else None
            raise self._fail(f"worker {self.kind} exited (code {code})")
        return dict(json.loads(line))

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
        if self.proc is None or self.proc.poll() is not None:
            self.launch()
            self.ready(timeout)
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise self._fail(f"worker {self.kind}: pipe closed ({exc})") from None
        answer = self._next(timeout)
        self.failures = 0  # only failures in a row retire a worker
        return answer

    def stop(self, graceful: bool = True) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if graceful and proc.poll() is None and proc.stdin is not None:
            with contextlib.suppress(Exception):
                proc.stdin.write('{"op": "quit"}\n')
                proc.stdin.flush()
                proc.wait(timeout=10)
        if proc.poll() is None:
            proc.kill()  # this worker's own pid only
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)


def worker_env(extra_paths: list[str], drop: tuple[str, ...] = ()) -> dict[str, str]:
    """This environment with the repository, the benchmarks and ``extra_paths`` first on
    PYTHONPATH, and the entries whose path contains one of ``drop`` removed."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = [p for p in paths if not any(d in p for d in drop)]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE), *extra_paths, *paths])
    return env


# --------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------


def write_json(path: Path, obj: Any) -> Path:
    """Write ``obj`` to ``path`` through a temporary file (a reader never sees half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)
    return path


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


def pow2(n: int) -> str:
    """``2^k`` for a power of two, else the number."""
    e = math.log2(n) if n > 0 else 0
    return f"2^{int(e)}" if e == int(e) else str(n)
