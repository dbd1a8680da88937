#!/usr/bin/env python3
"""symneuron's kernel benchmark: each configuration (model, T, N, dtype, mode) of the matrix,
every peer (symneuron, SpikingJelly 0.0.0.0.14 CuPy and 2.0.0, symneuron's torch reference)
checked against the float64 reference, then timed (wall and GPU) against
the copy floor (``floor.py``). Workers: ``peers.py``; report: ``report.py``; how to run and
what each mode measured: ``benchmarks/NOTES.md``.

    python3 benchmarks/bench_neurons.py --quick            # --dry-run: a CPU smoke test
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import core  # noqa: E402
from core import ALL_MODELS, SINGLE_MODELS, SJ_CLASSES, Rec, csv_list, log, parse_n  # noqa: E402

ALL_T, ALL_N = [4, 16, 64, 256], [2**20, 2**14]
ALL_DTYPES, ALL_MODES = ["fp32", "fp16", "bf16"], ["inference", "training"]
ALL_PEERS = ["symneuron", "sj014", "sj200", "torch"]
QUICK = dict(models=["LIF", "PLIF", "QIF"], T=[4, 16, 64], N=ALL_N, dtypes=["fp32", "bf16"])
DRY = dict(models=["LIF", "PLIF"], T=[4, 8], N=[2**8, 2**10], dtypes=["fp32", "bf16"])
#: SpikingJelly's class of each model, and the constants it takes from the zoo's params
SCHEMA = "symneuron-bench/1"
WORKER_OF = {"symneuron": "main", "torch": "main"}  # others: their own
NOTES = [
    "N = 2^14: the whole working set fits in L2, so those figures are L2 bandwidth, "
    "not HBM; the floor fractions there can exceed 1.",
    "GPU time: CUDA events around each call, with a GPU sleep queued ahead of each "
    "batch so that host launch gaps are excluded where the host can run ahead.",
    "Wall time: synchronize, perf_counter, call (+ backward), synchronize; median.",
]

#: the workers' settings besides ``--target-ms`` (recorded in the results): repetitions per
#: measurement, warm-up calls after the first (checked) one, input copies of about
#: rotate_mb MiB in all (L2 defeat); fp32 passes with at most fp32_max_mismatch of the spikes
#: differing from the float64 reference (threshold ties flip a few per 10^7), 16-bit with at
#: least half_min_match equal; dL/dX compared on grad_slice neurons
SETTINGS = dict(
    min_reps=5,
    max_reps=200,
    warmup=2,
    rotate_mb=256.0,
    max_bufs=8,
    fp32_max_mismatch=1e-5,
    half_min_match=0.99,
    grad_slice=4096,
)


# fmt: off
def build_parser() -> argparse.ArgumentParser:
    p = core.parser(__doc__, "--dry-run")
    g = p.add_argument_group("matrix")
    g.add_argument("--models", type=_models, default=None,
                   help=",".join(ALL_MODELS) + f", or zoo: all (default {','.join(SINGLE_MODELS)})")
    g.add_argument("--T", type=csv_list(int), default=None, help="e.g. 4,16,64,256")
    g.add_argument("--N", type=csv_list(parse_n), default=None, help="e.g. 2^20,2^14 (or 20,14)")
    g.add_argument("--dtypes", type=csv_list(str, ALL_DTYPES, core.DTYPE_ALIASES), default=None,
                   help="fp32,fp16,bf16 (float32, float16, bfloat16 accepted)")
    g.add_argument("--modes", type=csv_list(str, ALL_MODES), default=None, help=",".join(ALL_MODES))
    g.add_argument("--peers", type=csv_list(str, ALL_PEERS), default=None, help=",".join(ALL_PEERS))
    g.add_argument("--quick", action="store_true", help=f"{QUICK} (explicit filters win)")
    g = p.add_argument_group("paths")
    g.add_argument("--out-dir", default=None, help="default benchmarks/results (dry run: temp)")
    g.add_argument("--wheels", **core.FLAGS["--wheels"])
    g.add_argument("--tag", default="", help="appended to the result file name")
    g = p.add_argument_group("run")
    g.add_argument("--target-ms", type=float, default=50.0, help="time per measurement")
    g.add_argument("--rounds", type=int, default=1, help="measure each configuration this many "
                   "times, peers taking turns in alternating order; median of the rounds")
    g.add_argument("--time-budget-s", type=float, default=450.0,
                   help="stop starting new configurations after this many seconds")
    return p
# fmt: on


def _models(text: str) -> list[str]:
    """``--models``: names from :data:`ALL_MODELS`, or ``zoo`` for all of them."""
    return list(ALL_MODELS) if text.strip() == "zoo" else csv_list(str, ALL_MODELS)(text)


def worker_settings(args: argparse.Namespace) -> dict[str, Any]:
    out = dict(dry_run=args.dry_run, target_ms=args.target_ms, **SETTINGS)
    return {**out, **(dict(rotate_mb=1.0) if args.dry_run else {})}


# ----------------------------------------------------------------------- the parent


def plan_configs(args: argparse.Namespace) -> tuple[dict[str, list[Any]], list[dict[str, Any]]]:
    """The matrix, and its configurations most important first (fp32, then bf16, fp16; large
    N first); mode innermost, so that a worker reuses inputs and reference across modes."""
    base: dict[str, list[Any]] = dict(models=SINGLE_MODELS, T=ALL_T, N=ALL_N, dtypes=ALL_DTYPES)
    base.update({**(QUICK if args.quick else {}), **(DRY if args.dry_run else {})})
    base.update(modes=ALL_MODES, peers=ALL_PEERS)
    matrix = {k: getattr(args, k) or v for k, v in base.items()}
    drank = {d: i for i, d in enumerate(["fp32", "bf16", "fp16"])}
    return matrix, [
        dict(model=model, T=t, N=n, dtype=dtype, mode=mode)
        for dtype in sorted(matrix["dtypes"], key=lambda d: drank[d])
        for n in sorted(matrix["N"], reverse=True)
        for model in [m for m in ALL_MODELS if m in matrix["models"]]
        for t in sorted(matrix["T"])
        for mode in [m for m in ALL_MODES if m in matrix["modes"]]
    ]


def config_key(cfg: dict[str, Any]) -> str:
    return f"{cfg['model']}/T{cfg['T']}/N{cfg['N']}/{cfg['dtype']}/{cfg['mode']}"


class Bench(core.Parent):
    """The comparison's parent: the matrix, its workers, its results and their file."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args, SCHEMA, worker_settings(args))
        self.matrix, self.configs = plan_configs(args)
        self.rounds, self.medians = args.rounds, ("wall_s", "gpu_s")
        self.results["meta"].update(matrix=self.matrix, notes=NOTES)
        self.results["copy"] = None
        dry_dir = Path(tempfile.gettempdir()) / "symneuron-bench-dryrun"
        self.out_dir = Path(args.out_dir or (dry_dir if args.dry_run else core.HERE / "results"))
        self.path: Path | None = None

    def write(self) -> None:
        import report

        if self.path is None:
            gpu, dry = self.results["meta"].get("gpu") or "unknown", self.args.dry_run
            suffix = f"-{core.now_iso()[:10]}" + (self.args.tag and "-" + self.args.tag)
            self.path = core.result_path(self.out_dir, gpu, "dryrun-" * dry, suffix, unique=True)
        report.annotate(self.results)
        core.write_json(self.path, self.results)

    def copy_bandwidth(self) -> None:
        nbytes = 64 * 2**20 if self.args.dry_run else 2**30
        got = (self.ask("main", {"op": "copy", "bytes": nbytes}) or [{}])[0]
        self.results["copy"] = (
            got if "bandwidth_Bps" in got else {"error": self.workers["main"].dead}
        )
        bw, meta = got.get("bandwidth_Bps") or math.nan, self.results["meta"]
        self.event(
            f"device {meta.get('gpu')} driver {meta.get('driver')}; copy floor {bw / 1e9:.0f} GB/s"
        )

    def run_config(self, cfg: dict[str, Any]) -> None:
        t0, by_kind = time.monotonic(), {}
        for peer in self.matrix["peers"]:
            if peer in ("sj014", "sj200") and cfg["model"] not in SJ_CLASSES:
                why = f"SpikingJelly has no {cfg['model']} neuron"
                self.results["records"].append(
                    {**cfg, "peer": peer, "status": "unsupported", "error": why}
                )
            else:
                by_kind.setdefault(WORKER_OF.get(peer, peer), []).append(peer)
        jobs = {k: by_kind[k] for k in ("main", "sj014", "sj200") if k in by_kind}
        for peer, rec in self.measure(cfg, jobs).items():
            del rec["name"]
            self.results["records"].append({**cfg, "peer": peer, **rec})
        mine = [r for r in self.results["records"] if all(r.get(k) == v for k, v in cfg.items())]
        log(
            f"[bench] {config_key(cfg)} {time.monotonic() - t0:.1f} s (elapsed "
            f"{self.elapsed():.0f} s) " + " ".join(f"{r['peer']}={_brief(r)}" for r in mine)
        )

    def over_budget(self, left: list[Any]) -> None:
        skipped = dict(status="skipped", error="time budget spent")
        self.results["records"] += [
            {**c, "peer": p, **skipped} for c in left for p in self.matrix["peers"]
        ]

    def main(self) -> int:
        args = self.args
        self.event(
            f"{len(self.configs)} configurations x {len(self.matrix['peers'])} peers; "
            f"budget {args.time_budget_s:.0f} s"
        )
        kinds = {WORKER_OF.get(p, p) for p in self.matrix["peers"]}
        import peers

        self.start([k for k in ("main", "sj014", "sj200") if k in kinds], peers.WorkerState)
        if "main" in kinds:
            self.copy_bandwidth()
        self.write()
        self.run(self.configs, self.run_config, args.time_budget_s)
        return self.finish()

    def finish(self) -> int:
        import report

        self.write()
        log(f"[bench] wrote {self.path}")
        if self.path is not None:
            try:
                log(f"[bench] wrote {report.plot(self.results, self.path.with_suffix('.png'))}")
            except Exception as exc:  # noqa: BLE001
                self.event(f"plot failed: {core.short_error(exc)}")
                self.write()
        print(report.short_table(self.results), flush=True)
        return 0


def _brief(rec: Rec) -> str:
    """``wall/GPU`` µs of an ok record (``!``: its check failed), else its status."""
    if rec.get("status") != "ok":
        return str(rec.get("status"))
    mark = "" if rec.get("check", {}).get("pass") else "!"
    return f"{rec['wall_s'] * 1e6:.0f}/{rec['gpu_s'] * 1e6:.0f}us{mark}"


def main(argv: list[str] | None = None) -> int:
    return Bench(build_parser().parse_args(argv)).main()


if __name__ == "__main__":
    sys.exit(main())
