#!/usr/bin/env python3
"""Hardware counters of the training kernels, per zoo model and dtype, with Nsight Compute.

Per dtype and chunk of models, ``ncu`` (``--clock-control none``) profiles a child process's
third training call per model (``sn.simulate``, CUDA backend, L = sum(spikes), the kernel
benchmark's input; an NVTX range): time, DRAM throughput and bytes per element against the
floor's (``floor.py``), SM throughput, issue slots, occupancy, registers, the top warp stalls,
and so each kernel's bound (:func:`bound`). Raw CSV rows and a JSON summary go to
``--out-dir``; ``--settings cuda_block=128,max_lanes=2`` sets ``symneuron.runtime.settings``.

    python3 benchmarks/profile_ncu.py --models LIF,Izhikevich --dtypes fp32,bf16 --T 64
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import core
import floor
from core import ALL_MODELS, bench_input, make_neuron

SECTIONS = ["SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats"]
METRICS = (
    "dram__bytes_read.sum,dram__bytes_write.sum,smsp__issue_active.avg.pct_of_peak_sustained_active"
)
COLUMNS = {
    "time_us": "gpu__time_duration.sum",
    "dram_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "issue_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "registers": "launch__registers_per_thread",
    "read_b": "dram__bytes_read.sum",
    "write_b": "dram__bytes_write.sum",
}
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")
#: column -> (unit -> factor to µs or bytes, the factor of a missing or unknown unit)
BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
SCALE = {
    "time_us": ({"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}, 1e-3),
    "read_b": (BYTES, 1),
    "write_b": (BYTES, 1),
}
#: a kernel is bound by memory at this DRAM throughput (% of ncu's peak; the copy floor's
#: 3.0 TB/s is about 90 % of it), by arithmetic (issue slots) at this issue-slot use
MEMORY_PCT, ISSUE_PCT = 75.0, 60.0


def child(models: list[str], dtype: str, t_len: int, n: int, settings: str) -> None:
    """Per model, three training calls; ncu profiles the third one's kernels (the NVTX
    range ``profile``: the forward runs on this thread, the backward on autograd's, so a
    range on each, opened and closed by gradient hooks)."""
    import torch

    import symneuron as sn
    from symneuron.runtime import settings as runtime

    for item in filter(None, settings.split(",")):
        name, value = item.split("=")
        setattr(runtime, name, None if value == "None" else int(value))
    nvtx = torch.cuda.nvtx
    for model in models:
        neuron, gen = make_neuron(model), torch.Generator(device="cuda").manual_seed(0)
        x = bench_input(model, (t_len, n), gen, "cuda").to(core.torch_dtype(dtype))
        x.requires_grad_(True)
        params = {
            k: torch.tensor(v, device="cuda", requires_grad=True)
            for k, v in neuron.params.items()
            if k in neuron.learnable
        }
        for i in range(3):
            x.grad = None
            if i == 2:
                nvtx.range_push("profile")
            out = sn.simulate(neuron, x, params=params or None, backend="cuda", store_v_seq=False)
            if i == 2:
                nvtx.range_pop()
                out[0].register_hook(lambda g: (nvtx.range_push("profile"), g)[1])
                x.register_hook(lambda g: (nvtx.range_pop(), g)[1])
            out[0].sum().backward()
        torch.cuda.synchronize()


def _float(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_raw(text: str) -> list[dict[str, Any]]:
    """ncu's ``--page raw --csv`` output: a header row, a units row, one row per kernel."""
    rows = list(
        csv.reader(io.StringIO("\n".join(ln for ln in text.splitlines() if ln.startswith('"'))))
    )
    if len(rows) < 3:
        return []
    units = dict(zip(rows[0], rows[1], strict=False))
    return [{**dict(zip(rows[0], row, strict=False)), "_units": units} for row in rows[2:]]


def summarise(row: dict[str, Any], model: str, dtype: str, t_len: int, n: int) -> dict[str, Any]:
    """One kernel's figures, stalls sorted by size, and its floor bytes per element."""
    name = row.get("Kernel Name", "?")
    out: dict[str, Any] = {"model": model, "dtype": dtype, "T": t_len, "N": n, "kernel": name}
    for key, col in COLUMNS.items():
        value, (units, other) = _float(row.get(col, "")), SCALE.get(key, ({}, 1.0))
        out[key] = None if value is None else value * units.get(row["_units"].get(col), other)
    stalls = {
        m.group(1): v
        for col, val in row.items()
        if (m := STALL.fullmatch(col)) and (v := _float(str(val))) is not None
    }
    out["stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1]))
    mode = "forward" if "_forward_" in name else "backward"
    # L = sum(spikes): dL/dS is a stride-0 broadcast, not read (floor.py)
    tensors = floor.tensors(mode, floor.extra_states(model), grad_spike_read=False)
    out["floor_bytes_per_elem"] = tensors * floor.ITEMSIZE[dtype]
    if out["read_b"] is not None and out["write_b"] is not None:
        out["dram_bytes_per_elem"] = (out["read_b"] + out["write_b"]) / (t_len * n)
    return out


def read_csv(path: Path, t_len: int, n: int) -> list[dict[str, Any]]:
    """The summaries of a CSV file :func:`profile` wrote (``ncu-<models>-<dtype>-T<T>.csv``)."""
    return summaries(parse_raw(path.read_text()), ALL_MODELS, path.stem.split("-")[-2], t_len, n)


def summaries(
    rows: list[dict[str, Any]], models: list[str], dtype: str, t_len: int, n: int
) -> list[dict[str, Any]]:
    """:func:`summarise` of each row, its model found from the kernel name's prefix."""
    names = {make_neuron(m).name: m for m in models}
    prefix = [re.split(r"_(?:forward|backward)_", r.get("Kernel Name", "?"))[0] for r in rows]
    return [
        summarise(r, names.get(p, p), dtype, t_len, n) for r, p in zip(rows, prefix, strict=True)
    ]


def profile(
    models: list[str], dtype: str, args: argparse.Namespace, timeout: float
) -> list[dict[str, Any]]:
    """ncu on :func:`child`; its CSV written to ``--out-dir``, its summaries returned."""
    cmd = [
        "ncu",
        "--clock-control",
        "none",
        "--nvtx",
        "--nvtx-include",
        "profile/",
        "-k",
        "regex:_(forward|backward)_",
        "--csv",
        "--page",
        "raw",
        "--metrics",
        METRICS,
    ]
    cmd += [a for s in SECTIONS for a in ("--section", s)] + [sys.executable, __file__, "--child"]
    cmd += [",".join(models), dtype, str(args.T), str(args.N), args.settings]
    tag = f"{models[0]}-{models[-1]}-{dtype}-T{args.T}"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"# {tag}: ncu ran past {timeout:.0f} s", flush=True)
        return []
    (Path(args.out_dir) / f"ncu-{tag}.csv").write_text(proc.stdout)
    rows = parse_raw(proc.stdout)
    if proc.returncode != 0 or len(rows) != 2 * len(models):
        tail = (proc.stderr or proc.stdout)[-600:]
        print(f"# {tag}: ncu rc={proc.returncode}, {len(rows)} rows\n{tail}", flush=True)
    return summaries(rows, models, dtype, args.T, args.N)


def bound(r: dict[str, Any]) -> str:
    """What limits a kernel: "memory" (DRAM near its practical peak), "arithmetic" (issue
    slots near full), "latency" (neither, long-scoreboard stalls first: too few bytes in
    flight), or "mixed: <stall>" (neither, another stall first: ``wait``, a dependent
    instruction's latency with too few warps; ``no_instruction``, instruction-cache misses)."""
    if (r.get("dram_pct") or 0) >= MEMORY_PCT:
        return "memory"
    if (r.get("issue_pct") or 0) >= ISSUE_PCT:
        return "arithmetic"
    first = next(iter(r.get("stalls") or {}), "")
    return "latency" if first == "long_scoreboard" else f"mixed: {first}"


def table(results: list[dict[str, Any]]) -> str:
    def f(v: Any, spec: str = ".0f") -> str:
        return "—" if v is None else format(v, spec)

    rows = [
        [
            r["model"],
            r["dtype"],
            "fwd" if "_forward_" in r["kernel"] else "bwd",
            f(r["time_us"]),
            f(r["dram_pct"]),
            f"{f(r.get('dram_bytes_per_elem'), '.1f')} ({r['floor_bytes_per_elem']})",
            *(f(r[k]) for k in ("sm_pct", "issue_pct", "occupancy_pct", "registers")),
            ", ".join(f"{k} {v:.1f}" for k, v in list(r["stalls"].items())[:3]),
            bound(r),
        ]
        for r in results
    ]
    head = ["model", "dtype", "kernel", "µs", "DRAM %", "B/elem (floor)", "SM %", "issue %"]
    return core.md_table([*head, "occ %", "regs", "top stalls (cycles/issue)", "bound"], rows)


def main() -> None:
    p = core.parser(__doc__, "--dtypes", "--T", "--N")
    p.add_argument("--models", default="zoo", help="comma-separated, or zoo (all 20)")
    p.add_argument("--settings", default="", help="symneuron.runtime.settings, e.g. cuda_block=128")
    p.add_argument("--out-dir", default=os.environ.get("OUT", "."))
    p.add_argument("--chunk", type=int, default=5, help="models per ncu process")
    p.add_argument("--budget-s", type=float, default=480, help="stop starting chunks after")
    p.add_argument(
        "--from-csv",
        nargs="+",
        default=None,
        metavar="CSV",
        help="no profiling: the table of CSV files an earlier run wrote",
    )
    p.add_argument("--child", nargs=5, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        models, dtype, t_len, n, settings = args.child
        child(models.split(","), dtype, int(t_len), int(n), settings)
    elif args.from_csv:
        print(table([r for path in args.from_csv for r in read_csv(Path(path), args.T, args.N)]))
    else:
        run(args)


def run(args: argparse.Namespace) -> None:
    """Profile every chunk of models in every dtype, until ``--budget-s`` is spent."""
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    start, models = time.monotonic(), ALL_MODELS if args.models == "zoo" else args.models.split(",")
    for dtype in args.dtypes:
        for i in range(0, len(models), args.chunk):
            left = args.budget_s - (time.monotonic() - start)
            if left < 30:
                print(f"# budget spent: {dtype} from {models[i]} on not profiled", flush=True)
                break
            results += profile(models[i : i + args.chunk], dtype, args, left)
            core.write_json(Path(args.out_dir) / "ncu-summary.json", results)

    print(table(results))


if __name__ == "__main__":
    main()
