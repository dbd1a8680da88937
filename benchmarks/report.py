#!/usr/bin/env python3
"""Turn benchmark results (``benchmarks/results/*.json``) into ``docs/performance.md``.

::

    python3 benchmarks/report.py benchmarks/results/NVIDIA-H100-80GB-HBM3-2026-11-22.json
    python3 benchmarks/report.py a.json b.json -o docs/performance.md --plot docs/performance.png

Several files are merged in order (a later file's record for the same model, T,
N, dtype, mode and peer replaces an earlier one), so a matrix measured in
several runs becomes one report. Derived figures (floor fractions, speed-ups,
memory in [T, N] tensors) are recomputed here from the raw times, each with the
copy bandwidth of its own run; the bytes come from ``floor.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import floor  # noqa: E402  (benchmarks/floor.py: the one floor model)
from bench_neurons import ALL_MODELS  # noqa: E402
from core import Rec, md_table, pyplot  # noqa: E402
from core import pow2 as _n  # noqa: E402

PEERS = ["symneuron", "sj014", "sj200", "torch", "compile"]
PEER_LABEL = {"symneuron": "symneuron", "sj014": "SJ 0.0.0.0.14 CuPy", "sj200": "SJ 2.0.0",
              "torch": "torch eager", "compile": "torch.compile"}  # fmt: skip
SINGLE_MODELS = ["IF", "LIF", "PLIF", "QIF", "EIF"]
MODELS = [*SINGLE_MODELS, "Izhikevich", "ALIF"]  # the plot's
#: the order of the rows: bench_neurons.ALL_MODELS (the others after, by name)
ORDER = {m: i for i, m in enumerate(ALL_MODELS)}
DTYPES = ["fp32", "bf16", "fp16"]
KEY = ("model", "T", "N", "dtype", "mode", "peer")
#: how the torch peers were built: a hand-written loop (runs before 2026-11-23) or
#: symneuron's torch reference (``sn.simulate(..., backend="torch")``)
TORCH_PEERS = {
    "loop": """a plain PyTorch loop over t
(heaviside forward, sigmoid surrogate as an `autograd.Function`, `torch.stack` of the spikes),
eager and under `torch.compile` (whole loop unrolled, N dynamic)""",
    "reference": """symneuron's torch reference
(`sn.simulate(..., backend='torch')`: the model's equations printed to torch ops, a loop over t,
a straight-through surrogate), eager and `simulate_reference` under `torch.compile` (N dynamic)""",
}

METHOD_TEXT = """\
**Floor model** (DESIGN.md §5). Minimal traffic per element: inference 8 B (read X, write S),
training 24 B (forward: read X, write S and H; backward: read dL/dS and H, write dL/dX); half
of that for fp16/bf16. A model whose backward reads its extra states' W̃ (ALIF: its threshold)
saves one more [T, N] tensor per state for the backward (written in the forward, read in the
backward), so its training floor is 32 B fp32 (16 B 16-bit); one whose backward does not
(Izhikevich) saves none and has the single-state floor. *floor* = (bytes / copy bandwidth) /
time, so 1.0 means copy speed.
*wall* = median over calls, each started from an idle GPU (synchronize, time the call and
`spikes.sum().backward()` from the host, synchronize): host overhead counts. *GPU* = median
CUDA-event time per call, with a GPU sleep queued ahead of each batch of calls so that the
host's launch gaps are not counted. *Speed-up* = peer time / symneuron time (> 1: symneuron
faster). Every configuration is checked against symneuron's float64 torch reference before it
is timed (✓/✗; fp32: spikes equal up to threshold ties, 16-bit: ≥ 99 % equal with H rounded
to the storage type in the reference; the mismatching fraction is shown when not 0).

Peers: SpikingJelly 0.0.0.0.14 with `backend='cupy'`; SpikingJelly 2.0.0 with its default
CUDA implementation (Triton; it has no backend argument); {torch_peers}. All use the zoo's constants
and the Sigmoid(α = 4) surrogate; PLIF's w is learnable everywhere; Izhikevich runs with
a = 0.3, b = 0.2 everywhere (SpikingJelly's `IzhikevichNode`, whose 0.0.0.0.14 CuPy kernel is
fp32 only); ALIF has no SpikingJelly counterpart. Inputs rotate among several copies (about
256 MiB in all) so that a repeat does not read its input from L2.

N = 2^14 is the small-layer regime: its working set fits in L2, so floor fractions there can
exceed 1 and measure launch overhead more than bandwidth."""

MEMORY_TEXT = """\
`torch.cuda.memory_allocated()` after a forward with grad minus after one without, outputs
alive in both; in units of one [T, N] tensor of the storage dtype (MiB in brackets)."""

FIRST_CALL_TEXT = """\
First forward + backward in a fresh process, fp32, T = {t}, N = {n} (the kernels' compile \
time does not depend on the size). *Fresh cache*: empty `SYMNEURON_CACHE`, `CUPY_CACHE_DIR`, \
`TRITON_CACHE_DIR`; *warm disk cache*: a second fresh process reusing them. symneuron's \
figure per model excludes the one-time runtime start listed below the table (a user's very \
first call pays it once); the SpikingJelly figures include everything after CUDA \
initialisation.

"""

DERIVATION_TEXT = """\
Each model in a fresh process: `ctor()` (validation), `neuron.spec()` (SymPy derivation and \
CSE), `neuron.source('cuda', 'float32')` (printing; every kernel variant, where a first call \
renders only the two it runs). *SymPy first use*: SymPy's one-off costs in a process (lazy \
imports on first use), measured on a throwaway neuron before the model and not counted in its \
total (runs without this column counted them in the first model's ctor).

"""


def _rank(model: str) -> tuple[int, str]:
    return ORDER.get(model, len(ORDER)), model


def _get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def _ok(rec: Rec | None) -> bool:
    return bool(rec) and rec.get("status") == "ok"  # type: ignore[union-attr]


def _passed(rec: Rec | None) -> bool:
    return bool(((rec or {}).get("check") or {}).get("pass"))


# --------------------------------------------------------------------------------------
# loading and derived metrics
# --------------------------------------------------------------------------------------


def load(paths: list[str | Path]) -> dict[str, Any]:
    """Merge result files; the later record for the same configuration and peer wins."""
    merged: dict[str, Any] | None = None
    records: dict[tuple[Any, ...], Rec] = {}
    sources = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        bw = _get(data, "copy", "bandwidth_Bps")
        meta = data.get("meta") or {}
        sources.append(dict(file=Path(path).name, date=meta.get("date"), gpu=meta.get("gpu"),
                            copy_Bps=bw, complete=data.get("complete")))  # fmt: skip
        for rec in data.get("records", []):
            rec = {**rec, "copy_Bps": rec.get("copy_Bps", bw)}
            old = records.get(tuple(rec.get(k) for k in KEY))
            if _ok(old) and rec.get("status") == "skipped":
                continue  # a skipped entry never hides a measurement
            records[tuple(rec.get(k) for k in KEY)] = rec
        if merged is None:
            merged = data
            continue
        for section in ("first_call", "derivation", "workers"):
            for k, v in (data.get(section) or {}).items():
                failed = isinstance(v, dict) and v.get("error")
                if v and not (failed and merged.get(section, {}).get(k)):
                    merged.setdefault(section, {})[k] = v
        merged.setdefault("events", []).extend(data.get("events", []))
    if merged is None:
        raise SystemExit("no result files given")
    merged.update(records=list(records.values()), sources=sources)
    return annotate(merged)


def annotate(results: dict[str, Any]) -> dict[str, Any]:
    """Add floor fractions, memory in [T, N] units, and symneuron's speed-ups (in place)."""
    run_bw = _get(results, "copy", "bandwidth_Bps")
    by_cfg: dict[tuple[Any, ...], dict[str, Rec]] = defaultdict(dict)
    for rec in results.get("records", []):
        by_cfg[tuple(rec.get(k) for k in KEY[:-1])][rec.get("peer")] = rec
        if not _ok(rec):
            continue
        item = floor.ITEMSIZE.get(rec["dtype"], 4)
        elements = rec["T"] * rec["N"]
        rec["floor_bytes"] = floor.bytes_per_element(rec["model"], rec["mode"], item) * elements
        bw = rec.get("copy_Bps") or run_bw
        if bw:
            rec["floor_s"] = floor_s = rec["floor_bytes"] / bw
            gpu, wall = rec.get("gpu_s"), rec.get("wall_s")
            rec["floor_frac_gpu"] = floor_s / gpu if gpu else None
            rec["floor_frac_wall"] = floor_s / wall if wall else None
            rec["achieved_Bps"] = rec["floor_bytes"] / gpu if gpu else None
        if rec.get("retained_bytes") is not None:
            rec["retained_tn"] = rec["retained_bytes"] / (elements * item)
            excess = rec["retained_bytes"] - elements * item
            rec["retained_excess_B_per_neuron"] = excess / rec["N"]
    for peers in by_cfg.values():
        sn = peers.get("symneuron")
        if _ok(sn):
            assert sn is not None
            sn["vs"] = {
                peer: {"wall": rec["wall_s"] / sn["wall_s"], "gpu": rec["gpu_s"] / sn["gpu_s"]}
                for peer, rec in peers.items()
                if peer != "symneuron" and _ok(rec)
            }
    return results


def index(results: dict[str, Any]) -> dict[tuple[Any, ...], Rec]:
    return {tuple(r.get(k) for k in KEY): r for r in results.get("records", [])}


def configs(results: dict[str, Any], mode: str | None = None) -> list[tuple[Any, ...]]:
    seen = {tuple(r.get(k) for k in KEY[:-1]) for r in results.get("records", [])}
    drank = {d: i for i, d in enumerate(DTYPES)}
    return sorted(
        (c for c in seen if mode is None or c[4] == mode),
        key=lambda c: (c[4] != "training", drank.get(c[3], 9), -c[2], _rank(c[0]), c[1]),
    )


# --------------------------------------------------------------------------------------
# text
# --------------------------------------------------------------------------------------


def _status_cell(rec: Rec | None) -> str:
    if rec is None:
        return "—"
    names = {"unsupported": "unsup.", "error": "error", "skipped": "skip"}
    return names.get(rec.get("status", ""), "?")


def _x(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "—"
    return f"{v:.1f}×" if v < 100 else f"{v:.0f}×"


def _f(v: float | None, fmt: str = ".2f") -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def _us(s: float | None) -> str:
    if s is None:
        return "—"
    us = s * 1e6
    return f"{us:.1f}" if us < 100 else f"{us:.0f}"


def _ms(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e3:.1f}"


def _fallback(rec: Rec) -> bool:
    return "reference" in str(rec.get("implementation") or "")


def _marks(rec: Rec) -> str:
    """' ✗' when the peer failed its check, ' †' when it fell back to a torch loop."""
    return ("" if _passed(rec) else " ✗") + (" †" if _fallback(rec) else "")


def _check(rec: Rec | None) -> str:
    chk = (rec or {}).get("check") or {}
    if not chk:
        return "—"
    mark = "✓" if chk.get("pass") else "✗"
    if not chk.get("identical", True):
        frac = chk.get("mismatch_frac", 0.0)
        mark += f" ({frac:.1e})" if frac < 1e-3 else f" ({frac:.1%})"
    return mark


def _peers_present(results: dict[str, Any]) -> list[str]:
    return [p for p in PEERS if any(r.get("peer") == p for r in results.get("records", []))]


def _rows(
    results: dict[str, Any], mode: str | None, cells: Callable[..., list[str] | None]
) -> list[list[str]]:
    """One row per configuration of ``mode``: model, T, N, dtype, then ``cells(cfg, idx)``
    (a row is left out when it returns None)."""
    idx, out = index(results), []
    for cfg in configs(results, mode):
        row = cells(cfg, idx)
        if row is not None:
            out.append([cfg[0], str(cfg[1]), _n(cfg[2]), cfg[3], *row])
    return out


def _speedup(sn: Rec | None, rec: Rec | None, cell: Callable[[dict[str, float]], str]) -> str:
    """A peer's cell of a speed-up table: ``cell`` of symneuron's speed-up, or its status."""
    if _ok(sn) and _ok(rec):
        assert sn is not None and rec is not None
        return cell(sn["vs"][rec["peer"]])
    return _status_cell(rec)


def short_table(results: dict[str, Any]) -> str:
    """symneuron's times, floor fractions and speed-ups, per mode: the markdown tables."""
    annotate(results)
    modes = [m for m in ("training", "inference") if configs(results, m)]
    bw = _get(results, "copy", "bandwidth_Bps")
    floor_line = f"copy floor {bw / 1e9:.0f} GB/s (read + write)" if bw else "no copy bandwidth"
    return "\n\n".join([*(f"{m}:\n{speedup_table(results, m)}" for m in modes), floor_line])


def speedup_table(results: dict[str, Any], mode: str) -> str:
    peers = [p for p in _peers_present(results) if p != "symneuron"]
    header = ["model", "T", "N", "dtype", "wall µs", "GPU µs", "floor (GPU)", "floor (wall)"]
    header += ["check"] + [f"vs {PEER_LABEL[p]} (wall / GPU)" for p in peers]

    def cells(cfg: tuple[Any, ...], idx: dict[tuple[Any, ...], Rec]) -> list[str]:
        sn = idx.get((*cfg, "symneuron"))
        row = [_status_cell(sn), "", "", "", ""]
        if _ok(sn):
            assert sn is not None
            row = [_us(sn["wall_s"]), _us(sn["gpu_s"]), _f(sn.get("floor_frac_gpu"))]
            row += [_f(sn.get("floor_frac_wall")), _check(sn)]
        for p in peers:
            rec = idx.get((*cfg, p))
            marks = _marks(rec) if rec else ""
            row.append(_speedup(sn, rec, lambda v, m=marks: f"{_x(v['wall'])} / {_x(v['gpu'])}{m}"))
        return row

    return md_table(header, _rows(results, mode, cells), "lrrlrrrrl" + "r" * len(peers))


def absolute_table(results: dict[str, Any], mode: str) -> str:
    peers = _peers_present(results)

    def cell(rec: Rec | None) -> str:
        if not _ok(rec):
            return _status_cell(rec)
        assert rec is not None
        times = f"{_us(rec['wall_s'])} / {_us(rec['gpu_s'])}"
        return f"{times} ({_f(rec.get('floor_frac_gpu'))}){_marks(rec)}"

    rows = _rows(results, mode, lambda cfg, idx: [cell(idx.get((*cfg, p))) for p in peers])
    header = ["model", "T", "N", "dtype"] + [
        f"{PEER_LABEL[p]} wall / GPU µs (floor)" for p in peers
    ]
    return md_table(header, rows, "lrrl" + "r" * len(peers))


def memory_table(results: dict[str, Any]) -> str:
    peers = _peers_present(results)

    def cell(rec: Rec | None) -> str:
        if rec and rec.get("retained_tn") is not None:
            return f"{rec['retained_tn']:.2f} ({rec['retained_bytes'] / 2**20:.1f} MiB)"
        return _status_cell(rec) if rec and rec.get("status") != "ok" else "—"

    def cells(cfg: tuple[Any, ...], idx: dict[tuple[Any, ...], Rec]) -> list[str] | None:
        recs = [idx.get((*cfg, p)) for p in peers]
        if all((r or {}).get("retained_tn") is None for r in recs):
            return None
        return [cell(r) for r in recs]

    rows = _rows(results, "training", cells)
    if not rows:
        return "_No memory measurements (CPU dry run, or no training configurations)._"
    header = ["model", "T", "N", "dtype"] + [PEER_LABEL[p] for p in peers]
    return md_table(header, rows, "lrrl" + "r" * len(peers))


def first_call_section(results: dict[str, Any]) -> str:
    fc = results.get("first_call") or {}
    if not fc:
        return "_Not measured._"
    rows = []
    for impl, phases in ((i, fc[i]) for i in ("symneuron", "sj014", "sj200") if fc.get(i)):
        if "error" in phases:  # the implementation was not run at all
            rows.append([PEER_LABEL[impl], "—", "", "", "", str(phases["error"])[:120]])
            continue
        found = {m for ph in phases.values() for m in (ph.get("models") or {})}
        for model in sorted(found, key=_rank):
            cold = _get(phases, "cold", "models", model) or {}
            warm = _get(phases, "warm", "models", model) or {}
            err = cold.get("error") or warm.get("error")
            note = ("error: " + err.splitlines()[0][:80]) if err else ""
            times = [cold.get("first_s"), warm.get("first_s"), warm.get("second_s")]
            rows.append([PEER_LABEL[impl], model, *map(_ms, times), note])
        for phase in ("cold", "warm"):
            if _get(phases, phase, "error"):
                error = str(phases[phase]["error"])[:120]
                rows.append([PEER_LABEL[impl], f"({phase})", "", "", "", error])
    sym = fc.get("symneuron") or {}
    extra = [
        f"{phase}: CuPy/NVRTC start {_ms(ph['runtime_init_s'])} ms, "
        f"import symneuron {_ms(ph.get('import_s'))} ms, CUDA init {_ms(ph.get('cuda_init_s'))} ms"
        for phase, ph in ((p, sym.get(p) or {}) for p in ("cold", "warm"))
        if ph.get("runtime_init_s") is not None
    ]
    t = _get(sym, "cold", "T") or _get(fc, "sj014", "cold", "T")
    n = _get(sym, "cold", "N") or _get(fc, "sj014", "cold", "N")
    header = ["implementation", "model", "fresh cache ms", "warm disk cache ms", "2nd call ms"]
    text = FIRST_CALL_TEXT.format(t=t, n=n) + md_table([*header, "note"], rows, "llrrrl")
    return text + ("\n\nsymneuron one-time costs: " + "; ".join(extra) + "." if extra else "")


def derivation_section(results: dict[str, Any]) -> str:
    der = results.get("derivation") or {}
    if not der:
        return "_Not measured._"
    rows = []
    for model in sorted(der, key=_rank):
        r = der[model]
        if r.get("error"):
            rows.append([model, "", "", "", "", "error: " + r["error"].splitlines()[0][:100]])
            continue
        keys = ("ctor_s", "spec_s", "source_s", "total_s", "sympy_first_use_s", "import_s")
        rows.append([model, *(_ms(r.get(k)) for k in keys)])
    header = ["model", "ctor ms", "spec() ms", "source() ms", "total ms", "SymPy first use ms"]
    return DERIVATION_TEXT + md_table([*header, "import symneuron ms"], rows, "lrrrrrr")


# --------------------------------------------------------------------------------------
# targets of the performance issue
# --------------------------------------------------------------------------------------


def _sn(results: dict[str, Any], **where: Any) -> list[Rec]:
    """symneuron's measured records whose fields match ``where`` (a value, a collection of
    values or a predicate per field)."""

    def match(value: Any, want: Any) -> bool:
        if callable(want):
            return bool(want(value))
        return value in want if isinstance(want, (list, tuple, set)) else value == want

    return [
        r
        for r in results.get("records", [])
        if r.get("peer") == "symneuron"
        and _ok(r)
        and all(match(r.get(k), v) for k, v in where.items())
    ]


def _worst(
    name: str,
    recs: list[Rec],
    value: Callable[[Rec], float],
    goal: str,
    need: tuple[str, float],
    fmt: Callable[[float], str] = "{:.2f}".format,
) -> list[str]:
    """A target row: the worst of ``recs`` by ``value``, which must be at least
    (``need = ("min", x)``) or at most (``("max", x)``) the limit."""
    if not recs:
        return [name, "no data", goal, "—"]
    worst = (min if need[0] == "min" else max)(recs, key=value)
    v = value(worst)
    passed = v >= need[1] if need[0] == "min" else v <= need[1]
    where = f"{worst['model']} T={worst['T']} N={_n(worst['N'])} {worst['dtype']}"
    return [name, f"{fmt(v)} (worst: {where})", goal, "✓" if passed else "✗"]


def _worst_ms(name: str, values: dict[str, Any], limit: float, note: str = "") -> list[str]:
    """A target row: the largest of ``values`` (seconds per model), at most ``limit``."""
    vals = {m: v for m, v in values.items() if v is not None}
    m = max(vals, key=vals.__getitem__) if vals else None
    measured = f"{vals[m] * 1e3:.0f} ms (worst: {m}){note}" if m else "no data"
    met = ("✓" if vals[m] <= limit else "✗") if m else "—"
    return [name, measured, f"≤ {limit * 1e3:.0f} ms", met]


def _times(v: float) -> str:
    return f"{v:.2f}×"


def _vs(recs: list[Rec], peer: str) -> list[Rec]:
    return [r for r in recs if peer in (r.get("vs") or {})]


def _floor_targets(results: dict[str, Any], big: int) -> list[list[str]]:
    """Issue 3's floor rows (the single-state zoo, N = ``big``)."""
    single, both = tuple(SINGLE_MODELS), ("fp32", "bf16")
    train = _sn(results, model=single, mode="training", dtype=both, N=big, T=lambda t: t >= 16)
    train = [r for r in train if r.get("floor_frac_gpu") is not None]
    t16 = _sn(results, model=single, mode="training", dtype=both, N=big, T=16)
    t16 = [r for r in t16 if r.get("floor_frac_wall") is not None]
    infer = _sn(results, model=single, mode="inference", dtype="fp32", N=big, T=lambda t: t >= 16)
    infer = [r for r in infer if r.get("floor_frac_gpu") is not None]
    gpu, wall = (lambda r: r["floor_frac_gpu"]), (lambda r: r["floor_frac_wall"])
    t64 = [r for r in train if r["T"] >= 64]
    return [
        _worst("training GPU time, fp32+bf16, T ≥ 16", train, gpu, "≥ 0.90 of floor", ("min", 0.9)),
        _worst("training wall time, fp32+bf16, T ≥ 64", t64, wall, "≥ 0.80 of floor", ("min", 0.8)),
        _worst("training wall time, fp32+bf16, T = 16", t16, wall, "≥ 0.60 of floor", ("min", 0.6)),
        _worst("inference GPU time, fp32, T ≥ 16", infer, gpu, "≥ 0.90 of floor", ("min", 0.9)),
        _worst(
            "inference GPU time vs torch.compile, fp32, T ≥ 16",
            _vs(infer, "compile"),
            lambda r: r["vs"]["compile"]["gpu"],
            "≥ 0.95× (matching)",
            ("min", 0.95),
            _times,
        ),
    ]


def _peer_targets(results: dict[str, Any], big: int, small: int) -> list[list[str]]:
    """Speed-ups over the peers, host overhead and memory (the stateful models: one row)."""
    single = tuple(SINGLE_MODELS)
    rows = []
    for peer, goal in (("sj014", 3.0), ("sj200", 1.5)):
        recs = _vs(_sn(results, model=single, mode="training", T=(4, 16, 64)), peer)
        rows.append(
            _worst(
                f"training wall speed-up vs {PEER_LABEL[peer]}, T ∈ {{4, 16, 64}}",
                recs,
                lambda r, p=peer: r["vs"][p]["wall"],
                f"≥ {goal}×",
                ("min", goal),
                _times,
            )
        )
    izh = _vs(_sn(results, model="Izhikevich", mode="training", N=big, T=(16, 64)), "sj014")
    rows.append(
        _worst(
            "Izhikevich training wall speed-up vs SJ CuPy, T ∈ {16, 64}",
            izh,
            lambda r: r["vs"]["sj014"]["wall"],
            "≥ 3×",
            ("min", 3.0),
            _times,
        )
    )
    for kind in ("wall", "gpu"):
        rows.append(
            _worst(
                f"faster than every peer, every configuration ({kind})",
                [r for r in _sn(results) if r.get("vs")],
                lambda r, k=kind: min(v[k] for v in r["vs"].values()),
                "> 1×",
                ("min", 1.0),
                _times,
            )
        )
    small_train = _sn(results, model=single, mode="training", T=4, N=small)
    rows.append(
        _worst(
            f"host overhead, training T = 4, N = {_n(small)}",
            small_train,
            lambda r: r["wall_s"],
            "≤ 150 µs wall",
            ("max", 150e-6),
            lambda v: f"{v * 1e6:.0f} µs",
        )
    )
    kept = _sn(results, model=single, mode="training", retained_bytes=lambda b: b is not None)
    rows.append(
        _worst(
            "memory retained for backward",
            kept,
            lambda r: r["retained_excess_B_per_neuron"],
            "≤ one [T, N] tensor + O(N) (excess ≤ 32 B/neuron)",
            ("max", 32.0),
            lambda v: f"one [T, N] + {v:.1f} B/neuron",
        )
    )
    return rows


def _latency_targets(results: dict[str, Any]) -> list[list[str]]:
    """First calls, the derivation, and symneuron's checks and errors."""
    fc, rows = results.get("first_call") or {}, []
    for name, phase, limit in (
        ("first call, fresh cache", "cold", 0.5),
        ("first call, warm disk cache", "warm", 0.03),
    ):
        data = _get(fc, "symneuron", phase, "models") or {}
        rows.append(_worst_ms(name, {m: r.get("first_s") for m, r in data.items()}, limit))
    der = results.get("derivation") or {}
    first_use = [r.get("sympy_first_use_s") for r in der.values()]
    first_use = [v for v in first_use if v is not None]
    once = f"; plus SymPy's first use, once per process: {max(first_use or [0]) * 1e3:.0f} ms"
    totals = {m: r.get("total_s") for m, r in der.items()}
    rows.append(_worst_ms("derivation per zoo model", totals, 0.2, once if first_use else ""))
    sn_all = [r for r in results.get("records", []) if r.get("peer") == "symneuron"]
    bad = [r for r in sn_all if _ok(r) and not _passed(r)]
    failed = [r for r in sn_all if r.get("status") in ("error", "unsupported")]
    measured = f"{len(bad)} check failures, {len(failed)} errors of {len(sn_all)}"
    met = "✓" if sn_all and not bad and not failed else "✗"
    return [*rows, ["symneuron correct and running in every configuration", measured, "0", met]]


def targets(results: dict[str, Any]) -> list[list[str]]:
    """The rows of the targets table: target, measured (the worst case), goal, met."""
    records = results.get("records", [])
    big = max((r["N"] for r in records), default=2**20)
    small = min((r["N"] for r in records), default=2**14)
    floor_rows, peer_rows = _floor_targets(results, big), _peer_targets(results, big, small)
    return [*floor_rows, *peer_rows, *_latency_targets(results)]


def problems_section(results: dict[str, Any]) -> str:
    groups: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for r in results.get("records", []):
        name = f"{r['model']}/T{r['T']}/{_n(r['N'])}/{r['dtype']}/{r['mode']}"
        if r.get("status") in ("error", "unsupported", "skipped"):
            msg = (r.get("error") or "").strip().splitlines()[0][:160] if r.get("error") else ""
            groups[(r["peer"], r["status"], msg)].append(name)
        elif _ok(r) and not _passed(r):
            chk = r.get("check") or {}
            frac = chk.get("mismatch_frac", 0)
            groups[(r["peer"], "check failed", chk.get("rule", ""))].append(f"{name} ({frac:.2%})")
        if _fallback(r):
            groups[(r["peer"], "note", r["implementation"])].append(name)
    lines = []
    for (peer, status, msg), where in sorted(groups.items()):
        shown = ", ".join(where[:6]) + (f" and {len(where) - 6} more" if len(where) > 6 else "")
        head = f"- **{PEER_LABEL.get(peer, peer)}**, {status} ({len(where)}): {msg or '—'}"
        lines.append(f"{head}  \n  {shown}")
    return "\n".join(lines) or "_None._"


def _torch_peers(results: dict[str, Any]) -> str:
    notes = [r.get("note") or "" for r in results.get("records", [])]
    return "reference" if any("reference" in note for note in notes) else "loop"


def markdown(results: dict[str, Any], plot_name: str | None = None) -> str:
    annotate(results)
    meta = results.get("meta") or {}
    v = meta.get("versions") or {}
    workers = results.get("workers") or {}
    bw = _get(results, "copy", "bandwidth_Bps")
    sj = {
        k: (workers.get(k) or {}).get("spikingjelly")
        or ("not run: " + str((workers.get(k) or {}).get("error", "—"))[:80])
        for k in ("sj014", "sj200")
    }
    srcs = results.get("sources") or []
    copy_gib = (_get(results, "copy", "bytes") or 2**30) / 2**30
    files = ", ".join(
        f"`{s['file']}`"
        + (f" (copy {s['copy_Bps'] / 1e9:.0f} GB/s)" if s.get("copy_Bps") else "")
        + ("" if s.get("complete") else " (partial)")
        for s in srcs
    )
    out = ["# Performance", ""]
    out += [f"<!-- generated by benchmarks/report.py from {', '.join(s['file'] for s in srcs)}; "
            "do not edit -->", ""]  # fmt: skip
    if meta.get("dry_run"):
        out += ["> **CPU dry run**: these figures only exercise the pipeline; "
                "they say nothing about GPU speed.", ""]  # fmt: skip
    out += [
        "## Setup",
        "",
        f"- GPU: **{meta.get('gpu', '?')}** ({meta.get('sm_count', '?')} SMs, L2 "
        f"{(meta.get('l2_bytes') or 0) / 2**20:.0f} MiB), driver {meta.get('driver', '?')}",
        f"- torch {v.get('torch')} (CUDA {v.get('torch_cuda')}), CuPy {v.get('cupy')}, "
        f"Triton {v.get('triton')}, NumPy {v.get('numpy')}, SymPy {v.get('sympy')}, "
        f"Python {v.get('python')}",
        f"- symneuron {v.get('symneuron')} (sources sha256 {v.get('symneuron_source_sha256')}); "
        f"SpikingJelly 0.0.0.0.14: {sj['sj014']}; SpikingJelly 2.0.0: {sj['sj200']}",
        f"- date {meta.get('date')}; run files: {files}",
        f"- copy floor: **{bw / 1e9:.0f} GB/s** ({copy_gib:g} GiB device-to-device copy, "
        "bytes read + written)"
        if bw
        else "- copy floor: not measured",
        "",
        METHOD_TEXT.format(torch_peers=TORCH_PEERS[_torch_peers(results)]),
        "",
    ]
    if plot_name:
        out += [f"![floor fractions and speed-ups]({plot_name})", ""]
    sections = [
        ("## Targets", "Issue 3's rows cover the single-state zoo (IF, LIF, PLIF, QIF, EIF); "
         "the Izhikevich row is the target for the neurons with extra states.",
         md_table(["target", "measured", "goal", "met"], targets(results), "lllc")),
        ("## Training (forward + backward)", "symneuron's times, floor fractions and check, then "
         "its speed-up over each peer (wall / GPU). ✗: the peer failed its check; †: the peer "
         "fell back to its torch loop.", speedup_table(results, "training")),
        ("## Inference (forward, no grad)", speedup_table(results, "inference")),
        ("## Memory retained for backward", MEMORY_TEXT, memory_table(results)),
        ("## First-call latency", first_call_section(results)),
        ("## Symbolic derivation", derivation_section(results)),
        ("## Absolute times", "### Training", absolute_table(results, "training")),
        ("### Inference", absolute_table(results, "inference")),
        ("## Failures, unsupported and skipped", problems_section(results)),
    ]  # fmt: skip
    for section in sections:
        for part in section:
            out += [part, ""]
    return "\n".join(out)


# --------------------------------------------------------------------------------------
# plot
# --------------------------------------------------------------------------------------


def _series(
    recs: list[Rec], peer: str, mode: str, model: str, n: int, field: str
) -> tuple[list[int], list[float]]:
    """The T and ``field`` values of one peer's fp32 records for the plot, sorted by T."""
    pts = sorted(
        (r["T"], r[field])
        for r in recs
        if (r["peer"], r["mode"], r["model"], r["dtype"], r["N"]) == (peer, mode, model, "fp32", n)
        and r.get(field) is not None
    )
    return [p[0] for p in pts], [p[1] for p in pts]


def plot(results: dict[str, Any], path: str | Path) -> Path:
    from matplotlib.ticker import FuncFormatter

    plt = pyplot()

    annotate(results)
    recs = [r for r in results.get("records", []) if _ok(r)]
    path = Path(path)
    big = max((r["N"] for r in recs), default=2**20)
    models_present = [m for m in MODELS if any(r["model"] == m for r in recs)]
    model = "LIF" if "LIF" in models_present else (models_present or ["LIF"])[0]
    colors = {"symneuron": "C3", "sj014": "C0", "sj200": "C1", "torch": "C7", "compile": "C2"}
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))

    def finish(ax: Any, drawn: bool) -> None:
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)

    for ax, mode in zip(axes[:2], ("training", "inference"), strict=True):
        drawn = False
        for peer in PEERS:
            ts, fracs = _series(recs, peer, mode, model, big, "floor_frac_gpu")
            if ts:
                drawn = True
                ax.plot(ts, fracs, "o-", color=colors[peer], label=PEER_LABEL[peer])
                ts, fracs = _series(recs, peer, mode, model, big, "floor_frac_wall")
                ax.plot(ts, fracs, "x:", color=colors[peer], alpha=0.6)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(0.9, color="k", lw=0.6, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("T")
        ax.set_ylabel("fraction of copy floor (o- GPU, x: wall)")
        ax.set_title(f"{mode}, {model}, fp32, N = {_n(big)}")
        finish(ax, drawn)
    ax = axes[2]
    peers = [p for p in PEERS[1:] if any(r["peer"] == p for r in recs)]
    sn = [r for r in _sn({"records": recs}, mode="training", dtype="fp32", N=big) if r.get("vs")]
    width = 0.8 / max(1, len(peers))
    drawn = False
    for i, peer in enumerate(peers):
        heights = []
        for m in models_present:
            vals = [r["vs"][peer]["wall"] for r in sn if r["model"] == m and peer in r["vs"]]
            geomean = math.exp(statistics.mean(math.log(v) for v in vals)) if vals else math.nan
            heights.append(geomean)
        drawn = drawn or any(math.isfinite(h) for h in heights)
        offsets = [j + (i - (len(peers) - 1) / 2) * width for j in range(len(models_present))]
        ax.bar(offsets, heights, width, color=colors[peer], label=PEER_LABEL[peer])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda val, _pos: f"{val:g}×"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda val, _pos: ""))
    ax.set_xticks(range(len(models_present)), models_present)
    ax.set_ylabel("symneuron wall speed-up (geomean over T)")
    ax.set_title(f"training, fp32, N = {_n(big)}: peer wall / symneuron wall")
    finish(ax, drawn)
    meta = results.get("meta") or {}
    dry = " (CPU DRY RUN)" if meta.get("dry_run") else ""
    gpu, date = meta.get("gpu", "?"), str(meta.get("date", ""))[:10]
    fig.suptitle(f"symneuron benchmark — {gpu}, {date}{dry}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="result JSON files (merged in order)")
    p.add_argument("-o", "--output", help="markdown output (default docs/performance.md)")
    p.add_argument("--plot", help="also draw the plot to this PNG (linked from the markdown)")
    p.add_argument("--short", action="store_true", help="print the short text table and exit")
    args = p.parse_args(argv)
    results = load(args.results)
    if args.short:
        print(short_table(results))
        return 0
    out = Path(args.output or Path(__file__).resolve().parent.parent / "docs" / "performance.md")
    plot_name = None
    if args.plot:
        png = plot(results, args.plot)
        plot_name = Path(os.path.relpath(Path(png).resolve(), out.resolve().parent)).as_posix()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(results, plot_name))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
