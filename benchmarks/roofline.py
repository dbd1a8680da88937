#!/usr/bin/env python3
"""A static roofline estimate (no GPU): is each zoo model's training bound by memory or
by arithmetic on an H100?

::

    python3 benchmarks/roofline.py                        # fp32, bf16 and fp16: the table
    python3 benchmarks/roofline.py --dtypes bf16 --models LIF,EIF --json roofline.json

The two kernels of a training call at K = 1 (``<name>_forward_h_last_k1``,
``<name>_backward_none_k1``) are rendered as the runtime renders them and compiled by NVRTC
to PTX for sm_90. Per element-step (one neuron, one t) of each kernel's time loop this
counts *instr* (instructions issued, in SASS terms: :data:`SASS_PER_PTX`; on the zoo's 120
training kernels this estimate was 7 % above nvdisasm's exact SASS count on average),
*MUFU* (special-function ops, and the reciprocal inside each IEEE ``div.rn``/``sqrt.rn``),
*IEEE* (those divisions and square roots) and *bytes* (global loads and stores).

The t loop is unrolled (8 steps a main loop, a remainder loop of one): a loop's unroll
factor is its global stores over the fewest any loop has, and the count follows the *fast
path*, the longest path through the body that touches no local memory, does no fp64
arithmetic, calls nothing and enters no inner loop (the rare paths of ``sinf`` or of a
removable singularity are left out). The backward's loop exists twice (dL/dS a tensor, or
a broadcast scalar as after ``spikes.sum()``); ``--grad-spike`` picks one.

The H100 model (:data:`H100`): copy bandwidth 3.0e12 B/s (read + written); 132 SMs x 4
schedulers x 32 threads x 1.98 GHz = 3.35e13 thread-instructions/s; MUFU 16 ops/clock/SM.
A kernel's time is the largest of bytes / bandwidth, instr / issue rate and MUFU / MUFU rate;
*frac* is the floor model's time (``floor.bytes_per_element``) over the predicted time,
*serial* the same with no overlap (memory plus the larger arithmetic term): a measured
fraction should fall between the two. Latency (a serial recurrence per thread), occupancy,
cache effects and launch overhead are not modelled; :data:`MEASURED` is for comparison only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import core  # noqa: E402, F401  (the repository's symneuron on the path)
import floor  # noqa: E402  (benchmarks/floor.py: the one floor model)


@dataclass(frozen=True)
class Machine:
    """The throughput figures of one GPU that the roofline uses."""

    name: str
    copy_bandwidth: float  # B/s, read + written
    sms: int
    schedulers_per_sm: int  # each issues one warp-instruction per clock
    clock_hz: float
    mufu_per_clock_per_sm: int
    warp: int = 32

    @property
    def issue_rate(self) -> float:
        """Thread-instructions issued per second, the whole GPU."""
        return self.sms * self.schedulers_per_sm * self.warp * self.clock_hz

    @property
    def mufu_rate(self) -> float:
        """Special-function ops (per thread) per second, the whole GPU."""
        return self.sms * self.mufu_per_clock_per_sm * self.clock_hz


H100 = Machine("H100 SXM (estimate)", 3.0e12, 132, 4, 1.98e9, 16)

#: Floor fractions the benchmark measured on an H100 at T = 64 (N = 2^20): training,
#: 16-bit for all (Izhikevich's against a floor counting one [T, N] tensor fewer than
#: its own), and LIF fp32. For comparison only.
MEASURED: dict[tuple[str, str], float] = {
    ("IF", "bf16"): 0.90,
    ("LIF", "bf16"): 0.82,
    ("QIF", "bf16"): 0.77,
    ("PLIF", "bf16"): 0.66,
    ("EIF", "bf16"): 0.65,
    ("Izhikevich", "bf16"): 0.51,
    ("LIF", "fp32"): 0.91,
}

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
NVRTC_OPTIONS = ("-arch=sm_90", "-std=c++17")  # the runtime's options on an H100
#: PTX instruction -> SASS instructions on its fast path (nvdisasm 13.5, sm_90); any other
#: instruction is one, those of :data:`FREE_PTX` none
SASS_PER_PTX = {
    "div.rn.f32": 10,  # MUFU.RCP, FCHK, 5 FFMA, BRA to the slow path, BSSY/BSYNC
    "rcp.rn.f32": 10,
    "sqrt.rn.f32": 10,
    "div.full.f32": 8,
    "ex2.approx.f32": 4,  # without .ftz: denormal scaling around the MUFU
    "lg2.approx.f32": 4,
    "rsqrt.approx.f32": 4,
    "sqrt.approx.f32": 4,
    "rcp.approx.f32": 7,
    "sin.approx.f32": 2,
    "cos.approx.f32": 2,
    "sin.approx.ftz.f32": 2,
    "cos.approx.ftz.f32": 2,
    "add.s64": 2,  # IADD3 + IADD3.X
    "sub.s64": 2,
}
#: PTX instructions that issue nothing of their own in SASS: register copies and immediates,
#: the zero-extension of a 16-bit register (folded into the shift that widens a bf16)
FREE_PTX = ("mov.", "cvt.u32.u16")
MUFU_PTX = (
    "ex2.approx",
    "lg2.approx",
    "rcp.approx",
    "rsqrt.approx",
    "sqrt.approx",
    "sin.approx",
    "cos.approx",
    "tanh.approx",
)
IEEE_PTX = ("div.rn.f32", "rcp.rn.f32", "sqrt.rn.f32", "div.rn.f64", "rcp.rn.f64")
_WIDTH = {"8": 1, "16": 2, "32": 4, "64": 8, "128": 16}


@dataclass(frozen=True)
class Instr:
    """One instruction, reduced to what the count needs."""

    op: str
    target: str | None = None  # a branch's label
    conditional: bool = False  # a branch that can fall through
    issued: int = 1  # SASS instructions it issues on its fast path
    mufu: int = 0
    ieee: int = 0
    loads: int = 0  # global bytes
    stores: int = 0
    slow: bool = False  # local memory, fp64 or a call: off the fast path
    ends: bool = False  # ret / exit


Item = str | Instr  # a label or an instruction


# --------------------------------------------------------------------------------------
# parsing PTX
# --------------------------------------------------------------------------------------

_PTX_LINE = re.compile(r"^\s*(@!?%p\d+\s+)?([a-z][\w.]*)\s*([^;]*);")


def _bytes(op: str) -> int:
    """Bytes a PTX ``ld``/``st`` moves: element width times the vector count."""
    parts = op.split(".")
    width = next(_WIDTH[p[1:]] for p in reversed(parts) if p[1:] in _WIDTH)
    vec = next((int(p[1:]) for p in parts if p in ("v2", "v4", "v8")), 1)
    return width * vec


def _ptx_instr(guard: str | None, op: str, operands: str) -> Instr:
    issued = 0 if op.startswith(FREE_PTX) else SASS_PER_PTX.get(op, 1)
    ieee = int(op in IEEE_PTX)
    mufu = int(op.startswith(MUFU_PTX)) + ieee
    glob = ".global." in f"{op}."
    return Instr(
        op,
        target=operands.split()[-1].rstrip(";") if op.startswith("bra") else None,
        conditional=bool(guard),
        issued=issued,
        mufu=mufu,
        ieee=ieee,
        loads=_bytes(op) if glob and op.startswith("ld.") else 0,
        stores=_bytes(op) if glob and op.startswith("st.") else 0,
        slow=".local." in f"{op}." or op.startswith("call") or ".f64" in op,
        ends=op in ("ret", "exit"),
    )


def parse_ptx(ptx: str) -> list[Item]:
    """The labels and instructions of a PTX module, in order (directives dropped)."""
    items: list[Item] = []
    for line in ptx.splitlines():
        line = line.split("//")[0].strip()
        if re.fullmatch(r"\$\w+:", line):
            items.append(line[:-1])
            continue
        m = _PTX_LINE.match(line)
        if m and not line.startswith("."):
            items.append(_ptx_instr(m.group(1), m.group(2), m.group(3)))
    return items


# --------------------------------------------------------------------------------------
# the time loop and its fast path
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """Counts per element-step of one kernel (one neuron, one t)."""

    issued: float
    mufu: float
    ieee: float
    loads: float  # global bytes read
    stores: float  # global bytes written
    unroll: int  # steps in the loop the counts come from

    @property
    def bytes(self) -> float:
        """Global bytes read and written."""
        return self.loads + self.stores


def _loops(items: Sequence[Item]) -> list[tuple[int, int]]:
    """(label index, back-branch index) of every loop."""
    where = {item: i for i, item in enumerate(items) if isinstance(item, str)}
    return [
        (where[item.target], j)
        for j, item in enumerate(items)
        if isinstance(item, Instr) and item.target in where and where[item.target] < j
    ]


def _blocks(items: Sequence[Item], start: int, end: int) -> list[tuple[int, int]]:
    """Basic blocks of items[start:end + 1] as (first, last) indices."""
    blocks, first = [], start
    for i in range(start, end + 1):
        item = items[i]
        if isinstance(item, str) and i > first:
            blocks.append((first, i - 1))
            first = i
        elif isinstance(item, Instr) and (item.target or item.ends):
            blocks.append((first, i))
            first = i + 1
    if first <= end:
        blocks.append((first, end))
    return blocks


def _fast_path(
    items: Sequence[Item], loop: tuple[int, int], inner: list[tuple[int, int]]
) -> list[Instr]:
    """The instructions of the longest path (in issued instructions) from the loop's label
    to its back-branch that touches no local memory, does no fp64 arithmetic, makes no call
    and enters no inner loop."""
    start, end = loop
    header = items[start]
    blocks = _blocks(items, start, end)
    first_of = {items[a]: k for k, (a, _) in enumerate(blocks) if isinstance(items[a], str)}
    bodies = [[it for it in items[a : b + 1] if isinstance(it, Instr)] for a, b in blocks]
    usable = [
        not any(s <= a and b <= e for s, e in inner) and not any(i.slow for i in body)
        for (a, b), body in zip(blocks, bodies, strict=True)
    ]
    best: dict[int, tuple[int, list[Instr]]] = {0: (0, [])}
    done: tuple[int, list[Instr]] = (-1, [])
    for k, body in enumerate(bodies):
        if k not in best or not usable[k]:
            continue
        weight, path = best[k][0] + sum(i.issued for i in body), best[k][1] + body
        last = body[-1] if body else Instr("")
        if last.target == header:  # the back-branch (or a `continue`)
            done = max(done, (weight, path), key=lambda d: d[0])
            continue
        nexts = [first_of.get(last.target)] if last.target else []
        if (last.target is None or last.conditional) and not last.ends:
            nexts.append(k + 1)
        for n in nexts:
            if n is not None and n < len(blocks) and weight > best.get(n, (-1, []))[0]:
                best[n] = (weight, path)
    if done[0] < 0:
        raise ValueError("no fast path through the time loop")
    return done[1]


def step_counts(items: Sequence[Item], pick: str = "max") -> Step:
    """Per element-step counts of the kernel's unrolled time loop.

    Every loop with global stores is a time loop (the main one, the remainder, and their
    copies when the compiler unswitched a test out of the loop); a loop's unroll factor is
    its stores over the fewest any has. Among the most-unrolled loops, ``pick`` takes the
    one reading the most global bytes (``"max"``) or the fewest (``"min"``).
    """
    loops = _loops(items)
    outer = [
        lp for lp in loops if not any(o != lp and o[0] <= lp[0] and lp[1] <= o[1] for o in loops)
    ]
    paths = {}
    for lp in outer:
        inner = [o for o in loops if o != lp and lp[0] <= o[0] and o[1] <= lp[1]]
        path = _fast_path(items, lp, inner)
        if sum(i.stores for i in path):
            paths[lp] = path
    if not paths:
        raise ValueError("no time loop (a loop with global stores) found")
    fewest = min(sum(i.stores > 0 for i in p) for p in paths.values())
    unroll = {lp: sum(i.stores > 0 for i in p) // fewest for lp, p in paths.items()}
    top = max(unroll.values())
    candidates = [lp for lp in paths if unroll[lp] == top]
    choose = max if pick == "max" else min
    lp = choose(candidates, key=lambda c: sum(i.loads for i in paths[c]))
    path = paths[lp]
    return Step(
        *(
            sum(getattr(i, f) for i in path) / top
            for f in ("issued", "mufu", "ieee", "loads", "stores")
        ),
        unroll=top,
    )


# --------------------------------------------------------------------------------------
# kernels: render, compile, count
# --------------------------------------------------------------------------------------

KERNELS = ("forward", "backward")


def kernel_name(model: str, kernel: str) -> str:
    """The exported K = 1 kernel a training call launches: the forward that stores H and
    returns V after the last step, the backward that gets no gradient of V."""
    from symneuron.signature import Variant

    name = _spec(model).name
    if kernel == "forward":
        return Variant("forward", (True, "last"), 1).exported(name)
    return Variant("backward", ("none",), 1).exported(name)


@cache
def _spec(model: str) -> Any:
    import symneuron as sn

    return sn.models.ZOO[model]().spec()


def kernel_source(model: str, dtype: str, kernel: str) -> str:
    """The CUDA source of one training kernel of ``model``, as the runtime renders it."""
    from symneuron.codegen import render_source

    return render_source(_spec(model), "cuda", DTYPES[dtype], kernel=kernel_name(model, kernel))


def ptx(model: str, dtype: str, kernel: str) -> str:
    """The kernel's PTX for sm_90 (NVRTC, the runtime's options)."""
    from symneuron.runtime import nvrtc

    return nvrtc.compile_to_ptx(kernel_source(model, dtype, kernel), "roofline.cu", NVRTC_OPTIONS)


def grad_spike_pick(kernel: str, grad_spike: str) -> str:
    """Which unswitched copy of the time loop runs: the forward has one; the backward's
    scalar dL/dS copy reads the fewest bytes."""
    return "min" if kernel == "backward" and grad_spike == "scalar" else "max"


# --------------------------------------------------------------------------------------
# the roofline
# --------------------------------------------------------------------------------------


def kernel_terms(step: Step, gpu: Machine = H100) -> dict[str, float]:
    """Seconds per element-step of one kernel for each resource alone."""
    return {
        "memory": step.bytes / gpu.copy_bandwidth,
        "issue": step.issued / gpu.issue_rate,
        "MUFU": step.mufu / gpu.mufu_rate,
    }


def kernel_time(step: Step, gpu: Machine = H100) -> tuple[float, float, str]:
    """Predicted seconds per element-step of one kernel: the roofline (memory and
    arithmetic overlap: the largest term), the no-overlap bound (memory + the larger
    arithmetic term), and what binds the roofline."""
    terms = kernel_terms(step, gpu)
    bound = max(terms, key=lambda k: terms[k])
    return terms[bound], terms["memory"] + max(terms["issue"], terms["MUFU"]), bound


def estimate(
    model: str, dtype: str, grad_spike: str = "scalar", gpu: Machine = H100
) -> dict[str, Any]:
    """The roofline row of one model and dtype (see the module docstring)."""
    itemsize = floor.ITEMSIZE[dtype]
    k = floor.extra_states(model)
    row: dict[str, Any] = {"model": model, "dtype": dtype}
    for kernel in KERNELS:
        pick = grad_spike_pick(kernel, grad_spike)
        step = step_counts(parse_ptx(ptx(model, dtype, kernel)), pick)
        seconds, serial, bound = kernel_time(step, gpu)
        row[kernel] = {
            **asdict(step),
            "bytes": step.bytes,
            "bound": bound,
            "seconds": seconds,
            "serial_seconds": serial,
            "floor_bytes": floor.tensors(kernel, k) * itemsize,
            "terms": kernel_terms(step, gpu),
        }
    row["floor_bytes"] = floor.bytes_per_element(model, "training", itemsize)
    row["floor_seconds"] = row["floor_bytes"] / gpu.copy_bandwidth
    row["seconds"] = sum(row[kernel]["seconds"] for kernel in KERNELS)
    row["serial_seconds"] = sum(row[kernel]["serial_seconds"] for kernel in KERNELS)
    row["floor_fraction"] = row["floor_seconds"] / row["seconds"]
    row["serial_floor_fraction"] = row["floor_seconds"] / row["serial_seconds"]
    row["measured"] = MEASURED.get((model, dtype))
    return row


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (ties get their average rank)."""

    def ranks(values: Sequence[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for m in range(i, j + 1):
                out[order[m]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else float("nan")


# --------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------

HEADER = (
    f"{'model':<16}{'dtype':<6}{'fwd':>7}{'bwd':>7}{'MUFU':>6}{'IEEE':>6}{'floor B':>8}"
    f"{'kern B':>7}{'frac':>6}{'serial':>7}  {'bound fwd/bwd':<14}{'measured':>8}"
)


def format_row(row: dict[str, Any]) -> str:
    """One line of the table: instructions, MUFU and IEEE ops per element-step (MUFU and
    IEEE: forward + backward), bytes per element of a training call, floor fractions."""
    f, b = row["forward"], row["backward"]
    measured = f"{row['measured']:.2f}" if row["measured"] is not None else ""
    return (
        f"{row['model']:<16}{row['dtype']:<6}{f['issued']:>7.1f}{b['issued']:>7.1f}"
        f"{f['mufu'] + b['mufu']:>6.1f}{f['ieee'] + b['ieee']:>6.1f}{row['floor_bytes']:>8}"
        f"{f['bytes'] + b['bytes']:>7.0f}{row['floor_fraction']:>6.2f}"
        f"{row['serial_floor_fraction']:>7.2f}  {f['bound'] + '/' + b['bound']:<14}"
        f"{measured:>8}"
    )


def comparison(rows: Iterable[dict[str, Any]]) -> str:
    """How the two estimates rank the measured configurations (Spearman's rho)."""
    pairs = [r for r in rows if r["measured"] is not None]
    if len(pairs) < 3:
        return "fewer than 3 measured configurations in this run: no rank comparison"
    measured = [r["measured"] for r in pairs]
    rho = spearman([r["floor_fraction"] for r in pairs], measured)
    serial = spearman([r["serial_floor_fraction"] for r in pairs], measured)
    inside = sum(r["serial_floor_fraction"] <= r["measured"] <= r["floor_fraction"] for r in pairs)
    names = ", ".join(f"{r['model']} {r['dtype']}" for r in pairs)
    return (
        f"measured vs estimate, {len(pairs)} configurations ({names}):\n"
        f"  Spearman rho {rho:.2f} (frac, roofline), {serial:.2f} (serial, no overlap); "
        f"measured between the two in {inside} of {len(pairs)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table (and write JSON with ``--json``)."""
    import symneuron as sn

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(sn.models.ZOO), help="comma-separated")
    p.add_argument("--dtypes", default="fp32,bf16,fp16", help="of " + ",".join(DTYPES))
    p.add_argument(
        "--grad-spike",
        choices=("scalar", "tensor"),
        default="scalar",
        help="dL/dS of the backward: a broadcast scalar (spikes.sum()) or a tensor",
    )
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    started = time.perf_counter()
    gpu = H100
    print(
        f"{gpu.name}: copy {gpu.copy_bandwidth:.2e} B/s, issue {gpu.issue_rate:.3e} "
        f"thread-instr/s, MUFU {gpu.mufu_rate:.3e} ops/s; K = 1, dL/dS {args.grad_spike}"
    )
    print(HEADER)
    rows = []
    for model in args.models.split(","):
        for dtype in args.dtypes.split(","):
            rows.append(estimate(model, dtype, args.grad_spike, gpu))
            print(format_row(rows[-1]), flush=True)
    print(comparison(rows))
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.json:
        doc = {
            "machine": {**asdict(gpu), "issue_rate": gpu.issue_rate, "mufu_rate": gpu.mufu_rate},
            "grad_spike": args.grad_spike,
            "rows": rows,
        }
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
