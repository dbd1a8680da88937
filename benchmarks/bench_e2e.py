#!/usr/bin/env python3
"""End-to-end benchmark: whole SGD training steps of the CIFAR-sized CNN and the SHD-sized MLP
of ``networks.py`` with each library's neurons (``floor``: nn.ReLU; symneuron, also under CUDA
graphs with ``--cudagraphs``; SpikingJelly 0.0.0.0.14 CuPy, 2.0.0 Triton, its torch backend),
same weights and batch everywhere, each library in its own worker; *added* = step time minus
the floor's. What a step and a round are: ``benchmarks/NOTES.md``; the section and the plot:
``report.e2e_markdown``/``e2e_plot``.

    python3 benchmarks/bench_e2e.py --quick --out e2e.json --md e2e.md --plot e2e.png
    python3 benchmarks/bench_e2e.py --report e2e.json --md e2e.md   # redo the outputs
    python3 benchmarks/bench_e2e.py --dry-run                       # CPU smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import core  # noqa: E402
import report  # noqa: E402
from core import Rec, csv_list, locate_sj, log  # noqa: E402, F401  (locate_sj: tests)

ALL_NETWORKS, ALL_PRECISIONS = ["cnn", "mlp"], ["fp32", "fp16", "bf16"]
ALL_MODELS = ["LIF", "PLIF", "Izhikevich"]
ALL_LIBRARIES = ["floor", "symneuron", "sj-cupy", "sj-triton", "sj-torch"]
#: library -> the worker process that runs it (sj-torch: sj014, with backend='torch', when
#: SpikingJelly 0.0.0.0.14 is found)
WORKER_OF = {
    "floor": "main",
    "floor-cg": "main",
    "symneuron": "main",
    "symneuron-cg": "main",
    "sj-cupy": "sj014",
    "sj-triton": "sj200",
    "sj-torch": "sjtorch",
}
KINDS = ["main", "sj014", "sj200", "sjtorch"]
FLOORS = report.E2E_FLOORS
ROUND_CAP_MS = 1500.0  # at most this much time per round and entry in the event-timed steps
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
    "full": dict(
        models=ALL_MODELS,
        precisions=["fp32", "fp16"],
        rounds=5,
        steps=40,
        wall_steps=20,
        warmup=10,
        time_budget_s=1500.0,
    ),
    "quick": dict(
        models=["LIF", "PLIF"],
        precisions=["fp32", "fp16"],
        rounds=3,
        steps=20,
        wall_steps=10,
        warmup=5,
        time_budget_s=170.0,
    ),
    "dry": dict(
        models=["LIF", "PLIF"],
        precisions=["fp32", "bf16"],
        rounds=1,
        steps=2,
        wall_steps=2,
        warmup=1,
        time_budget_s=120.0,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    p = core.parser(__doc__, "--wheels")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="short GPU run (about 2 minutes)")
    mode.add_argument("--dry-run", **core.FLAGS["--dry-run"])
    mode.add_argument("--report", default=None, help="no run: the outputs of this JSON")
    p.add_argument("--out", default=None, help="JSON results (default: print only)")
    p.add_argument("--md", default=None, help="write the markdown section here too")
    p.add_argument("--plot", default=None, help="PNG: grouped bars of the added time")
    p.add_argument("--networks", type=csv_list(str, ALL_NETWORKS), default=ALL_NETWORKS)
    p.add_argument("--precisions", type=csv_list(str, ALL_PRECISIONS), default=None)
    p.add_argument("--models", type=csv_list(str, ALL_MODELS), default=None)
    p.add_argument("--libraries", type=csv_list(str, ALL_LIBRARIES), default=ALL_LIBRARIES)
    p.add_argument(
        "--cudagraphs",
        action="store_true",
        help="also symneuron under torch.compile(mode='reduce-overhead')",
    )
    for flag in ("rounds", "steps", "wall-steps", "warmup"):
        p.add_argument(f"--{flag}", type=int, default=None)
    p.add_argument(
        "--time-budget-s",
        type=float,
        default=None,
        help="start no configuration after this many seconds",
    )
    return p


def resolve_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings: the mode's defaults, overridden by explicit flags."""
    mode = "dry" if args.dry_run else "quick" if args.quick else "full"
    out = dict(MODES[mode], mode=mode, dry_run=args.dry_run, networks=args.networks)
    for key in ("models", "precisions", "rounds", "steps", "wall_steps", "warmup", "time_budget_s"):
        if getattr(args, key) is not None:
            out[key] = getattr(args, key)
    libraries = list(args.libraries)
    for base in ("symneuron", "floor") if args.cudagraphs and "symneuron" in libraries else ():
        if base in libraries:
            libraries.insert(libraries.index(base) + 1, f"{base}-cg")
    return {**out, "libraries": libraries}


# ------------------------------------------------- worker side (torch is imported here only)


def neuron_factory(library: str, model: str, ctx: dict[str, Any]) -> Any:
    """Per-sample shape -> a neuron module of ``library`` (the floor: nn.ReLU)."""
    import networks

    if library in FLOORS:
        return networks.relu
    if library in ("symneuron", "symneuron-cg"):
        backend = "cuda" if ctx["cuda"] else "auto" if ctx["precision"] == "fp32" else "torch"
        return networks.symneuron_neurons(
            model, backend=backend, **core.MODEL_KWARGS.get(model, {})
        )
    sj = ctx["sj"]
    kw = {"backend": "cupy" if library == "sj-cupy" else "torch"}
    kw = kw if sj.version == "0.0.0.0.14" else {}
    return lambda shape: core.sj_node(sj, model, **kw)


class Entry:
    """One network of one (library, model, network, precision) with its optimizer, batch
    and step function."""

    def __init__(self, library: str, model: str, cfg: dict[str, Any], ctx: dict[str, Any]):
        import networks
        import torch

        torch.manual_seed(0)  # the same weights for every library
        size, device = DRY if ctx["dry_run"] else FULL, ctx["device"]
        build = {"cnn": networks.cifar_cnn, "mlp": networks.shd_mlp}[cfg["network"]]
        factory = neuron_factory(library, model, {**ctx, "precision": cfg["precision"]})
        self.net = build(factory, **size[cfg["network"]]).to(device)
        gen = torch.Generator().manual_seed(0)
        self.x, self.y = networks.synthetic_batch(
            cfg["network"], size["batch"], gen, device=device, **size["data"][cfg["network"]]
        )
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.01, momentum=0.9)
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg["precision"])
        self.autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
        self.scaler = torch.amp.GradScaler(device.type, enabled=cfg["precision"] == "fp16")
        self.forward, self.mark_step = self.net, None
        if library.endswith("-cg"):
            self.forward = torch.compile(self.net, mode="reduce-overhead")
            self.mark_step = torch.compiler.cudagraph_mark_step_begin
        self.loss0: float | None = None
        self.est_ms = 0.0  # a step's wall time after the warm-up (sizes the measurements)

    def step(self) -> Any:
        from torch.nn import functional as F  # noqa: N812

        if self.mark_step is not None:
            self.mark_step()
        self.opt.zero_grad(set_to_none=True)
        self.net.reset()
        with self.autocast:
            loss = F.cross_entropy(self.forward(self.x).float(), self.y)
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


class Worker(core.WorkerBase):
    """A worker process: builds and times entries ``library/model`` of a configuration."""

    def __init__(self, kind: str, settings: dict[str, Any]) -> None:
        super().__init__(kind, settings)
        for name in ("cache_size_limit", "recompile_limit"):  # one config's nets: same code
            if hasattr(self.torch._dynamo.config, name):
                setattr(self.torch._dynamo.config, name, 64)

    def implementation(self, library: str, model: str) -> str | None:
        if library == "sj-torch" and self.sj is not None:
            return f"SpikingJelly {self.sj.version}, torch"
        if library == "sj-cupy" or self.sj is None or not self.cuda:
            return None
        impl = self.sj.implementation(model, self.device)
        if self.sj.fallbacks:
            return "fell back to " + str(impl)
        return f"implementation: {impl}" if impl and not impl.startswith("unknown") else None

    def build(self, cfg: dict[str, Any], name: str, rec: Rec) -> Entry:
        """The entry, its first step (compilation lands here), then its warm-up steps."""
        library, model = name.split("/")
        ctx = dict(cuda=self.cuda, device=self.device, dry_run=self.settings["dry_run"], sj=self.sj)
        entry = Entry(library, model, cfg, ctx)
        stats = self.torch._dynamo.utils.counters["stats"]
        self.timer.sync()
        t0, graphs = time.perf_counter(), stats["unique_graphs"]
        with spike_rates(entry.net) as rates:
            loss = entry.step()
        if library.endswith("-cg") and stats["unique_graphs"] == graphs:
            raise RuntimeError("torch.compile compiled no graph (Dynamo fell back to eager)")
        entry.loss0 = float(loss.detach())
        self.timer.sync()
        rec["first_step_s"] = time.perf_counter() - t0
        rec["spike_rates"] = [round(float(r), 4) for r in rates]
        t0 = time.perf_counter()
        for _ in range(self.settings["warmup"]):
            loss = entry.step()
        self.timer.sync()
        entry.est_ms = (time.perf_counter() - t0) * 1e3 / max(1, self.settings["warmup"])
        rec.update(loss0=entry.loss0, loss_after_warmup=float(loss.detach()))
        rec["implementation"] = self.implementation(library, model)
        return entry

    def time(self, entry: Entry) -> Rec:
        """One round: ``steps`` steps back to back between CUDA events, then wall-timed ones."""
        s = self.settings
        n_steps = min(s["steps"], max(5, int(ROUND_CAP_MS / max(entry.est_ms, 1e-3))))
        for _ in range(min(2, s["warmup"])):
            entry.step()
        steps = self.timer.events(lambda i: entry.step(), n_steps) if self.cuda else []
        walls = self.timer.wall(lambda i: entry.step(), max(3, min(s["wall_steps"], n_steps // 2)))
        return dict(
            step_ms=statistics.median(steps or walls) * 1e3, wall_ms=statistics.median(walls) * 1e3
        )

    def status_of(self, exc: BaseException) -> str:
        return "n/a"  # a failure while building; one while timing is an error (run_config)

    def op_drop(self, req: Rec) -> Rec:
        self.torch._dynamo.reset()  # the next configuration's compiled networks start afresh
        return super().op_drop(req)


# -------------------------------------------------- parent side: workers, rounds, results


def annotate(records: list[Rec]) -> None:
    """Added time over the floor, and the first-step loss checked against symneuron's."""
    by_cfg: dict[tuple[str, str], dict[tuple[str, str], Rec]] = {}
    for rec in records:
        key = (rec["network"], rec["precision"])
        by_cfg.setdefault(key, {})[(rec["library"], rec["model"])] = rec
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


class Bench(core.Parent):
    """The parent: plans the entries, drives the workers, keeps the results."""

    max_failures = 2

    def __init__(self, args: argparse.Namespace, settings: dict[str, Any]) -> None:
        super().__init__(args, "symneuron-e2e/1", settings)
        self.worker_of = dict(WORKER_OF)
        self.rounds, self.medians, self.digits = settings["rounds"], ("step_ms", "wall_ms"), 4
        self.results["stopped"] = []

    def env(self, kind: str) -> tuple[list[str], dict[str, str]]:
        paths, env = super().env(kind)
        for model in ALL_MODELS if kind == "sjtorch" else ():
            env[f"SJ_{model.upper()}_CUDA_IMPLEMENTATION"] = "torch"
        return paths, env

    def skip_reason(self, library: str) -> str | None:
        """Why ``library`` is n/a before anything runs (None: it runs)."""
        if self.args.dry_run and library in ("sj-cupy", "sj-triton", "symneuron-cg", "floor-cg"):
            return "dry run on the CPU (needs CUDA)"
        worker = self.workers.get(self.worker_of[library])
        return worker.dead if worker is not None and worker.dead else None

    def entries(self) -> list[tuple[str, str]]:
        libraries = self.settings["libraries"]
        out = [(lib, "-") for lib in FLOORS if lib in libraries]
        for model in self.settings["models"]:
            out += [(lib, model) for lib in libraries if lib not in FLOORS]
        return out

    def run_config(self, cfg: dict[str, str]) -> None:
        jobs: dict[str, list[str]] = {}
        for library, model in self.entries():
            why = self.skip_reason(library)
            if why:
                rec = {**cfg, "library": library, "model": model, "status": "n/a", "reason": why}
                self.results["records"].append(rec)
            else:
                jobs.setdefault(self.worker_of[library], []).append(f"{library}/{model}")
        for name, rec in self.measure(cfg, {k: jobs[k] for k in KINDS if k in jobs}).items():
            library, model = name.split("/")
            if "error" in rec:  # n/a: it failed to build; error: to run
                rec["reason"] = ("failed: " if rec["status"] == "n/a" else "") + rec.pop("error")
            rec = {**cfg, "library": library, "model": model, **rec}
            del rec["name"]
            self.results["records"].append(rec)
            what = f"{rec['status']}: {str(rec.get('reason'))[:200]}"
            if rec["status"] == "ok":
                what = f"{rec['step_ms']:.2f} ms, wall {rec['wall_ms']:.2f} ms"
            self.event(f"{cfg['network']}/{cfg['precision']} {library} {model}: {what}")

    def write(self) -> None:  # the partial results (the outputs come at the end)
        if self.args.out:
            core.write_json(Path(self.args.out), self.results)

    def over_budget(self, left: list[Any]) -> None:
        budget = self.settings["time_budget_s"]
        self.results["stopped"] += [
            f"{c['network']}/{c['precision']} not run: time budget ({budget:.0f} s) spent"
            for c in left
        ]

    def main(self) -> dict[str, Any]:
        s = self.settings
        self.event(
            f"mode {s['mode']}: {s['networks']} x {s['precisions']}, models "
            f"{s['models']}, libraries {s['libraries']}, {s['rounds']} rounds"
        )
        if "sj-torch" in s["libraries"]:
            with contextlib.suppress(Exception):  # prefer SpikingJelly 0.0.0.0.14's backend='torch'
                locate_sj("sj014", Path(self.args.wheels))
                self.worker_of["sj-torch"] = "sj014"
        needed = {self.worker_of[lib] for lib in s["libraries"] if not self.skip_reason(lib)}
        self.start([kind for kind in KINDS if kind in needed], Worker)
        configs = [dict(network=n, precision=p) for n in s["networks"] for p in s["precisions"]]
        self.run(configs, self.run_config, s["time_budget_s"])
        annotate(self.results["records"])

        return self.results


def write_outputs(results: dict[str, Any], args: argparse.Namespace) -> str:
    """JSON (--out), PNG (--plot), markdown (--md); returns the markdown."""
    for path in (args.out, args.md, args.plot):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    if args.plot:
        error = report.e2e_plot(results, args.plot)
        results["plot"] = error or str(args.plot)
        if error:
            log(f"[e2e] {error}")
    text = report.e2e_markdown(results)
    if args.out:
        core.write_json(Path(args.out), results)
    if args.md:
        Path(args.md).write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, or (``--report``) redo the outputs of a saved JSON."""
    args = build_parser().parse_args(argv)
    if args.report:
        results = json.loads(Path(args.report).read_text())
        args.out = None
    else:
        results = Bench(args, resolve_settings(args)).main()
    text = write_outputs(results, args)
    log(f"[e2e] done in {results['elapsed_s']} s" + (f"; JSON {args.out}" if args.out else ""))
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
