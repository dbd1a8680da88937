#!/usr/bin/env python3
"""Compile time per zoo model and integration method: from the equations to the first step.

Each (model, method) runs in a fresh process with an empty kernel cache (``cold``: build,
derive, first step, first backward, generate), then in another with that cache filled
(``warm start``); what each column times: ``docs/compile_time.md``. ``--backend cuda``
times the CUDA kernels (NVRTC). A method a model does not accept is left out; a discrete
model has one row, method ``-``.

    python benchmarks/compile_time.py                 # the whole zoo, every method
    python benchmarks/compile_time.py --quick         # small models (CI), fails over budget
    python benchmarks/compile_time.py --models HodgkinHuxley --methods rk4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import core

ROOT = core.REPO
#: The models of ``--quick``: a discrete one and a small ODE system (every method).
QUICK = ("LIF", "IafPscExp")
METHODS = ("euler", "exp_euler", "rk2", "rk4")
#: Seconds a cold time to first step may take in ``--quick`` (under 10 s).
BUDGET = 10.0


def _child(model: str, method: str, backend: str, warm: bool) -> dict[str, Any]:
    """Time one model and method in this (fresh) process; the kernel cache is the caller's."""
    t0 = time.perf_counter()
    import torch

    import symneuron as sn

    out: dict[str, Any] = {"import": time.perf_counter() - t0}
    if backend == "cuda":
        torch.zeros(1, device="cuda")  # CUDA's own start, not the model's

    def simulate(x: Any) -> Any:
        result = sn.simulate(neuron, x, backend=backend)
        if backend == "cuda":
            torch.cuda.synchronize()
        return result

    ctor = sn.models.ZOO[model]
    t = time.perf_counter()
    try:
        neuron = ctor() if method == "-" else ctor(method=method)
    except ValueError as exc:  # exp_euler on a nonlinear equation
        return {"accepted": False, "why": str(exc)}
    out["build"] = time.perf_counter() - t
    x = torch.rand(4, 8, generator=torch.Generator().manual_seed(0)).to(backend)
    if warm:
        t = time.perf_counter()
        simulate(x)
        return {**out, "accepted": True, "warm_start": time.perf_counter() - t}
    t = time.perf_counter()
    neuron.spec()
    out["derive"] = time.perf_counter() - t
    t = time.perf_counter()
    simulate(x)
    out["first_step"] = time.perf_counter() - t
    t = time.perf_counter()
    result = simulate(x.clone().requires_grad_())
    (result[0].sum() + result[1].sum()).backward()
    if backend == "cuda":
        torch.cuda.synchronize()
    out["first_backward"] = time.perf_counter() - t
    t = time.perf_counter()
    out["source_chars"] = len(neuron.source(backend, "float32"))
    out["generate"] = time.perf_counter() - t
    out["stages"] = len(getattr(neuron, "stages", ()))
    out["to_first_step"] = out["build"] + out["derive"] + out["first_step"]
    return {**out, "accepted": True}


def _run_child(
    model: str, method: str, backend: str, cache: str, warm: bool, timeout: float
) -> dict[str, Any]:
    env = {**os.environ, "SYMNEURON_CACHE": cache, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, __file__, "--one", model, method, backend] + ["--warm"] * warm
    t = time.perf_counter()
    try:
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"accepted": True, "timeout": timeout}
    if proc.returncode != 0:
        return {"accepted": True, "error": proc.stderr.strip().splitlines()[-1:]}
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    record["process"] = time.perf_counter() - t
    return record


def cases(models: list[str], methods: list[str]) -> list[tuple[str, str]]:
    """(model, method) pairs: every method for an ODE model, ``-`` for a discrete one."""
    import symneuron as sn

    out = []
    for model in models:
        is_ode = sn.models.ZOO[model]().ode is not None
        out += [(model, m) for m in methods] if is_ode else [(model, "-")]
    return out


def measure(model: str, method: str, backend: str, timeout: float) -> dict[str, Any]:
    """The cold and warm records of one model and method, each in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="symneuron-cache-") as cache:
        cold = _run_child(model, method, backend, cache, False, timeout)
        if not cold.get("accepted") or "to_first_step" not in cold:
            return {"model": model, "method": method, **cold}
        warm = _run_child(model, method, backend, cache, True, timeout)
    return {"model": model, "method": method, **cold, "warm": warm}


def table(records: list[dict[str, Any]]) -> str:
    """The records as a markdown table (seconds; warm start in ms; source per stage: per
    evaluation of the right-hand sides)."""
    rows = []
    for r in (r for r in records if r.get("accepted")):
        if "to_first_step" not in r:
            why = f"timed out after {r['timeout']:.0f} s" if "timeout" in r else f"{r.get('error')}"
            rows.append([r["model"], r["method"], why, *[""] * 7])
            continue
        warm = r.get("warm", {}).get("warm_start")
        per_stage = r["source_chars"] // {"rk2": 2, "rk4": 4}.get(r["method"], 1)
        times = [f"{r[k]:.2f}" for k in ("build", "derive", "first_step", "to_first_step")]
        rows.append(
            [
                r["model"],
                r["method"],
                *times[:3],
                f"**{times[3]}**",
                f"{r['first_backward']:.2f}",
                "" if warm is None else f"{warm * 1e3:.0f} ms",
                f"{r['source_chars']:,}",
                f"{per_stage:,}",
            ]
        )
    head = ["model", "method", "build", "derive", "first step", "**to first step**"]
    head += ["first backward", "warm start", "source (chars)", "per stage"]
    return core.md_table(head, rows, "ll" + "r" * 8) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = core.parser(__doc__)
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--models", type=core.csv_list(), help="zoo names (default: the zoo)")
    parser.add_argument("--methods", type=core.csv_list(str, METHODS), default=METHODS)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per process")
    parser.add_argument("--budget", type=float, default=BUDGET, help="--quick's limit, s")
    parser.add_argument("--json", type=Path, help="write the raw records here")
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_child(*args.one, warm=args.warm)))
        return 0
    import symneuron as sn

    models = list(QUICK) if args.quick else args.models or list(sn.models.ZOO)
    records = []
    for model, method in cases(models, args.methods):
        records.append(measure(model, method, args.backend, args.timeout))
        print(table(records[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(records))
    if args.json:
        core.write_json(args.json, records)
    slow = [
        r for r in records if r.get("accepted") and not r.get("to_first_step", 1e9) < args.budget
    ]

    if args.quick and slow:
        print(f"over {args.budget} s: {[(r['model'], r['method']) for r in slow]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
