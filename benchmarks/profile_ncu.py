#!/usr/bin/env python3
"""Hardware counters of the training kernels, per zoo model and dtype, with Nsight Compute.

Per dtype and chunk of models this runs ``ncu`` on a child process that makes, per model,
three training calls of ``sn.simulate`` (CUDA backend, ``store_v_seq=False``, L =
sum(spikes), the kernel benchmark's input) and profiles the third call's forward and
backward kernels (an NVTX range; the first two calls compile and warm up). Sections:
SpeedOfLight, Occupancy, LaunchStats and WarpStateStats, plus the DRAM bytes and issue-slot
use; clocks are left alone (``--clock-control none``).

Per kernel it prints the time, DRAM throughput (% of peak), DRAM bytes per element-step
against the floor's (``floor.py``), SM throughput, issue-slot use, achieved occupancy,
registers, and the top warp stall reasons (cycles per issued instruction), then writes the
raw CSV rows and a JSON summary to ``--out-dir``. A kernel whose DRAM throughput is near
peak is bound by memory; one whose issue slots are near full is bound by arithmetic; one
with neither, and long-scoreboard stalls on top, is bound by latency (too few bytes in
flight).

    python3 benchmarks/profile_ncu.py --models LIF,Izhikevich --dtypes fp32,bf16 --T 64
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _path in (str(REPO), str(HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import floor  # noqa: E402  (benchmarks/floor.py)
from bench_neurons import ALL_MODELS  # noqa: E402

SECTIONS = ["SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats"]
EXTRA_METRICS = [
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
]
KERNELS = "regex:_(forward|backward)_"
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
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"


def child(models: list[str], dtype: str, t_len: int, n: int) -> None:
    """Per model, three training calls; ncu profiles the third one's kernels (the NVTX
    range ``profile``)."""
    import torch
    from bench_neurons import bench_input, make_neuron

    import symneuron as sn

    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    for model in models:
        gen = torch.Generator(device="cuda").manual_seed(0)
        neuron = make_neuron(model)
        x = bench_input(model, (t_len, n), gen, "cuda").to(dt).requires_grad_(True)
        params = {k: torch.tensor(v, device="cuda", requires_grad=True)
                  for k, v in neuron.params.items() if k in neuron.learnable}  # fmt: skip
        for i in range(3):
            x.grad = None
            last = i == 2
            if last:  # the forward runs on this thread, the backward on autograd's: a
                # range on each (NVTX ranges are per thread), opened and closed by hooks
                torch.cuda.nvtx.range_push("profile")
            out = sn.simulate(neuron, x, params=params or None, backend="cuda", store_v_seq=False)
            if last:
                torch.cuda.nvtx.range_pop()
                out[0].register_hook(lambda g: _nvtx(torch, "push", g))
                x.register_hook(lambda g: _nvtx(torch, "pop", g))
            out[0].sum().backward()
        torch.cuda.synchronize()
        del x, out, params
    torch.cuda.synchronize()


def _nvtx(torch: Any, what: str, grad: Any) -> Any:
    """A gradient hook that opens or closes the NVTX range ``profile``; returns ``grad``."""
    if what == "push":
        torch.cuda.nvtx.range_push("profile")
    else:
        torch.cuda.nvtx.range_pop()
    return grad


def _float(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_raw(text: str) -> list[dict[str, Any]]:
    """ncu's ``--page raw --csv`` output: a header row, a units row, one row per kernel."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 3:
        return []
    header, units = rows[0], rows[1]
    return [
        {**dict(zip(header, row, strict=False)), "_units": dict(zip(header, units, strict=False))}
        for row in rows[2:]
    ]


def summarise(row: dict[str, Any], model: str, dtype: str, t_len: int, n: int) -> dict[str, Any]:
    name = row.get("Kernel Name", "?")
    out: dict[str, Any] = {"model": model, "dtype": dtype, "T": t_len, "N": n, "kernel": name}
    for key, col in COLUMNS.items():
        out[key] = _float(row.get(col, ""))
    to_us = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}
    if out["time_us"] is not None:
        out["time_us"] *= to_us.get(row["_units"].get(COLUMNS["time_us"], "nsecond"), 1e-3)
    to_b = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
    for key in ("read_b", "write_b"):
        if out[key] is not None:
            out[key] *= to_b.get(row["_units"].get(COLUMNS[key], "byte"), 1)
    stalls = {}
    for col, val in row.items():  # "_units" (a dict) matches neither end
        if col.startswith(STALL_PREFIX) and col.endswith(STALL_SUFFIX):
            v = _float(val)
            if v is not None:
                stalls[col[len(STALL_PREFIX) : -len(STALL_SUFFIX)]] = v
    out["stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1]))
    itemsize = floor.ITEMSIZE[dtype]
    mode = "forward" if "_forward_" in name else "backward"
    # L = sum(spikes): dL/dS is a stride-0 broadcast, not read (floor.py)
    tensors = floor.tensors(mode, floor.extra_states(model), grad_spike_read=False)
    out["floor_bytes_per_elem"] = tensors * itemsize
    if out["read_b"] is not None and out["write_b"] is not None:
        out["dram_bytes_per_elem"] = (out["read_b"] + out["write_b"]) / (t_len * n)
    return out


def read_csv(path: Path, t_len: int, n: int) -> list[dict[str, Any]]:
    """The summaries of a CSV file :func:`profile` wrote (``ncu-<models>-<dtype>-T<T>.csv``)."""
    dtype = path.stem.split("-")[-2]
    return summaries(parse_raw(path.read_text()), ALL_MODELS, dtype, t_len, n)


def summaries(rows: list[dict[str, Any]], models: list[str], dtype: str, t_len: int,
              n: int) -> list[dict[str, Any]]:  # fmt: skip
    """:func:`summarise` of each row, its model found from the kernel name's prefix."""
    names = kernel_models(models)
    out = []
    for row in rows:
        prefix = re.split(r"_(?:forward|backward)_", row.get("Kernel Name", "?"))[0]
        out.append(summarise(row, names.get(prefix, prefix), dtype, t_len, n))
    return out


def kernel_models(models: list[str]) -> dict[str, str]:
    """Kernel name prefix (the neuron's name) -> zoo model."""
    from bench_neurons import make_neuron

    return {make_neuron(m).name: m for m in models}


def profile(models: list[str], dtype: str, t_len: int, n: int, out_dir: Path,
            timeout: float) -> list[dict[str, Any]]:  # fmt: skip
    cmd = ["ncu", "--clock-control", "none", "--nvtx", "--nvtx-include", "profile/",
           "-k", KERNELS, "--csv", "--page", "raw"]  # fmt: skip
    for s in SECTIONS:
        cmd += ["--section", s]
    cmd += ["--metrics", ",".join(EXTRA_METRICS)]
    cmd += [sys.executable, __file__, "--child", ",".join(models), dtype, str(t_len), str(n)]
    tag = f"{models[0]}-{models[-1]}-{dtype}-T{t_len}"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"# {tag}: ncu ran past {timeout:.0f} s", flush=True)
        return []
    (out_dir / f"ncu-{tag}.csv").write_text(proc.stdout)
    rows = parse_raw(proc.stdout)
    if proc.returncode != 0 or len(rows) != 2 * len(models):
        tail = (proc.stderr or proc.stdout)[-600:]
        print(f"# {tag}: ncu rc={proc.returncode}, {len(rows)} rows\n{tail}", flush=True)
    return summaries(rows, models, dtype, t_len, n)


#: a kernel is bound by memory at this DRAM throughput (% of ncu's peak; the copy floor's
#: 3.0 TB/s is about 90 % of it), by arithmetic (issue slots) at this issue-slot use
MEMORY_PCT, ISSUE_PCT = 75.0, 60.0


def bound(r: dict[str, Any]) -> str:
    """What limits a kernel, from its counters: "memory" (DRAM near its practical peak),
    "arithmetic" (issue slots near full: the step's instructions), "latency" (neither,
    with loads outstanding: long-scoreboard stalls first; too few bytes in flight), or
    "mixed: <stall>" (neither, another stall first: ``wait``, a dependent instruction's
    fixed latency with too few warps to hide it; ``no_instruction``, instruction-cache
    misses of a long step)."""
    if (r.get("dram_pct") or 0) >= MEMORY_PCT:
        return "memory"
    if (r.get("issue_pct") or 0) >= ISSUE_PCT:
        return "arithmetic"
    first = next(iter(r.get("stalls") or {}), "")
    return "latency" if first == "long_scoreboard" else f"mixed: {first}"


def _fmt(v: Any, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def table(results: list[dict[str, Any]]) -> str:
    head = ("| model | dtype | kernel | µs | DRAM % | B/elem (floor) | SM % | issue % | occ % "
            "| regs | top stalls (cycles/issue) | bound |")  # fmt: skip
    lines = [head, "|" + " --- |" * 12]
    for r in results:
        kern = "fwd" if "_forward_" in r["kernel"] else "bwd"
        stalls = ", ".join(f"{k} {v:.1f}" for k, v in list(r["stalls"].items())[:3])
        bpe = f"{_fmt(r.get('dram_bytes_per_elem'), '.1f')} ({r['floor_bytes_per_elem']})"
        lines.append(
            f"| {r['model']} | {r['dtype']} | {kern} | {_fmt(r['time_us'], '.0f')} "
            f"| {_fmt(r['dram_pct'], '.0f')} | {bpe} | {_fmt(r['sm_pct'], '.0f')} "
            f"| {_fmt(r['issue_pct'], '.0f')} | {_fmt(r['occupancy_pct'], '.0f')} "
            f"| {_fmt(r['registers'], '.0f')} | {stalls} | {bound(r)} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="zoo", help="comma-separated, or zoo (all 20)")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--T", type=int, default=64)
    p.add_argument("--N", type=int, default=2**20)
    p.add_argument("--out-dir", default=os.environ.get("OUT", "."))
    p.add_argument("--chunk", type=int, default=5, help="models per ncu process")
    p.add_argument("--budget-s", type=float, default=480, help="stop starting chunks after")
    p.add_argument("--from-csv", nargs="+", default=None, metavar="CSV",
                   help="no profiling: the table of CSV files an earlier run wrote")  # fmt: skip
    p.add_argument("--child", nargs=4, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        models, dtype, t_len, n = args.child
        child(models.split(","), dtype, int(t_len), int(n))
        return
    if args.from_csv:
        rows = [r for path in args.from_csv for r in read_csv(Path(path), args.T, args.N)]
        print(table(rows))
        return
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    start = time.monotonic()
    models = ALL_MODELS if args.models == "zoo" else args.models.split(",")
    for dtype in args.dtypes.split(","):
        for i in range(0, len(models), args.chunk):
            left = args.budget_s - (time.monotonic() - start)
            if left < 30:
                print(f"# budget spent: {dtype} from {models[i]} on not profiled", flush=True)
                break
            results += profile(models[i : i + args.chunk], dtype, args.T, args.N, out_dir, left)
            (out_dir / "ncu-summary.json").write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
