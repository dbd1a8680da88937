#!/usr/bin/env python3
"""Compile time per zoo model and integration method: from the equations to the first step.

Each (model, method) runs in a fresh process with an empty kernel cache (``cold``), then
in another fresh process with that cache filled (``warm``). The cold process times, in
order: ``build`` (the constructor: discretisation, validation, the reported partials),
``derive`` (``neuron.spec()``: reverse accumulation and CSE), ``first step`` (the first
``sn.simulate`` on the cpu backend, float32, [4, 8] input: rendering and compiling the
forward kernel, then running it), ``first backward`` (a training call and ``backward()``:
the training forward and backward kernels), and ``generate`` (every cpu float32 kernel
variant as one source, whose size in characters is reported). *Time to first step* is
build + derive + first step, what a user waits for after ``import symneuron``. The warm
process times the build and the first step from the cache (*warm start*). ``--backend cuda``
times the CUDA kernels instead (NVRTC; the successor of ``bench_neurons.py``'s first-call
figures in ``docs/performance.md``).

    python benchmarks/compile_time.py                 # the whole zoo, every method
    python benchmarks/compile_time.py --quick         # small models (CI), fails over budget
    python benchmarks/compile_time.py --models HodgkinHuxley --methods rk4
    python benchmarks/compile_time.py --json out.json # also the raw records

A method a model does not accept (``exp_euler`` on an equation not linear in its own
variable) is left out; a discrete model (no ODE) has one row, method ``-``.
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: The models of ``--quick``: a discrete one and a small ODE system (every method).
QUICK = ("LIF", "IafPscExp")
METHODS = ("euler", "exp_euler", "rk2", "rk4")
#: Seconds a cold time to first step may take in ``--quick`` (issue 26: under 10 s).
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


def _run_child(model: str, method: str, backend: str, cache: str, warm: bool,
               timeout: float) -> dict[str, Any]:  # fmt: skip
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
    sys.path.insert(0, str(ROOT))
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


def _s(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def table(records: list[dict[str, Any]]) -> str:
    """The records as a markdown table (seconds; warm start in ms)."""
    head = (
        "| model | method | build | derive | first step | **to first step** | first backward "
        "| warm start | source (chars) | per stage |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    )
    rows = []
    for r in records:
        if not r.get("accepted"):
            continue
        if "to_first_step" not in r:
            why = f"timed out after {r['timeout']:.0f} s" if "timeout" in r else f"{r.get('error')}"
            rows.append(f"| {r['model']} | {r['method']} | {why} |||||||| ")
            continue
        warm = r.get("warm", {}).get("warm_start")
        per_stage = r["source_chars"] // max(1, _stage_count(r["method"]))
        rows.append(
            f"| {r['model']} | {r['method']} | {_s(r['build'])} | {_s(r['derive'])} "
            f"| {_s(r['first_step'])} | **{_s(r['to_first_step'])}** "
            f"| {_s(r['first_backward'])} | {'' if warm is None else f'{warm * 1e3:.0f} ms'} "
            f"| {r['source_chars']:,} | {per_stage:,} |"
        )
    return head + "\n".join(rows) + "\n"


def _stage_count(method: str) -> int:
    """Evaluations of the right-hand sides per step."""
    return {"rk2": 2, "rk4": 4}.get(method, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--models", help="comma-separated zoo names (default: the zoo)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated")
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
    sys.path.insert(0, str(ROOT))
    import symneuron as sn

    models = args.models.split(",") if args.models else list(sn.models.ZOO)
    models = list(QUICK) if args.quick else models
    records = []
    for model, method in cases(models, args.methods.split(",")):
        records.append(measure(model, method, args.backend, args.timeout))
        print(table(records[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(records))
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    slow = [
        r for r in records if r.get("accepted") and not r.get("to_first_step", 1e9) < args.budget
    ]
    if args.quick and slow:
        print(f"over {args.budget} s: {[(r['model'], r['method']) for r in slow]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
