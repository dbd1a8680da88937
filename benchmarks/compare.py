"""The parent of ``bench_neurons.py``'s peer comparison: plans the configurations, drives
the workers (``peers.py``), keeps the results and writes them (JSON, PNG, a short table).

The results file (``symneuron-bench/1``) holds ``meta`` (date, GPU, versions), ``settings``,
``copy`` (the copy bandwidth), ``records`` (one per configuration and peer), ``first_call``,
``derivation``, ``workers`` and ``events``; ``report.py`` turns it into the docs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import bench_neurons as bn
import core
from core import Rec, WorkerDied, log
from peers import CACHE_VARS, config_key

SCHEMA = "symneuron-bench/1"
PEER_WORKER = {"symneuron": "main", "torch": "main", "compile": "main"}
NOTES = [
    "N = 2^14: the whole working set fits in L2, so those figures are L2 bandwidth, "
    "not HBM; the floor fractions there can exceed 1.",
    "GPU time: CUDA events around each call, with a GPU sleep queued ahead of each "
    "batch so that host launch gaps are excluded where the host can run ahead.",
    "Wall time: synchronize, perf_counter, call (+ backward), synchronize; median.",
]


def resolve_matrix(args: argparse.Namespace) -> dict[str, list[Any]]:
    base: dict[str, list[Any]] = dict(
        models=bn.SINGLE_MODELS, T=bn.ALL_T, N=bn.ALL_N, dtypes=bn.ALL_DTYPES
    )
    base.update(bn.QUICK if args.quick else {})
    base.update(bn.DRY if args.dry_run else {})
    base.update(modes=bn.ALL_MODES, peers=bn.ALL_PEERS)
    return {k: getattr(args, k) or v for k, v in base.items()}


def plan_configs(matrix: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Most important first (fp32, then bf16, fp16; large N first); mode innermost so that
    a worker reuses inputs and reference across the two modes of one (model, T, N, dtype)."""
    drank = {d: i for i, d in enumerate(["fp32", "bf16", "fp16"])}
    return [
        dict(model=model, T=t, N=n, dtype=dtype, mode=mode)
        for dtype in sorted(matrix["dtypes"], key=lambda d: drank[d])
        for n in sorted(matrix["N"], reverse=True)
        for model in [m for m in bn.ALL_MODELS if m in matrix["models"]]
        for t in sorted(matrix["T"])
        for mode in [m for m in bn.ALL_MODES if m in matrix["modes"]]
    ]


def worker_env(kind: str, args: argparse.Namespace) -> dict[str, str]:
    """A worker's environment: the repository and only its own SpikingJelly on PYTHONPATH
    (raises FileNotFoundError when it has none)."""
    own = core.locate_sj(kind, args) if kind in core.SJ_VERSION else []
    env = core.worker_env(own, drop=("sj014", "sj200"))
    if args.dry_run:  # torch.compile's caches in a private TMPDIR (others may clean /tmp's)
        env["TMPDIR"] = str(Path(tempfile.gettempdir(), "snbench-dryrun-tmp"))
        Path(env["TMPDIR"]).mkdir(exist_ok=True)
    return env


def run_oneshot(argv: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """``bench_neurons.py --worker ...`` in a fresh process; its result file's contents."""
    fd, path = tempfile.mkstemp(suffix=".json", prefix="snbench-")
    os.close(fd)
    try:
        cmd = [sys.executable, "-u", str(bn.__file__), *argv, "--result-file", path]
        t0 = time.perf_counter()
        proc = subprocess.run(
            cmd, env=env, cwd=str(core.REPO), timeout=timeout, capture_output=True, text=True
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
    except Exception as exc:  # noqa: BLE001  (a timeout included)
        return {"error": core.short_error(exc)}
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def measure_derivation(args: argparse.Namespace, models: list[str]) -> dict[str, Any]:
    """One fresh process per model, a few side by side (CPU only, while the GPU is idle;
    each is single-threaded, and contention would inflate the figures)."""
    out: dict[str, Any] = {}
    env = worker_env("main", args)

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
    sj_models = ["LIF"] + [m for m in models if m in bn.STATEFUL_MODELS and m in bn.SJ_CLASSES]
    jobs = {"symneuron": models, "sj014": sj_models, "sj200": sj_models}
    base = Path(tempfile.mkdtemp(prefix="snbench-cache-"))
    try:
        for impl, impl_models in ((k, v) for k, v in jobs.items() if k in peers):
            try:
                env = worker_env(impl if impl != "symneuron" else "main", args)
            except FileNotFoundError as exc:
                out[impl] = {"error": str(exc)}
                continue
            for var in CACHE_VARS:
                env[var] = str(base / impl / var)
                Path(env[var]).mkdir(parents=True, exist_ok=True)
            out[impl] = {}
            argv = ["--worker", "firstcall", "--impl", impl, "--models", ",".join(impl_models)]
            argv += ["--settings", json.dumps(settings)]
            for phase in ("cold", "warm"):
                res = out[impl][phase] = run_oneshot(argv, env, 400)
                done = res.get("models", {})
                firsts = {m: round(r.get("first_s", math.nan), 4) for m, r in done.items()}
                log(f"[bench] first call {impl} ({phase}): {firsts} {res.get('error', '')[:300]}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


class Bench:
    """The comparison's parent: its workers, its results and the file they go to."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t_start = time.monotonic()
        self.matrix = resolve_matrix(args)
        self.configs = plan_configs(self.matrix)
        self.settings = bn.worker_settings(args)
        self.workers: dict[str, core.Worker] = {}
        self.path: Path | None = None
        dry_dir = Path(tempfile.gettempdir()) / "symneuron-bench-dryrun"
        self.out_dir = Path(args.out_dir or (dry_dir if args.dry_run else core.HERE / "results"))
        self.compile_spent = 0.0
        meta = dict(date=core.now_iso(), argv=sys.argv[1:], host=platform.node(),
                    dry_run=args.dry_run, matrix=self.matrix, notes=NOTES)  # fmt: skip
        self.results: dict[str, Any] = dict(
            schema=SCHEMA, complete=False, meta=meta, settings=self.settings, copy=None,
            workers={}, records=[], first_call={}, derivation={}, events=[],
        )  # fmt: skip

    def elapsed(self) -> float:
        return time.monotonic() - self.t_start

    def event(self, text: str) -> None:
        log(f"[bench] {text}")
        self.results["events"].append({"t_s": round(self.elapsed(), 1), "text": text[:1500]})

    def stop_workers(self) -> None:
        for w in self.workers.values():
            w.stop()

    def write(self) -> Path:
        import report

        if self.path is None:
            gpu = self.results["meta"].get("gpu") or "unknown"
            name = re.sub(r"[^A-Za-z0-9]+", "-", ("dryrun-" if self.args.dry_run else "") + gpu)
            stem = f"{name.strip('-')}-{core.now_iso()[:10]}"
            stem += f"-{self.args.tag}" if self.args.tag else ""
            self.path = self.out_dir / f"{stem}.json"
            if self.path.exists():
                self.path = self.out_dir / f"{stem}-{time.strftime('%H%M%S', time.gmtime())}.json"
        report.annotate(self.results)
        return core.write_json(self.path, self.results)

    def start(self, kind: str) -> core.Worker | None:
        """The worker ``kind``, started (with its meta recorded) if it was not; None when
        it cannot run."""
        w = self.workers.get(kind)
        if w is not None:
            return None if w.dead else w
        argv = [str(bn.__file__), "--worker", kind, "--settings", json.dumps(self.settings)]
        try:
            w = self.workers[kind] = core.Worker(kind, argv, worker_env(kind, self.args), 3)
            w.launch()
            w.ready(self.args.request_timeout_s)
            self.results["workers"][kind] = w.meta
        except (WorkerDied, FileNotFoundError) as exc:
            self.results["workers"][kind] = {"error": str(exc)[:1500]}
            self.event(f"worker {kind} failed to start: {exc}")
            w = self.workers.setdefault(kind, core.Worker(kind, [], {}, 1))
            w.dead = str(exc)
            return None
        return w

    def start_main(self) -> None:
        main = self.start("main")
        if main is None or main.meta is None:
            return
        self.results["meta"].update({k: v for k, v in main.meta.items() if k != "worker"})
        nbytes = int(64 * 2**20 if self.args.dry_run else self.args.copy_gib * 2**30)
        try:
            copy = main.request({"op": "copy", "bytes": nbytes}, self.args.request_timeout_s)
        except WorkerDied as exc:
            copy = {"error": str(exc)}
        self.results["copy"] = copy.get("copy") or {"error": copy.get("error")}
        bw = self.results["copy"].get("bandwidth_Bps") or math.nan
        gpu, driver = main.meta.get("gpu"), main.meta.get("driver")
        self.event(f"device {gpu} driver {driver}; copy floor {bw / 1e9:.0f} GB/s")

    def why_skip(self, cfg: dict[str, Any], peer: str) -> tuple[str, str] | None:
        """(status, reason) of a peer that does not run ``cfg``; None when it does."""
        if peer in ("sj014", "sj200") and cfg["model"] not in bn.SJ_CLASSES:
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

    def ask(self, kind: str, cfg: dict[str, Any], peers: list[str]) -> list[Rec]:
        """The worker's records for ``peers`` on ``cfg`` (errors when it cannot answer)."""
        try:
            w = self.start(kind)
            if w is None:
                raise WorkerDied(self.workers[kind].dead or f"worker {kind} not running")
            reply = w.request(
                {"op": "bench", "cfg": cfg, "peers": peers}, self.args.request_timeout_s
            )
            error = reply.get("error")
        except WorkerDied as exc:
            self.event(f"{config_key(cfg)}: {exc}")
            reply, error = {}, f"worker: {exc}"
        fail = [{**cfg, "peer": p, "status": "error", "error": error} for p in peers]
        return list(reply.get("records", fail))

    def run_config(self, cfg: dict[str, Any]) -> None:
        by_worker: dict[str, list[str]] = {}
        for peer in self.matrix["peers"]:
            skip = self.why_skip(cfg, peer)
            if skip:
                rec = {**cfg, "peer": peer, "status": skip[0], "error": skip[1]}
                self.results["records"].append(rec)
            else:
                by_worker.setdefault(PEER_WORKER.get(peer, peer), []).append(peer)
        order = [kind for kind in ("main", "sj014", "sj200") if kind in by_worker]
        per_peer: dict[str, list[Rec]] = {}
        for kind in core.alternate(order, self.args.rounds):
            for rec in self.ask(kind, cfg, by_worker[kind]):
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
        return self.finish()

    def finish(self) -> int:
        import report

        self.stop_workers()
        self.results["meta"]["elapsed_s"] = round(self.elapsed(), 1)
        path = self.write()
        log(f"[bench] wrote {path}")
        if not self.args.no_plot:
            try:
                log(f"[bench] wrote {report.plot(self.results, path.with_suffix('.png'))}")
            except Exception as exc:  # noqa: BLE001
                self.event(f"plot failed: {core.short_error(exc)}")
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


def merge_rounds(recs: list[Rec]) -> Rec:
    """One record from a peer's rounds of one configuration: the median of the rounds'
    medians (wall and GPU), the overall minima, the check passed only if every round's."""
    if len(recs) == 1:
        return dict(recs[0])
    out = core.merge_rounds(recs, ("wall_s", "gpu_s"))
    ok = [r for r in recs if r.get("status") == "ok"]
    if len(ok) > 1:
        for key, agg in (("wall_min_s", min), ("gpu_min_s", min), ("reps_wall", sum),
                         ("reps_gpu", sum)):  # fmt: skip
            out[key] = agg(r[key] for r in ok)
        passed = all((r.get("check") or {}).get("pass", True) for r in ok)
        out["check"] = dict(out.get("check") or {}, **{"pass": passed})
    return out


def main(args: argparse.Namespace) -> int:
    """Run the comparison; on SIGTERM or SIGINT, write the partial results first."""
    bench = Bench(args)

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
