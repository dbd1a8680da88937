#!/usr/bin/env python3
"""End-to-end training-step benchmark: whole SGD steps of two networks, each library's neurons.

A step is ``zero_grad``, the neurons' ``reset``, forward, cross-entropy, backward and an SGD
step (momentum 0.9) of the networks in ``networks.py``: the CIFAR-10-sized CNN (T = 4,
batch 64) and the SHD-sized MLP (T = 100, batch 64, 700-256-256-20), built with

* ``floor``: ``nn.ReLU`` in place of the neurons (the no-neuron floor);
* ``symneuron``: ``sn.NeuronLayer`` (CUDA backend), and with ``--cudagraphs`` also
  ``symneuron-cg``: the network under ``torch.compile(mode="reduce-overhead")`` (CUDA graphs);
* ``sj-cupy``: SpikingJelly 0.0.0.0.14, ``backend='cupy'``;
* ``sj-triton``: SpikingJelly 2.0.0, its default CUDA implementation (Triton);
* ``sj-torch``: SpikingJelly's torch backend (2.0.0 with ``SJ_<MODEL>_CUDA_IMPLEMENTATION=
  torch``; 0.0.0.0.14 with ``backend='torch'`` when only that one is found).

Every neuron uses the same constants and the Sigmoid(alpha = 4) surrogate (``bench_neurons``'s
``make_neuron`` and ``sj_kwargs``); every network starts from the same weights (seed 0) and
sees the same batch, so the first-step losses of one model agree across libraries (checked).
Precisions: ``fp32``; ``fp16``: ``torch.autocast(float16)`` with a ``GradScaler``; ``bf16``:
``torch.autocast(bfloat16)``.

Timing: each library runs in its own long-lived worker process (the SpikingJelly versions
conflict); a configuration (network, precision) is first built and warmed up in every
worker (compilation lands here), then measured ``--rounds`` times with the workers taking
turns in alternating order. Per round and entry: ``--steps`` steps back to back with CUDA
events around each (the step time of a training loop), then ``--wall-steps`` steps each
timed with ``time.perf_counter`` between synchronizations (host time shows); medians, then
the median of the rounds. *added* = step time minus the floor's.

A peer that is missing (no SpikingJelly, no CuPy, no Triton) or fails is reported as n/a with
the reason. SpikingJelly is found under ``--sj014-path``/``--sj200-path`` (as installed by
``run_gpu.sh``), else installed from the wheels in ``--wheels`` (``.whl/``) into a temporary
directory, else taken from this Python's environment when its version is the right one.

Examples::

    python3 benchmarks/bench_e2e.py --quick --out e2e.json --md e2e.md --plot e2e.png
    python3 benchmarks/bench_e2e.py --cudagraphs --precisions fp32,fp16,bf16 --out e2e.json
    python3 benchmarks/bench_e2e.py --dry-run            # CPU smoke test, tiny sizes
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import json
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
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _path in (str(REPO), str(HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import e2e_report  # noqa: E402  (benchmarks/e2e_report.py)

SCHEMA = "symneuron-e2e/1"
MARK = "@@E2E "
ALL_NETWORKS = ["cnn", "mlp"]
ALL_PRECISIONS = ["fp32", "fp16", "bf16"]
ALL_MODELS = ["LIF", "PLIF", "Izhikevich"]
ALL_LIBRARIES = ["floor", "symneuron", "sj-cupy", "sj-triton", "sj-torch"]
#: library -> the worker process that runs it
#: (sj-torch runs in sj014, with backend='torch', when SpikingJelly 0.0.0.0.14 is found)
WORKER_OF = {"floor": "main", "floor-cg": "main", "symneuron": "main", "symneuron-cg": "main",
             "sj-cupy": "sj014", "sj-triton": "sj200", "sj-torch": "sjtorch"}  # fmt: skip
FLOORS = ("floor", "floor-cg")
#: at most this much time per round and entry in the event-timed steps (slow peers)
ROUND_CAP_MS = 1500.0
SJ_VERSION = {"sj014": "0.0.0.0.14", "sj200": "2.0.0", "sjtorch": "2.0.0"}
#: (networks' batch, per-network kwargs) of each size preset; T comes from networks.INPUTS
FULL = dict(batch=64, cnn={}, mlp={}, data={"cnn": {}, "mlp": {}})
DRY = dict(
    batch=2,
    cnn=dict(channels=(4, 8, 8), in_shape=(3, 8, 8)),
    mlp=dict(sizes=(16, 8, 8, 4)),
    data={"cnn": dict(steps=2, shape=(3, 8, 8)), "mlp": dict(steps=5, shape=(16,), classes=4)},
)
#: defaults of each mode: (models, precisions, rounds, steps, wall steps, warm-up, budget s)
MODES = {
    "full": dict(models=ALL_MODELS, precisions=["fp32", "fp16"], rounds=5, steps=40,
                 wall_steps=20, warmup=10, time_budget_s=1500.0),
    "quick": dict(models=["LIF", "PLIF"], precisions=["fp32", "fp16"], rounds=3, steps=20,
                  wall_steps=10, warmup=5, time_budget_s=170.0),
    "dry": dict(models=["LIF", "PLIF"], precisions=["fp32", "bf16"], rounds=1, steps=2,
                wall_steps=2, warmup=1, time_budget_s=120.0),
}  # fmt: skip


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def _csv(allowed: list[str]) -> Any:
    def parse(text: str) -> list[str]:
        out = [s for s in text.replace(" ", "").split(",") if s]
        bad = [s for s in out if s not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad} not in {allowed}")
        return out

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="short GPU run (about 2 minutes)")
    mode.add_argument("--dry-run", action="store_true", help="CPU smoke test, tiny sizes")
    p.add_argument("--out", default=None, help="JSON results (default: print only)")
    p.add_argument("--md", default=None, help="write the markdown section here too")
    p.add_argument("--plot", default=None, help="PNG: grouped bars of the added time")
    p.add_argument("--networks", type=_csv(ALL_NETWORKS), default=ALL_NETWORKS)
    p.add_argument("--precisions", type=_csv(ALL_PRECISIONS), default=None)
    p.add_argument("--models", type=_csv(ALL_MODELS), default=None)
    p.add_argument("--libraries", type=_csv(ALL_LIBRARIES), default=ALL_LIBRARIES)
    p.add_argument("--cudagraphs", action="store_true", help="also symneuron under "
                   "torch.compile(mode='reduce-overhead')")  # fmt: skip
    for flag in ("rounds", "steps", "wall-steps", "warmup"):
        p.add_argument(f"--{flag}", type=int, default=None)
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="start no configuration after this many seconds")  # fmt: skip
    p.add_argument("--request-timeout-s", type=float, default=300.0)
    p.add_argument("--sj014-path", default=os.environ.get("SJ014_PATH", "/tmp/sj014"))
    p.add_argument("--sj200-path", default=os.environ.get("SJ200_PATH", "/tmp/sj200"))
    p.add_argument("--wheels", default=str(REPO / ".whl"), help="SpikingJelly/loguru wheels")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--settings", default=None, help=argparse.SUPPRESS)
    return p


def resolve_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings: the mode's defaults, overridden by explicit flags."""
    mode = "dry" if args.dry_run else "quick" if args.quick else "full"
    out = dict(MODES[mode], mode=mode, dry_run=args.dry_run, networks=args.networks)
    for key in ("models", "precisions", "rounds", "steps", "wall_steps", "warmup",
                "time_budget_s"):  # fmt: skip
        if getattr(args, key) is not None:
            out[key] = getattr(args, key)
    libraries = list(args.libraries)
    if args.cudagraphs and "symneuron" in libraries:
        libraries.insert(libraries.index("symneuron") + 1, "symneuron-cg")
        if "floor" in libraries:
            libraries.insert(libraries.index("floor") + 1, "floor-cg")
    out["libraries"] = libraries
    return out


# --------------------------------------------------------------------------------------
# worker side: networks, steps, timing (torch is imported here only)
# --------------------------------------------------------------------------------------


def neuron_factory(library: str, model: str, ctx: dict[str, Any]) -> Any:
    """Per-sample shape -> a neuron module of ``library`` (the floor: nn.ReLU)."""
    import bench_neurons as bn
    import networks

    if library in FLOORS:
        return networks.relu
    if library in ("symneuron", "symneuron-cg"):
        backend = "cuda" if ctx["cuda"] else "auto" if ctx["precision"] == "fp32" else "torch"
        return networks.symneuron_neurons(model, backend=backend, **bn.MODEL_KWARGS.get(model, {}))
    sj = ctx["sj"]
    kw = bn.sj_kwargs(model, bn.make_neuron(model))
    kw.update(surrogate_function=sj["surrogate"].Sigmoid(alpha=bn.SURROGATE_ALPHA), step_mode="m")
    if sj["version"] == "0.0.0.0.14":
        kw["backend"] = "cupy" if library == "sj-cupy" else "torch"
    cls = getattr(sj["neuron"], bn.SJ_CLASSES[model])
    return lambda shape: cls(**kw)


class Entry:
    """One network of one (library, model, network, precision) with its optimizer, batch
    and step function."""

    def __init__(self, library: str, model: str, cfg: dict[str, Any], ctx: dict[str, Any]):
        import networks
        import torch
        from torch.nn import functional as F  # noqa: N812

        torch.manual_seed(0)  # the same weights for every library
        size = DRY if ctx["dry_run"] else FULL
        build = {"cnn": networks.cifar_cnn, "mlp": networks.shd_mlp}[cfg["network"]]
        factory = neuron_factory(library, model, {**ctx, "precision": cfg["precision"]})
        self.net = build(factory, **size[cfg["network"]]).to(ctx["device"])
        gen = torch.Generator().manual_seed(0)
        data = size["data"][cfg["network"]]
        self.x, self.y = networks.synthetic_batch(
            cfg["network"], size["batch"], gen, device=ctx["device"], **data
        )
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.01, momentum=0.9)
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg["precision"])
        self.autocast = torch.autocast(ctx["device"].type, dtype=dtype, enabled=dtype is not None)
        scaler_on = cfg["precision"] == "fp16"
        self.scaler = torch.amp.GradScaler(ctx["device"].type, enabled=scaler_on)
        self.forward = self.net
        self.mark_step = None
        if library.endswith("-cg"):
            self.forward = torch.compile(self.net, mode="reduce-overhead")
            self.mark_step = torch.compiler.cudagraph_mark_step_begin
        self.loss_fn = F.cross_entropy
        self.loss0: float | None = None
        self.est_ms = 0.0  # a step's wall time after the warm-up (sizes the measurements)

    def step(self) -> Any:
        if self.mark_step is not None:
            self.mark_step()
        self.opt.zero_grad(set_to_none=True)
        self.net.reset()
        with self.autocast:
            loss = self.loss_fn(self.forward(self.x).float(), self.y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        return loss


@contextlib.contextmanager
def spike_rates(net: Any) -> Any:
    """Collects the mean output of each neuron layer (a module with ``reset``) while active:
    the firing rates of the first step, so that silent layers show in the results."""
    rates: list[Any] = []
    hooks = [
        sub.register_forward_hook(lambda _m, _i, out: rates.append(out.detach().float().mean()))
        for sub in net.modules()
        if sub is not net and callable(getattr(sub, "reset", None))
    ]
    try:
        yield rates
    finally:
        for hook in hooks:
            hook.remove()


class Worker:
    """A worker process's state: its device, its SpikingJelly and the entries it built."""

    def __init__(self, kind: str, settings: dict[str, Any]) -> None:
        import torch

        self.torch, self.kind, self.settings = torch, kind, settings
        self.cuda = not settings["dry_run"]
        if self.cuda and not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device (use --dry-run on a CPU)")
        self.device = torch.device("cuda" if self.cuda else "cpu")
        if self.cuda:
            torch.zeros(1, device=self.device)
        self.sj = None
        self.fallbacks: list[str] = []
        if kind != "main":
            import bench_neurons as bn

            self.sj = bn._sj_modules("sj014" if kind == "sj014" else "sj200")
            self._watch_fallbacks()
        self.entries: dict[tuple[str, ...], Entry | str] = {}
        # every network of a configuration is compiled from the same code (--cudagraphs)
        for name in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 64)

    def _watch_fallbacks(self) -> None:
        """Record SpikingJelly 2.0.0's fallbacks to its torch reference (e.g. 16-bit)."""
        with contextlib.suppress(Exception):
            from spikingjelly._ops import selection

            original = selection._require_automatic_torch

            def wrapped(sel: Any, device: Any, reason: str) -> Any:
                self.fallbacks.append(f"{getattr(sel, '_namespace', '?')}: {reason}")
                return original(sel, device, reason)

            selection._require_automatic_torch = wrapped

    def meta(self) -> dict[str, Any]:
        import bench_neurons as bn

        out = {"worker": self.kind, "versions": bn._versions(), **bn._device_info(self.device)}
        if self.sj is not None:
            out.update(spikingjelly=self.sj["version"], spikingjelly_file=self.sj["file"])
        return out

    def implementation(self, library: str, model: str) -> str | None:
        if library == "sj-torch" and self.sj is not None:
            return f"SpikingJelly {self.sj['version']}, torch"
        if library == "sj-cupy" or self.sj is None or not self.cuda:
            return None
        if self.fallbacks:
            return "fell back to torch reference (" + "; ".join(sorted(set(self.fallbacks))) + ")"
        with contextlib.suppress(Exception):
            from spikingjelly.activation_based import functional

            impl = functional.neuron_implementation(model.lower(), self.device)
            return f"implementation: {impl['implementation']}"
        return None

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def prepare(self, cfg: dict[str, Any], entries: list[list[str]]) -> list[dict[str, Any]]:
        """Build each entry and run its warm-up steps (compilation lands here)."""
        out = []
        ctx = dict(cuda=self.cuda, device=self.device, dry_run=self.settings["dry_run"])
        ctx["sj"] = self.sj
        for library, model in entries:
            key = (cfg["network"], cfg["precision"], library, model)
            rec: dict[str, Any] = {"library": library, "model": model}
            self.fallbacks.clear()
            try:
                entry = Entry(library, model, cfg, ctx)
                self.sync()
                t0 = time.perf_counter()
                graphs = self.torch._dynamo.utils.counters["stats"]["unique_graphs"]
                with spike_rates(entry.net) as rates:
                    loss = entry.step()
                graphs = self.torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
                if library.endswith("-cg") and not graphs:
                    raise RuntimeError(
                        "torch.compile compiled no graph (Dynamo fell back to eager)"
                    )
                entry.loss0 = float(loss.detach())
                self.sync()
                rec["first_step_s"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                rec["spike_rates"] = [round(float(r), 4) for r in rates]
                for _ in range(self.settings["warmup"]):
                    loss = entry.step()
                self.sync()
                entry.est_ms = (time.perf_counter() - t0) * 1e3 / max(1, self.settings["warmup"])
                rec.update(loss0=entry.loss0, loss_after_warmup=float(loss.detach()))
                self.entries[key] = entry
            except Exception as exc:  # noqa: BLE001
                rec.update(status="n/a", reason=f"failed: {_describe(exc)}"[:600])
                rec["traceback"] = traceback.format_exc()[-2000:]
                self.entries[key] = rec["reason"]
                log(f"[{self.kind}] {key}: {rec['reason'][:300]}")
            rec["implementation"] = self.implementation(library, model)
            out.append(rec)
        return out

    def measure(self, cfg: dict[str, Any], entries: list[list[str]]) -> list[dict[str, Any]]:
        """One round: each prepared entry timed (events back to back, then wall)."""
        out = []
        for library, model in entries:
            entry = self.entries.get((cfg["network"], cfg["precision"], library, model))
            rec: dict[str, Any] = {"library": library, "model": model}
            if not isinstance(entry, Entry):
                out.append({**rec, "status": "n/a", "reason": entry or "not prepared"})
                continue
            try:
                rec.update(self._time(entry), status="ok")
            except Exception as exc:  # noqa: BLE001
                rec.update(status="error", reason=_describe(exc)[:600])
            out.append(rec)
        return out

    def _time(self, entry: Entry) -> dict[str, float]:
        s, torch = self.settings, self.torch
        n_steps = max(5, min(s["steps"], int(ROUND_CAP_MS / max(entry.est_ms, 1e-3))))
        n_steps = min(n_steps, s["steps"])
        for _ in range(min(2, s["warmup"])):
            entry.step()
        self.sync()
        gc_was = gc.isenabled()
        gc.disable()
        try:
            if self.cuda:
                event = torch.cuda.Event
                events = [(event(enable_timing=True), event(enable_timing=True))
                          for _ in range(n_steps)]  # fmt: skip
                for begin, end in events:
                    begin.record()
                    entry.step()
                    end.record()
                self.sync()
                steps = [begin.elapsed_time(end) for begin, end in events]
            walls = []
            for _ in range(max(3, min(s["wall_steps"], n_steps // 2))):
                self.sync()
                t0 = time.perf_counter()
                entry.step()
                self.sync()
                walls.append((time.perf_counter() - t0) * 1e3)
        finally:
            if gc_was:
                gc.enable()
        steps = steps if self.cuda else walls
        return {"step_ms": statistics.median(steps), "wall_ms": statistics.median(walls)}

    def drop(self, cfg: dict[str, Any]) -> None:
        """Free the entries of ``cfg`` (before the next configuration)."""
        for key in [k for k in self.entries if k[:2] == (cfg["network"], cfg["precision"])]:
            del self.entries[key]
        self.torch._dynamo.reset()  # the next configuration's compiled networks start afresh
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()


def _describe(exc: BaseException) -> str:
    """``Type: message``, and where it was raised when the message is empty."""
    text = str(exc).strip()
    if not text and exc.__traceback__ is not None:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        text = f"raised at {Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    return f"{type(exc).__name__}: {text}"


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def worker_main(kind: str, settings: dict[str, Any]) -> int:
    """A worker: one JSON request per stdin line, one marked JSON line per reply."""
    try:
        worker = Worker(kind, settings)
        _reply({"ready": worker.meta()})
    except Exception as exc:  # noqa: BLE001
        _reply({"error": f"{type(exc).__name__}: {exc}"[:1000]})
        return 2
    for line in sys.stdin:
        req = json.loads(line) if line.strip() else {}
        op = req.get("op")
        if op == "quit":
            return 0
        try:
            if op == "prepare":
                _reply({"records": worker.prepare(req["cfg"], req["entries"])})
            elif op == "measure":
                _reply({"records": worker.measure(req["cfg"], req["entries"])})
            elif op == "drop":
                worker.drop(req["cfg"])
                _reply({})
            else:
                _reply({"error": f"unknown op {op!r}"})
        except Exception as exc:  # noqa: BLE001
            _reply({"error": f"{type(exc).__name__}: {exc}"[:1000]})
    return 0


# --------------------------------------------------------------------------------------
# parent side: finding SpikingJelly, the worker processes, rounds, the results
# --------------------------------------------------------------------------------------


class WorkerDied(RuntimeError):
    """A worker exited, hung or could not start."""


def _install(wheel: Path, target: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--upgrade", "--target", str(target), str(wheel)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if proc.returncode:
        raise RuntimeError(f"pip could not install {wheel.name}: {proc.stderr[-400:]}")


def locate_sj(kind: str, args: argparse.Namespace) -> list[str]:
    """PYTHONPATH entries giving worker ``kind`` its SpikingJelly (``[]``: this Python's
    own); raises FileNotFoundError with the reason when it has none."""
    version = SJ_VERSION[kind]
    path = Path(args.sj014_path if kind == "sj014" else args.sj200_path)
    if (path / "spikingjelly").is_dir():  # run_gpu.sh puts loguru (2.0.0 needs it) in /tmp/site
        site = [] if kind == "sj014" or not Path("/tmp/site/loguru").is_dir() else ["/tmp/site"]
        return [str(path), *site]
    wheels = sorted(Path(args.wheels).glob(f"spikingjelly-{version}-*.whl"))
    if wheels:
        target = Path(tempfile.gettempdir(), f"snbench-e2e-sj-{version}")
        if not (target / "spikingjelly").is_dir():
            _install(wheels[0], target)
            for loguru in sorted(Path(args.wheels).glob("loguru-*.whl"))[:1]:
                _install(loguru, target)
        return [str(target)]
    from importlib import metadata

    found = None
    with contextlib.suppress(Exception):
        found = metadata.version("spikingjelly")
    if found == version or (kind == "sjtorch" and found):
        return []
    raise FileNotFoundError(
        f"SpikingJelly {version} not found: not under {path}, no wheel in {args.wheels}, "
        f"this Python has {found or 'none'} (pip install spikingjelly=={version})"
    )


class WorkerProc:
    """A long-lived worker process of one kind, answering one marked JSON line a request."""

    def __init__(self, kind: str, args: argparse.Namespace, settings: dict[str, Any]) -> None:
        self.kind, self.args, self.settings = kind, args, settings
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.meta: dict[str, Any] | None = None
        self.dead: str | None = None
        self.starts = 0

    def launch(self) -> None:
        """Start the process (without waiting for it: see :meth:`ready`)."""
        self.starts += 1
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if self.kind != "main":
            paths = [p for p in paths if "sj014" not in p and "sj200" not in p]
            paths[:0] = locate_sj(self.kind, self.args)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE), *paths])
        if self.kind == "sjtorch":
            for model in ALL_MODELS:
                env[f"SJ_{model.upper()}_CUDA_IMPLEMENTATION"] = "torch"
        cmd = [sys.executable, "-u", str(Path(__file__).resolve()), "--worker", self.kind,
               "--settings", json.dumps(self.settings)]  # fmt: skip
        self.lines = queue.Queue()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1, env=env, cwd=str(REPO))  # fmt: skip
        threading.Thread(target=self._read, args=(self.proc, self.lines), daemon=True).start()

    @staticmethod
    def _read(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(MARK):
                lines.put(line[len(MARK) :])
            else:
                sys.stderr.write(line)
        lines.put(None)

    def _next(self, timeout: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.stop(graceful=False)
            raise WorkerDied(f"worker {self.kind} gave no answer in {timeout:.0f} s") from None
        if line is None:
            code = self.proc.wait(timeout=10) if self.proc else None
            self.proc = None
            raise WorkerDied(f"worker {self.kind} exited (code {code})")
        return dict(json.loads(line))

    def ready(self, timeout: float) -> None:
        reply = self._next(timeout)
        if "error" in reply:
            self.stop(graceful=False)
            raise WorkerDied(f"worker {self.kind} could not start: {reply['error']}")
        self.meta = reply["ready"]

    def request(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.dead:
            raise WorkerDied(self.dead)
        if self.proc is None:  # it died before: one restart, then give up
            if self.starts >= 2:
                self.dead = f"worker {self.kind} died twice"
                raise WorkerDied(self.dead)
            self.launch()
            self.ready(timeout)
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            self.stop(graceful=False)
            raise WorkerDied(f"worker {self.kind}: pipe closed ({exc})") from None
        reply = self._next(timeout)
        if "error" in reply:
            raise WorkerDied(f"worker {self.kind}: {reply['error']}")
        return reply

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


def merge_rounds(recs: list[dict[str, Any]], prep: dict[str, Any]) -> dict[str, Any]:
    """One record from an entry's rounds: medians of the rounds' medians, rounds kept."""
    ok = [r for r in recs if r.get("status") == "ok"]
    out = {k: v for k, v in prep.items() if k != "status"}
    if not ok:
        bad = next((r for r in recs if r.get("reason")), prep)
        return {**out, "status": bad.get("status", "n/a"), "reason": bad.get("reason")}
    out.update(status="ok", rounds=len(ok))
    for key in ("step_ms", "wall_ms"):
        out[key] = statistics.median(r[key] for r in ok)
        out[f"rounds_{key}"] = [round(r[key], 4) for r in ok]
    if len(ok) < len(recs):
        out["rounds_failed"] = [r.get("reason") for r in recs if r.get("status") != "ok"]
    return out


def annotate(records: list[dict[str, Any]], dry_run: bool) -> None:
    """Added time over the floor, and the first-step loss checked against symneuron's."""
    by_cfg: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}
    for rec in records:
        by_cfg.setdefault((rec["network"], rec["precision"]), {})[
            (rec["library"], rec["model"])
        ] = rec
    for (_, precision), recs in by_cfg.items():
        for (library, model), rec in recs.items():
            rec["added_ms"] = rec["added_wall_ms"] = None
            floor = recs.get(("floor-cg" if library.endswith("-cg") else "floor", "-"), {})
            if rec.get("status") == "ok" and floor.get("status") == "ok" and library not in FLOORS:
                rec["added_ms"] = rec["step_ms"] - floor["step_ms"]
                rec["added_wall_ms"] = rec["wall_ms"] - floor["wall_ms"]
            ref = recs.get(("symneuron", model), {}).get("loss0")
            if library in (*FLOORS, "symneuron") or ref is None or rec.get("loss0") is None:
                continue
            rel = abs(rec["loss0"] - ref) / max(abs(ref), 1e-12)
            # compiled (-cg) numerics differ a little: a spike at the threshold may flip
            tol = 1e-2 if library.endswith("-cg") else 1e-3 if precision == "fp32" else 5e-2
            rec["loss0_relerr"] = rel
            rec["loss_check"] = f"check {'✓' if rel <= tol else '✗'} ({rel:.1e})"


class Bench:
    """The parent: plans the entries, drives the workers, keeps and writes the results."""

    def __init__(self, args: argparse.Namespace, settings: dict[str, Any]) -> None:
        self.args, self.settings = args, settings
        self.t0 = time.monotonic()
        self.workers: dict[str, WorkerProc] = {}
        self.worker_of = dict(WORKER_OF)
        self.unavailable: dict[str, str] = {}
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        meta = dict(date=now, argv=sys.argv[1:], host=platform.node(), dry_run=args.dry_run)
        self.results: dict[str, Any] = dict(schema=SCHEMA, complete=False, meta=meta,
                                            settings=settings, workers={}, records=[],
                                            stopped=[], events=[])  # fmt: skip

    def event(self, text: str) -> None:
        log(f"[e2e {time.monotonic() - self.t0:5.1f}s] {text}")
        self.results["events"].append(text[:1500])

    def skip_reason(self, library: str) -> str | None:
        """Why ``library`` is n/a before anything runs (None: it runs)."""
        if self.args.dry_run and library in ("sj-cupy", "sj-triton", "symneuron-cg", "floor-cg"):
            return "dry run on the CPU (needs CUDA)"
        return self.unavailable.get(self.worker_of[library])

    def start_workers(self) -> None:
        """Start every needed worker at once (imports overlap), then wait for each."""
        if "sj-torch" in self.settings["libraries"]:
            with contextlib.suppress(Exception):  # prefer SpikingJelly 0.0.0.0.14's backend='torch'
                locate_sj("sj014", self.args)
                self.worker_of["sj-torch"] = "sj014"
        needed = {
            self.worker_of[lib] for lib in self.settings["libraries"] if not self.skip_reason(lib)
        }
        kinds = [kind for kind in ["main", *SJ_VERSION] if kind in needed]
        for kind in kinds:
            w = self.workers[kind] = WorkerProc(kind, self.args, self.settings)
            try:
                w.launch()
            except Exception as exc:  # noqa: BLE001
                self.unavailable[kind] = f"{type(exc).__name__}: {exc}"[:600]
        for kind in kinds:
            if kind in self.unavailable:
                continue
            try:
                self.workers[kind].ready(self.args.request_timeout_s)
                meta = self.workers[kind].meta or {}
                self.results["workers"][kind] = meta
                self.event(f"worker {kind} ready: {meta.get('gpu')}, "
                           f"spikingjelly {meta.get('spikingjelly', '-')}")  # fmt: skip
            except WorkerDied as exc:
                self.unavailable[kind] = str(exc)[:600]
        for kind, why in self.unavailable.items():
            self.results["workers"][kind] = {"error": why}
            self.event(f"worker {kind} unavailable: {why}")
        main = self.results["workers"].get("main", {})
        self.results["meta"].update({k: v for k, v in main.items() if k != "worker"})

    def entries(self) -> list[tuple[str, str]]:
        libraries = self.settings["libraries"]
        out = [(lib, "-") for lib in FLOORS if lib in libraries]
        for model in self.settings["models"]:
            out += [(lib, model) for lib in libraries if lib not in FLOORS]
        return out

    def ask(self, kind: str, req: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            return list(self.workers[kind].request(req, self.args.request_timeout_s)["records"])
        except WorkerDied as exc:
            self.event(str(exc))
            return [{"library": lib, "model": m, "status": "error", "reason": str(exc)[:600]}
                    for lib, m in req["entries"]]  # fmt: skip

    def run_config(self, cfg: dict[str, str]) -> None:
        by_kind: dict[str, list[tuple[str, str]]] = {}
        for library, model in self.entries():
            why = self.skip_reason(library)
            if why:
                self.results["records"].append(
                    {**cfg, "library": library, "model": model, "status": "n/a", "reason": why}
                )
            else:
                by_kind.setdefault(self.worker_of[library], []).append((library, model))
        order = [k for k in ["main", *SJ_VERSION] if k in by_kind]
        prep: dict[tuple[str, str], dict[str, Any]] = {}
        for kind in order:  # build + warm up everything before any timing
            for rec in self.ask(kind, {"op": "prepare", "cfg": cfg, "entries": by_kind[kind]}):
                prep[(rec["library"], rec["model"])] = rec
        rounds: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in range(self.settings["rounds"]):
            for kind in order if r % 2 == 0 else order[::-1]:
                req = {"op": "measure", "cfg": cfg, "entries": by_kind[kind]}
                for rec in self.ask(kind, req):
                    rounds.setdefault((rec["library"], rec["model"]), []).append(rec)
        for kind in order:
            with contextlib.suppress(WorkerDied):
                self.workers[kind].request({"op": "drop", "cfg": cfg}, 60)
        for key, recs in rounds.items():
            rec = {**cfg, **merge_rounds(recs, prep.get(key, {}))}
            self.results["records"].append(rec)
            what = f"{rec['status']}: {str(rec.get('reason'))[:200]}"
            if rec["status"] == "ok":
                what = f"{rec['step_ms']:.2f} ms, wall {rec['wall_ms']:.2f} ms"
            self.event(f"{cfg['network']}/{cfg['precision']} {key[0]} {key[1]}: {what}")

    def run(self) -> dict[str, Any]:
        s = self.settings
        self.event(f"mode {s['mode']}: {s['networks']} x {s['precisions']}, models "
                   f"{s['models']}, libraries {s['libraries']}, {s['rounds']} rounds")  # fmt: skip
        try:
            self.start_workers()
            for network in s["networks"]:
                for precision in s["precisions"]:
                    cfg = {"network": network, "precision": precision}
                    if time.monotonic() - self.t0 > s["time_budget_s"]:
                        self.results["stopped"].append(
                            f"{network}/{precision} not run: time budget "
                            f"({s['time_budget_s']:.0f} s) spent")  # fmt: skip
                        continue
                    self.run_config(cfg)
            self.results["complete"] = not self.results["stopped"]
        except KeyboardInterrupt:
            self.results["stopped"].append("interrupted")
        finally:
            for w in self.workers.values():
                w.stop()
            annotate(self.results["records"], self.args.dry_run)
            self.results["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        return self.results


def write_outputs(results: dict[str, Any], args: argparse.Namespace) -> str:
    """JSON (--out), PNG (--plot), markdown (--md); returns the markdown."""
    for path in (args.out, args.md, args.plot):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    if args.plot:
        error = e2e_report.plot(results, args.plot)
        results["plot"] = error or str(args.plot)
        if error:
            log(f"[e2e] {error}")
    text = e2e_report.markdown(results)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1, default=str))
    if args.md:
        Path(args.md).write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with the internal ``--worker``, one worker process)."""
    args = build_parser().parse_args(argv)
    if args.worker:
        return worker_main(args.worker, json.loads(args.settings))
    results = Bench(args, resolve_settings(args)).run()
    text = write_outputs(results, args)
    log(f"[e2e] done in {results['elapsed_s']} s" + (f"; JSON {args.out}" if args.out else ""))
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
