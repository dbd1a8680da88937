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
  torch``; 0.0.0.0.14 with ``backend='torch'`` when that one is found).

Every neuron uses the same constants and the Sigmoid(alpha = 4) surrogate (``bench_neurons``),
every network starts from the same weights (seed 0) and sees the same batch, so the
first-step losses of one model agree across libraries (checked). Precisions: ``fp32``;
``fp16``: ``torch.autocast(float16)`` with a ``GradScaler``; ``bf16``: ``torch.autocast``.

Timing: each library runs in its own worker process (``core.Worker``); a configuration
(network, precision) is first built and warmed up in every worker (compilation lands
here), then measured ``--rounds`` times, the workers taking turns in alternating order.
Per round and entry: ``--steps`` steps back to back with CUDA events around each (the step
time of a training loop), then ``--wall-steps`` steps each timed with ``perf_counter``
between synchronizations (host time shows); medians, then the median of the rounds.
*added* = step time minus the floor's. A missing or failing peer is reported as n/a with
the reason; SpikingJelly is found by ``core.locate_sj``.

Examples::

    python3 benchmarks/bench_e2e.py --quick --out e2e.json --md e2e.md --plot e2e.png
    python3 benchmarks/bench_e2e.py --cudagraphs --precisions fp32,fp16,bf16 --out e2e.json
    python3 benchmarks/bench_e2e.py --dry-run            # CPU smoke test, tiny sizes
    python3 benchmarks/bench_e2e.py --report e2e.json --md e2e.md --plot e2e.png  # redo outputs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import core  # noqa: E402
import e2e_report  # noqa: E402
from core import Rec, WorkerDied, csv_list, locate_sj, log  # noqa: E402, F401  (locate_sj: tests)

SCHEMA = "symneuron-e2e/1"
ALL_NETWORKS = ["cnn", "mlp"]
ALL_PRECISIONS = ["fp32", "fp16", "bf16"]
ALL_MODELS = ["LIF", "PLIF", "Izhikevich"]
ALL_LIBRARIES = ["floor", "symneuron", "sj-cupy", "sj-triton", "sj-torch"]
#: library -> the worker process that runs it
#: (sj-torch runs in sj014, with backend='torch', when SpikingJelly 0.0.0.0.14 is found)
WORKER_OF = {"floor": "main", "floor-cg": "main", "symneuron": "main", "symneuron-cg": "main",
             "sj-cupy": "sj014", "sj-triton": "sj200", "sj-torch": "sjtorch"}  # fmt: skip
KINDS = ["main", "sj014", "sj200", "sjtorch"]
FLOORS = e2e_report.FLOORS
#: at most this much time per round and entry in the event-timed steps (slow peers)
ROUND_CAP_MS = 1500.0
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


def build_parser() -> argparse.ArgumentParser:
    p = core.parser(__doc__)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="short GPU run (about 2 minutes)")
    mode.add_argument("--dry-run", action="store_true", help="CPU smoke test, tiny sizes")
    mode.add_argument("--report", default=None, help="no run: the outputs of this JSON")
    p.add_argument("--out", default=None, help="JSON results (default: print only)")
    p.add_argument("--md", default=None, help="write the markdown section here too")
    p.add_argument("--plot", default=None, help="PNG: grouped bars of the added time")
    p.add_argument("--networks", type=csv_list(str, ALL_NETWORKS), default=ALL_NETWORKS)
    p.add_argument("--precisions", type=csv_list(str, ALL_PRECISIONS), default=None)
    p.add_argument("--models", type=csv_list(str, ALL_MODELS), default=None)
    p.add_argument("--libraries", type=csv_list(str, ALL_LIBRARIES), default=ALL_LIBRARIES)
    p.add_argument("--cudagraphs", action="store_true", help="also symneuron under "
                   "torch.compile(mode='reduce-overhead')")  # fmt: skip
    for flag in ("rounds", "steps", "wall-steps", "warmup"):
        p.add_argument(f"--{flag}", type=int, default=None)
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="start no configuration after this many seconds")  # fmt: skip
    p.add_argument("--request-timeout-s", type=float, default=300.0)
    p.add_argument("--sj014-path", default=os.environ.get("SJ014_PATH", "/tmp/sj014"))
    p.add_argument("--sj200-path", default=os.environ.get("SJ200_PATH", "/tmp/sj200"))
    p.add_argument("--wheels", default=str(core.REPO / ".whl"), help="SpikingJelly/loguru wheels")
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
    kw = {"backend": "cupy" if library == "sj-cupy" else "torch"}
    kw = kw if sj.version == "0.0.0.0.14" else {}
    return lambda shape: bn.sj_node(sj, model, **kw)


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
        self.forward, self.mark_step = self.net, None
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
        self.timer = core.Timer(self.device)
        self.sj = None
        if kind != "main":
            self.sj = core.SpikingJelly("0.0.0.0.14" if kind == "sj014" else "2.0.0")
        self.entries: dict[tuple[str, ...], Entry | str] = {}
        # every network of a configuration is compiled from the same code (--cudagraphs)
        for name in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 64)

    def meta(self) -> dict[str, Any]:
        out = {"worker": self.kind, "versions": core.versions(), **core.device_info(self.device)}
        if self.sj is not None:
            out.update(spikingjelly=self.sj.version, spikingjelly_file=self.sj.file)
        return out

    def implementation(self, library: str, model: str) -> str | None:
        if library == "sj-torch" and self.sj is not None:
            return f"SpikingJelly {self.sj.version}, torch"
        if library == "sj-cupy" or self.sj is None or not self.cuda:
            return None
        impl = self.sj.implementation(model, self.device)
        if self.sj.fallbacks:
            return "fell back to " + str(impl)
        return f"implementation: {impl}" if impl and not impl.startswith("unknown") else None

    def first_step(self, entry: Entry, library: str) -> Rec:
        """The first step (compilation lands here), then the warm-up steps."""
        stats = self.torch._dynamo.utils.counters["stats"]
        self.timer.sync()
        t0, graphs = time.perf_counter(), stats["unique_graphs"]
        with spike_rates(entry.net) as rates:
            loss = entry.step()
        if library.endswith("-cg") and stats["unique_graphs"] == graphs:
            raise RuntimeError("torch.compile compiled no graph (Dynamo fell back to eager)")
        entry.loss0 = float(loss.detach())
        self.timer.sync()
        rec: Rec = {"first_step_s": time.perf_counter() - t0}
        t0 = time.perf_counter()
        rec["spike_rates"] = [round(float(r), 4) for r in rates]
        for _ in range(self.settings["warmup"]):
            loss = entry.step()
        self.timer.sync()
        entry.est_ms = (time.perf_counter() - t0) * 1e3 / max(1, self.settings["warmup"])
        return {**rec, "loss0": entry.loss0, "loss_after_warmup": float(loss.detach())}

    def prepare(self, cfg: dict[str, Any], entries: list[list[str]]) -> list[Rec]:
        """Build each entry and run its warm-up steps."""
        out = []
        ctx = dict(cuda=self.cuda, device=self.device, dry_run=self.settings["dry_run"], sj=self.sj)
        for library, model in entries:
            key = (cfg["network"], cfg["precision"], library, model)
            rec: Rec = {"library": library, "model": model}
            if self.sj is not None:
                self.sj.clear()
            try:
                entry = Entry(library, model, cfg, ctx)
                rec.update(self.first_step(entry, library))
                self.entries[key] = entry
            except Exception as exc:  # noqa: BLE001
                rec.update(status="n/a", reason=f"failed: {_describe(exc)}"[:600])
                rec["traceback"] = traceback.format_exc()[-2000:]
                self.entries[key] = rec["reason"]
                log(f"[{self.kind}] {key}: {rec['reason'][:300]}")
            rec["implementation"] = self.implementation(library, model)
            out.append(rec)
        return out

    def measure(self, cfg: dict[str, Any], entries: list[list[str]]) -> list[Rec]:
        """One round: each prepared entry timed (events back to back, then wall)."""
        out = []
        for library, model in entries:
            entry = self.entries.get((cfg["network"], cfg["precision"], library, model))
            rec: Rec = {"library": library, "model": model}
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
        s = self.settings
        n_steps = max(5, min(s["steps"], int(ROUND_CAP_MS / max(entry.est_ms, 1e-3))))
        n_steps = min(n_steps, s["steps"])
        for _ in range(min(2, s["warmup"])):
            entry.step()
        self.timer.sync()
        with core.no_gc():
            steps = self.timer.events(lambda i: entry.step(), n_steps) if self.cuda else []
            walls = self.timer.wall(
                lambda i: entry.step(), max(3, min(s["wall_steps"], n_steps // 2))
            )
        steps = steps or walls
        return {
            "step_ms": statistics.median(steps) * 1e3,
            "wall_ms": statistics.median(walls) * 1e3,
        }

    def drop(self, cfg: dict[str, Any]) -> Rec:
        """Free the entries of ``cfg`` (before the next configuration)."""
        for key in [k for k in self.entries if k[:2] == (cfg["network"], cfg["precision"])]:
            del self.entries[key]
        self.torch._dynamo.reset()  # the next configuration's compiled networks start afresh
        import gc

        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()
        return {}


def _describe(exc: BaseException) -> str:
    """``Type: message``, and where it was raised when the message is empty."""
    text = str(exc).strip()
    if not text and exc.__traceback__ is not None:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        text = f"raised at {Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    return f"{type(exc).__name__}: {text}"


OPS = {
    "prepare": lambda w, req: {"records": w.prepare(req["cfg"], req["entries"])},
    "measure": lambda w, req: {"records": w.measure(req["cfg"], req["entries"])},
    "drop": lambda w, req: w.drop(req["cfg"]),
}


# --------------------------------------------------------------------------------------
# parent side: the worker processes, rounds, the results
# --------------------------------------------------------------------------------------


def merge_rounds(recs: list[Rec], prep: Rec) -> Rec:
    """One record from an entry's rounds: medians of the rounds' medians, rounds kept."""
    out = {k: v for k, v in prep.items() if k != "status"}
    if not any(r.get("status") == "ok" for r in recs):
        bad = next((r for r in recs if r.get("reason")), prep)
        return {**out, "status": bad.get("status", "n/a"), "reason": bad.get("reason")}
    merged = core.merge_rounds(recs, ("step_ms", "wall_ms"), digits=4)
    return {**out, **merged}


def annotate(records: list[Rec], dry_run: bool) -> None:
    """Added time over the floor, and the first-step loss checked against symneuron's."""
    by_cfg: dict[tuple[str, str], dict[tuple[str, str], Rec]] = {}
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
        self.workers: dict[str, core.Worker] = {}
        self.worker_of = dict(WORKER_OF)
        self.unavailable: dict[str, str] = {}
        meta = dict(date=core.now_iso(), argv=sys.argv[1:], host=platform.node(),
                    dry_run=args.dry_run)  # fmt: skip
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

    def launch(self, kind: str) -> None:
        env = core.worker_env([], drop=("sj014", "sj200"))
        if kind != "main":
            env = core.worker_env(locate_sj(kind, self.args), drop=("sj014", "sj200"))
        if kind == "sjtorch":
            for model in ALL_MODELS:
                env[f"SJ_{model.upper()}_CUDA_IMPLEMENTATION"] = "torch"
        argv = [str(Path(__file__).resolve()), "--worker", kind, "--settings",
                json.dumps(self.settings)]  # fmt: skip
        self.workers[kind] = core.Worker(kind, argv, env, max_failures=2)
        self.workers[kind].launch()

    def start_workers(self) -> None:
        """Start every needed worker at once (imports overlap), then wait for each."""
        if "sj-torch" in self.settings["libraries"]:
            with contextlib.suppress(Exception):  # prefer SpikingJelly 0.0.0.0.14's backend='torch'
                locate_sj("sj014", self.args)
                self.worker_of["sj-torch"] = "sj014"
        libraries = self.settings["libraries"]
        needed = {self.worker_of[lib] for lib in libraries if not self.skip_reason(lib)}
        kinds = [kind for kind in KINDS if kind in needed]
        for kind in kinds:
            try:
                self.launch(kind)
            except Exception as exc:  # noqa: BLE001
                self.unavailable[kind] = f"{type(exc).__name__}: {exc}"[:600]
        for kind in [k for k in kinds if k not in self.unavailable]:
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

    def ask(self, kind: str, req: dict[str, Any]) -> list[Rec]:
        try:
            reply = self.workers[kind].request(req, self.args.request_timeout_s)
            if "error" in reply:
                raise WorkerDied(f"worker {kind}: {reply['error']}")
            return list(reply["records"])
        except WorkerDied as exc:
            self.event(str(exc))
            return [{"library": lib, "model": m, "status": "error", "reason": str(exc)[:600]}
                    for lib, m in req["entries"]]  # fmt: skip

    def run_config(self, cfg: dict[str, str]) -> None:
        by_kind: dict[str, list[tuple[str, str]]] = {}
        for library, model in self.entries():
            why = self.skip_reason(library)
            if why:
                rec = {**cfg, "library": library, "model": model, "status": "n/a", "reason": why}
                self.results["records"].append(rec)
            else:
                by_kind.setdefault(self.worker_of[library], []).append((library, model))
        order = [k for k in KINDS if k in by_kind]
        prep: dict[tuple[str, str], Rec] = {}
        for kind in order:  # build + warm up everything before any timing
            for rec in self.ask(kind, {"op": "prepare", "cfg": cfg, "entries": by_kind[kind]}):
                prep[(rec["library"], rec["model"])] = rec
        rounds: dict[tuple[str, str], list[Rec]] = {}
        for kind in core.alternate(order, self.settings["rounds"]):
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
                    if time.monotonic() - self.t0 > s["time_budget_s"]:
                        self.results["stopped"].append(
                            f"{network}/{precision} not run: time budget "
                            f"({s['time_budget_s']:.0f} s) spent")  # fmt: skip
                        continue
                    self.run_config({"network": network, "precision": precision})
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
        core.write_json(Path(args.out), results)
    if args.md:
        Path(args.md).write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with the internal ``--worker``, one worker process)."""
    args = build_parser().parse_args(argv)
    if args.worker:
        return core.serve(lambda: Worker(args.worker, json.loads(args.settings)), OPS)
    if args.report:
        results = json.loads(Path(args.report).read_text())
        args.out = None
    else:
        results = Bench(args, resolve_settings(args)).run()
    text = write_outputs(results, args)
    log(f"[e2e] done in {results['elapsed_s']} s" + (f"; JSON {args.out}" if args.out else ""))
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
