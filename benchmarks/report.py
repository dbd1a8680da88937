#!/usr/bin/env python3
"""The benchmarks' pages from their JSON results (prose in ``templates/``):
``docs/performance.md`` (``bench_neurons.py``'s files, merged in order: a later record for
the same configuration and peer wins), ``docs/performance_zoo.md`` (``--zoo``, with the
bounds of ``profile_ncu.py``) and the end-to-end section (``bench_e2e.py --report``). Derived
figures are recomputed from the raw times, each with its own run's copy bandwidth. The
commands: ``benchmarks/NOTES.md`` and the pages themselves.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import core  # noqa: E402
import floor  # noqa: E402  (benchmarks/floor.py: the one floor model)
from core import ALL_MODELS, SINGLE_MODELS, Rec, grouped_bars, md_table, pyplot, save_figure  # noqa: E402  # noqa: E402
from core import pow2 as _n  # noqa: E402

PEERS = ["symneuron", "sj014", "sj200", "torch", "compile"]
PEER_LABEL = {
    "symneuron": "symneuron",
    "sj014": "SJ 0.0.0.0.14 CuPy",
    "sj200": "SJ 2.0.0",
    "torch": "torch eager",
    "compile": "torch.compile",
}
MODELS = [*SINGLE_MODELS, "Izhikevich", "ALIF"]  # the plot's
ORDER = {m: i for i, m in enumerate(ALL_MODELS)}  # the rows' (the others after, by name)
DTYPES = ["fp32", "bf16", "fp16"]
KEY = ("model", "T", "N", "dtype", "mode", "peer")
TEMPLATES = Path(__file__).resolve().parent / "templates"
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


_DRY_RUN = (
    "> **CPU dry run**: these figures only exercise the pipeline; they say nothing "
    "about GPU speed.\n\n"
)


def _rank(model: str) -> tuple[int, str]:
    return ORDER.get(model, len(ORDER)), model


def _get(d: Any, *path: str) -> Any:
    for p in path:
        d = d.get(p) if isinstance(d, dict) else None
    return d


def _ok(rec: Rec | None) -> bool:
    return bool(rec) and rec.get("status") == "ok"  # type: ignore[union-attr]


def _passed(rec: Rec | None) -> bool:
    return bool(((rec or {}).get("check") or {}).get("pass"))


# ------------------------------------------------------ kernel results: loading, metrics


def load(paths: Iterable[str | Path]) -> dict[str, Any]:
    """Merge result files; the later record for the same configuration and peer wins."""
    merged: dict[str, Any] = {}
    records: dict[tuple[Any, ...], Rec] = {}
    sources = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        bw, meta = _get(data, "copy", "bandwidth_Bps"), data.get("meta") or {}
        sources.append(
            dict(
                file=Path(path).name,
                date=meta.get("date"),
                gpu=meta.get("gpu"),
                copy_Bps=bw,
                complete=data.get("complete"),
            )
        )
        for rec in data.get("records", []):
            rec, key = {**rec, "copy_Bps": rec.get("copy_Bps", bw)}, tuple(rec.get(k) for k in KEY)
            if not (_ok(records.get(key)) and rec.get("status") == "skipped"):
                records[key] = rec  # a skipped entry never hides a measurement
        if not merged:
            merged = data
            continue
        for section in ("first_call", "derivation", "workers"):
            for k, v in (data.get(section) or {}).items():
                failed = isinstance(v, dict) and v.get("error")
                if v and not (failed and merged.get(section, {}).get(k)):
                    merged.setdefault(section, {})[k] = v
        merged.setdefault("events", []).extend(data.get("events", []))
    if not merged:
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
        item, elements = floor.ITEMSIZE.get(rec["dtype"], 4), rec["T"] * rec["N"]
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
        if sn is not None and _ok(sn):
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


# ----------------------------------------------------------------------- kernel tables


def _status_cell(rec: Rec | None) -> str:
    names = {"unsupported": "unsup.", "error": "error", "skipped": "skip"}
    return "—" if rec is None else names.get(rec.get("status", ""), "?")


def _x(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "—"
    return f"{v:.1f}×" if v < 100 else f"{v:.0f}×"


def _f(v: float | None, fmt: str = ".2f") -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def _us(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e6:.1f}" if s * 1e6 < 100 else f"{s * 1e6:.0f}"


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
    mark, frac = "✓" if chk.get("pass") else "✗", chk.get("mismatch_frac", 0.0)
    if not chk.get("identical", True):
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
        if sn is not None and _ok(sn):
            row = [_us(sn["wall_s"]), _us(sn["gpu_s"]), _f(sn.get("floor_frac_gpu"))]
            row += [_f(sn.get("floor_frac_wall")), _check(sn)]
        for p in peers:
            rec = idx.get((*cfg, p))
            if sn is not None and rec is not None and _ok(sn) and _ok(rec):
                v = sn["vs"][p]
                row.append(f"{_x(v['wall'])} / {_x(v['gpu'])}{_marks(rec)}")
            else:
                row.append(_status_cell(rec))
        return row

    return md_table(header, _rows(results, mode, cells), "lrrlrrrrl" + "r" * len(peers))


def absolute_table(results: dict[str, Any], mode: str) -> str:
    peers = _peers_present(results)

    def cell(rec: Rec | None) -> str:
        if rec is None or not _ok(rec):
            return _status_cell(rec)
        times = f"{_us(rec['wall_s'])} / {_us(rec['gpu_s'])}"
        return f"{times} ({_f(rec.get('floor_frac_gpu'))}){_marks(rec)}"

    rows = _rows(results, mode, lambda cfg, idx: [cell(idx.get((*cfg, p))) for p in peers])
    header = [f"{PEER_LABEL[p]} wall / GPU µs (floor)" for p in peers]
    return md_table(["model", "T", "N", "dtype", *header], rows, "lrrl" + "r" * len(peers))


def memory_table(results: dict[str, Any]) -> str:
    peers = _peers_present(results)

    def cell(rec: Rec | None) -> str:
        if rec and rec.get("retained_tn") is not None:
            return f"{rec['retained_tn']:.2f} ({rec['retained_bytes'] / 2**20:.1f} MiB)"
        return _status_cell(rec) if rec and rec.get("status") != "ok" else "—"

    def cells(cfg: tuple[Any, ...], idx: dict[tuple[Any, ...], Rec]) -> list[str] | None:
        recs = [idx.get((*cfg, p)) for p in peers]
        measured = any((r or {}).get("retained_tn") is not None for r in recs)
        return list(map(cell, recs)) if measured else None

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
        for phase in (p for p in ("cold", "warm") if _get(phases, p, "error")):
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
    text = (TEMPLATES / "first_call.md").read_text().format(t=t, n=n)
    text += md_table([*header, "note"], rows, "llrrrl")
    return text + ("\n\nsymneuron one-time costs: " + "; ".join(extra) + "." if extra else "")


def derivation_section(results: dict[str, Any]) -> str:
    der = results.get("derivation") or {}
    if not der:
        return "_Not measured._"
    rows = []
    for model in sorted(der, key=_rank):
        r, keys = der[model], ("ctor_s", "spec_s", "source_s", "total_s", "sympy_first_use_s")
        if r.get("error"):
            rows.append([model, "", "", "", "", "error: " + r["error"].splitlines()[0][:100]])
        else:
            rows.append([model, *(_ms(r.get(k)) for k in (*keys, "import_s"))])
    header = ["model", "ctor ms", "spec() ms", "source() ms", "total ms", "SymPy first use ms"]
    text = (TEMPLATES / "derivation.md").read_text()
    return text + md_table([*header, "import symneuron ms"], rows, "lrrrrrr")


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


# ---------------------------------------------------------------- the issue's targets


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


def _vs(recs: list[Rec], peer: str) -> list[Rec]:
    return [r for r in recs if peer in (r.get("vs") or {})]


def targets(results: dict[str, Any]) -> list[list[str]]:
    """The rows of the targets table: target, measured (the worst case), goal, met."""
    records = results.get("records", [])
    big = max((r["N"] for r in records), default=2**20)
    small = min((r["N"] for r in records), default=2**14)
    single, both, times = tuple(SINGLE_MODELS), ("fp32", "bf16"), "{:.2f}×".format
    train = _sn(results, model=single, mode="training", dtype=both, N=big, T=lambda t: t >= 16)
    train = [r for r in train if r.get("floor_frac_gpu") is not None]
    t16 = _sn(results, model=single, mode="training", dtype=both, N=big, T=16)
    t16 = [r for r in t16 if r.get("floor_frac_wall") is not None]
    infer = _sn(results, model=single, mode="inference", dtype="fp32", N=big, T=lambda t: t >= 16)
    infer = [r for r in infer if r.get("floor_frac_gpu") is not None]
    gpu, wall = (lambda r: r["floor_frac_gpu"]), (lambda r: r["floor_frac_wall"])
    t64 = [r for r in train if r["T"] >= 64]
    sn_train = _sn(results, model=single, mode="training", T=(4, 16, 64))
    izh = _vs(_sn(results, model="Izhikevich", mode="training", N=big, T=(16, 64)), "sj014")
    vs_all = [r for r in _sn(results) if r.get("vs")]
    kept = _sn(results, model=single, mode="training", retained_bytes=lambda b: b is not None)
    rows = [  # name, records, value, goal, need, format
        ("training GPU time, fp32+bf16, T ≥ 16", train, gpu, "≥ 0.90 of floor", ("min", 0.9)),
        ("training wall time, fp32+bf16, T ≥ 64", t64, wall, "≥ 0.80 of floor", ("min", 0.8)),
        ("training wall time, fp32+bf16, T = 16", t16, wall, "≥ 0.60 of floor", ("min", 0.6)),
        ("inference GPU time, fp32, T ≥ 16", infer, gpu, "≥ 0.90 of floor", ("min", 0.9)),
        (
            "inference GPU time vs torch.compile, fp32, T ≥ 16",
            _vs(infer, "compile"),
            lambda r: r["vs"]["compile"]["gpu"],
            "≥ 0.95× (matching)",
            ("min", 0.95),
            times,
        ),
        *[
            (
                f"training wall speed-up vs {PEER_LABEL[p]}, T ∈ {{4, 16, 64}}",
                _vs(sn_train, p),
                lambda r, p=p: r["vs"][p]["wall"],
                f"≥ {goal}×",
                ("min", goal),
                times,
            )
            for p, goal in (("sj014", 3.0), ("sj200", 1.5))
        ],
        (
            "Izhikevich training wall speed-up vs SJ CuPy, T ∈ {16, 64}",
            izh,
            lambda r: r["vs"]["sj014"]["wall"],
            "≥ 3×",
            ("min", 3.0),
            times,
        ),
        *[
            (
                f"faster than every peer, every configuration ({k})",
                vs_all,
                lambda r, k=k: min(v[k] for v in r["vs"].values()),
                "> 1×",
                ("min", 1.0),
                times,
            )
            for k in ("wall", "gpu")
        ],
        (
            f"host overhead, training T = 4, N = {_n(small)}",
            _sn(results, model=single, mode="training", T=4, N=small),
            lambda r: r["wall_s"],
            "≤ 150 µs wall",
            ("max", 150e-6),
            lambda v: f"{v * 1e6:.0f} µs",
        ),
        (
            "memory retained for backward",
            kept,
            lambda r: r["retained_excess_B_per_neuron"],
            "≤ one [T, N] tensor + O(N) (excess ≤ 32 B/neuron)",
            ("max", 32.0),
            lambda v: f"one [T, N] + {v:.1f} B/neuron",
        ),
    ]
    return [*(_worst(*row) for row in rows), *_latency_targets(results)]  # type: ignore[arg-type]


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
    first_use = [v for r in der.values() if (v := r.get("sympy_first_use_s")) is not None]
    once = f"; plus SymPy's first use, once per process: {max(first_use or [0]) * 1e3:.0f} ms"
    totals = {m: r.get("total_s") for m, r in der.items()}
    rows.append(_worst_ms("derivation per zoo model", totals, 0.2, once if first_use else ""))
    sn_all = [r for r in results.get("records", []) if r.get("peer") == "symneuron"]
    bad = [r for r in sn_all if _ok(r) and not _passed(r)]
    failed = [r for r in sn_all if r.get("status") in ("error", "unsupported")]
    measured = f"{len(bad)} check failures, {len(failed)} errors of {len(sn_all)}"
    met = "✓" if sn_all and not bad and not failed else "✗"
    return [*rows, ["symneuron correct and running in every configuration", measured, "0", met]]


# ------------------------------------------------------------------ docs/performance.md


def markdown(results: dict[str, Any], plot_name: str | None = None) -> str:
    """``docs/performance.md``: ``templates/performance.md`` filled with the tables."""
    annotate(results)
    meta, workers = results.get("meta") or {}, results.get("workers") or {}
    bw, srcs = _get(results, "copy", "bandwidth_Bps"), results.get("sources") or []
    sj = {
        k: (workers.get(k) or {}).get("spikingjelly")
        or ("not run: " + str((workers.get(k) or {}).get("error", "—"))[:80])
        for k in ("sj014", "sj200")
    }
    files = ", ".join(
        f"`{s['file']}`"
        + (f" (copy {s['copy_Bps'] / 1e9:.0f} GB/s)" if s.get("copy_Bps") else "")
        + ("" if s.get("complete") else " (partial)")
        for s in srcs
    )
    copy_gib = (_get(results, "copy", "bytes") or 2**30) / 2**30
    copy_line = "- copy floor: not measured"
    if bw:
        copy_line = (
            f"- copy floor: **{bw / 1e9:.0f} GB/s** ({copy_gib:g} GiB device-to-device "
            "copy, bytes read + written)"
        )
    notes = [r.get("note") or "" for r in results.get("records", [])]
    return (
        (TEMPLATES / "performance.md")
        .read_text()
        .format_map(
            dict(
                sources=", ".join(s["file"] for s in srcs),
                gpu=meta.get("gpu", "?"),
                sj014=sj["sj014"],
                dry_run=_DRY_RUN if meta.get("dry_run") else "",
                sm_count=meta.get("sm_count", "?"),
                l2_mib=(meta.get("l2_bytes") or 0) / 2**20,
                driver=meta.get("driver", "?"),
                v=defaultdict(lambda: None, meta.get("versions") or {}),
                sj200=sj["sj200"],
                date=meta.get("date"),
                files=files,
                copy_line=copy_line,
                torch_peers=TORCH_PEERS[
                    "reference" if any("reference" in n for n in notes) else "loop"
                ],
                plot=f"![floor fractions and speed-ups]({plot_name})\n\n" if plot_name else "",
                targets=md_table(["target", "measured", "goal", "met"], targets(results), "lllc"),
                training=speedup_table(results, "training"),
                inference=speedup_table(results, "inference"),
                memory=memory_table(results),
                first_call=first_call_section(results),
                derivation=derivation_section(results),
                abs_training=absolute_table(results, "training"),
                abs_inference=absolute_table(results, "inference"),
                problems=problems_section(results),
            )
        )
    )


COLORS = {"symneuron": "C3", "sj014": "C0", "sj200": "C1", "torch": "C7", "compile": "C2"}


def _finish(ax: Any, drawn: bool) -> None:
    if drawn:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)


def _speedup_panel(ax: Any, recs: list[Rec], big: int, models: list[str]) -> None:
    """Bars: each peer's wall time over symneuron's, geomean over T, per model (fp32)."""
    from matplotlib.ticker import FuncFormatter

    peers = [p for p in PEERS[1:] if any(r["peer"] == p for r in recs)]
    sn = [r for r in _sn({"records": recs}, mode="training", dtype="fp32", N=big) if r.get("vs")]
    series = []
    for peer in peers:
        heights = []
        for m in models:
            vals = [r["vs"][peer]["wall"] for r in sn if r["model"] == m and peer in r["vs"]]
            heights.append(math.exp(statistics.mean(map(math.log, vals))) if vals else None)
        series.append((heights, dict(color=COLORS[peer], label=PEER_LABEL[peer])))
    grouped_bars(ax, len(models), series)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda val, _pos: f"{val:g}×"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda val, _pos: ""))
    ax.set_xticks(range(len(models)), models)
    ax.set_ylabel("symneuron wall speed-up (geomean over T)")
    ax.set_title(f"training, fp32, N = {_n(big)}: peer wall / symneuron wall")
    _finish(ax, any(h is not None for heights, _ in series for h in heights))


def plot(results: dict[str, Any], path: str | Path) -> Path:
    """Floor fractions (training, inference) of one model against T, and the wall speed-ups."""
    plt = pyplot()
    annotate(results)
    recs, path = [r for r in results.get("records", []) if _ok(r)], Path(path)
    big = max((r["N"] for r in recs), default=2**20)
    models_present = [m for m in MODELS if any(r["model"] == m for r in recs)]
    model = "LIF" if "LIF" in models_present else (models_present or ["LIF"])[0]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))

    def series(peer: str, mode: str, field: str) -> tuple[list[int], list[float]]:
        key = ("peer", "mode", "model", "dtype", "N")
        pts = sorted(
            (r["T"], r[field])
            for r in recs
            if r.get(field) is not None
            and tuple(r[k] for k in key) == (peer, mode, model, "fp32", big)
        )
        return [p[0] for p in pts], [p[1] for p in pts]

    for ax, mode in zip(axes[:2], ("training", "inference"), strict=True):
        drawn = False
        for peer in PEERS:
            ts, fracs = series(peer, mode, "floor_frac_gpu")
            if ts:
                drawn = True
                ax.plot(ts, fracs, "o-", color=COLORS[peer], label=PEER_LABEL[peer])
                ax.plot(*series(peer, mode, "floor_frac_wall"), "x:", color=COLORS[peer], alpha=0.6)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(0.9, color="k", lw=0.6, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("T")
        ax.set_ylabel("fraction of copy floor (o- GPU, x: wall)")
        ax.set_title(f"{mode}, {model}, fp32, N = {_n(big)}")
        _finish(ax, drawn)
    _speedup_panel(axes[2], recs, big, models_present)
    meta = results.get("meta") or {}
    dry = " (CPU DRY RUN)" if meta.get("dry_run") else ""
    date = str(meta.get("date", ""))[:10]
    title = f"symneuron benchmark — {meta.get('gpu', '?')}, {date}{dry}"
    return save_figure(fig, path, title, dpi=110)


# ------------------------------------------------------------- docs/performance_zoo.md

ZOO_TARGET, ZOO_DTYPES, ZOO_STEPS = 0.85, ("fp32", "bf16"), (16, 64)


def zoo_load(*paths: Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    """(model, dtype, T) -> the symneuron training record of bench_neurons results (merged
    in order)."""
    return {
        (r["model"], r["dtype"], r["T"]): r
        for path in paths
        for r in json.loads(path.read_text())["records"]
        if r.get("status") == "ok" and r.get("mode") == "training" and r.get("peer") == "symneuron"
    }


def zoo_bounds(ncu_dir: Path | None) -> dict[tuple[str, str], str]:
    """(model, dtype) -> "forward bound / backward bound" from the profile's CSV files."""
    import profile_ncu

    found: dict[tuple[str, str], dict[str, str]] = {}
    for path in sorted(ncu_dir.glob("*.csv")) if ncu_dir else ():
        for r in profile_ncu.read_csv(path, 64, 2**20):
            text = profile_ncu.bound(r)
            extra = (r.get("dram_bytes_per_elem") or 0.0) - r["floor_bytes_per_elem"]
            if extra > 0.1 * r["floor_bytes_per_elem"]:  # above the floor: X re-read, ...
                text += f" (+{extra:.0f} B)"
            kind = "fwd" if "_forward_" in r["kernel"] else "bwd"
            found.setdefault((r["model"], r["dtype"]), {})[kind] = text
    return {key: f"{v.get('fwd', '?')} / {v.get('bwd', '?')}" for key, v in found.items()}


def zoo_report(results: list[Path], ncu_dir: Path | None, before: Path | None) -> str:
    """``docs/performance_zoo.md``: fractions per model, dtype and T, bounds, before/after."""
    import profile_ncu

    data, recs, bound = json.loads(results[-1].read_text()), zoo_load(*results), zoo_bounds(ncu_dir)
    meta, copy = data.get("meta", {}), data.get("copy", {})
    named = [*results, *([ncu_dir] if ncu_dir else []), *([before] if before else [])]
    out = [
        (TEMPLATES / "performance_zoo.md")
        .read_text()
        .format(
            sources=", ".join(f"`{p.name}`" for p in named),
            gpu=meta.get("gpu") or "?",
            torch=meta.get("versions", {}).get("torch", "?"),
            date=meta.get("date", ""),
            copy=copy.get("bandwidth_Bps", copy.get("Bps", 0.0)) / 1e9,
            target=ZOO_TARGET,
            mem=profile_ncu.MEMORY_PCT,
            issue=profile_ncu.ISSUE_PCT,
        )
    ]
    models, rows, fracs = list(dict.fromkeys(m for m, _, _ in recs)), [], []
    for model in models:
        cells = [model, str(floor.extra_states(model))]
        for rec in (recs.get((model, d, t)) for d in ZOO_DTYPES for t in ZOO_STEPS):
            frac = None if rec is None else rec["floor_frac_gpu"]
            fracs += [] if frac is None else [frac]
            mark = "" if frac is None or frac < ZOO_TARGET else " ✓"
            cells.append("—" if frac is None else f"{frac:.2f}{mark}")
        rows.append(cells + [bound.get((model, d), "—") for d in ZOO_DTYPES])
    head = ["model", "k", *(f"{d} T={t}" for d in ZOO_DTYPES for t in ZOO_STEPS)]
    met = sum(f >= ZOO_TARGET for f in fracs)
    out += [
        md_table([*head, *(f"bound {d}" for d in ZOO_DTYPES)], rows),
        "",
        f"{met} of {len(fracs)} configurations meet the target.",
    ]
    if before is not None:
        old, rows = zoo_load(before), []
        for model in models:
            rows.append([model])
            for d in ZOO_DTYPES:
                a, b = old.get((model, d, 64)), recs.get((model, d, 64))
                if a is None or b is None:
                    rows[-1].append("—")
                    continue
                change = b["gpu_s"] / a["gpu_s"] - 1
                pct = "±0%" if abs(change) < 0.005 else f"{change:+.0%}"
                rows[-1].append(f"{a['gpu_s'] * 1e6:.0f} → {b['gpu_s'] * 1e6:.0f} µs ({pct})")
        before_md = (TEMPLATES / "zoo_before.md").read_text()
        out += ["", before_md, md_table(["model", *ZOO_DTYPES], rows)]

    return "\n".join(out) + "\n"


# ----------------------------------------------- the end-to-end section (bench_e2e.py)

#: Library key -> how the table and the plot name it (also the order of the rows).
E2E_LIBRARIES = {
    "floor": "no neuron (nn.ReLU)",
    "floor-cg": "no neuron + CUDA graphs",
    "symneuron": "symneuron",
    "symneuron-cg": "symneuron + CUDA graphs",
    "sj-cupy": "SpikingJelly 0.0.0.0.14 CuPy",
    "sj-triton": "SpikingJelly 2.0.0 Triton",
    "sj-torch": "SpikingJelly torch backend",
}
E2E_FLOORS = ("floor", "floor-cg")
E2E_NETWORKS = {"cnn": "CIFAR-10 CNN", "mlp": "SHD MLP"}
E2E_PRECISIONS = {
    "fp32": "fp32",
    "fp16": "AMP fp16 (autocast + GradScaler)",
    "bf16": "AMP bf16 (autocast)",
}


def _e2e_order(rec: dict[str, Any]) -> tuple[int, int, str, int]:
    def at(table: dict[str, str], key: str) -> int:
        return list(table).index(key) if key in table else 99

    model = "" if rec["library"] in E2E_FLOORS else rec["model"]
    return (
        at(E2E_NETWORKS, rec["network"]),
        at(E2E_PRECISIONS, rec["precision"]),
        model,
        at(E2E_LIBRARIES, rec["library"]),
    )


def _e2e_note(rec: dict[str, Any]) -> str:
    parts = [f"n/a: {rec.get('reason') or rec.get('status')}"] if rec.get("status") != "ok" else []
    parts += [str(rec[key]) for key in ("implementation", "note", "loss_check") if rec.get(key)]
    if rec.get("spike_rates") and rec["library"] not in E2E_FLOORS:
        parts.append("rates " + "/".join(f"{r:.2f}" for r in rec["spike_rates"]))
    text = "; ".join(parts).replace("|", "/").replace("\n", " ")
    return text[:160] + ("…" if len(text) > 160 else "")


def e2e_table(records: Iterable[dict[str, Any]]) -> str:
    """The results as one markdown table, floor rows first in each (network, precision)."""
    ms, added = _f, lambda value: _f(value, "+.2f")
    rows = [
        [
            E2E_NETWORKS.get(r["network"], r["network"]),
            r["precision"],
            "—" if r["library"] in E2E_FLOORS else r["model"],
            E2E_LIBRARIES.get(r["library"], r["library"]),
            ms(r.get("step_ms")),
            added(r.get("added_ms")),
            ms(r.get("wall_ms")),
            added(r.get("added_wall_ms")),
            _e2e_note(r),
        ]
        for r in sorted(records, key=_e2e_order)
    ]
    header = ["network", "precision", "neuron", "library", "step ms", "added ms", "wall ms"]
    return md_table([*header, "added wall ms", "notes"], rows, "llllrrrrl")


def e2e_markdown(results: dict[str, Any]) -> str:
    """A section for ``docs/performance_e2e.md``: setup lines, the table, how to read it."""
    meta, records = results.get("meta", {}), results.get("records", [])
    workers = sorted(results.get("workers", {}).items())
    sj = ", ".join(
        f"{kind}: {w.get('spikingjelly') or w.get('error', '?')}"
        for kind, w in workers
        if kind != "main"
    )
    partial = "" if results.get("complete", True) else "; ".join(results.get("stopped", []))
    cudagraphs = "\n\n" + (TEMPLATES / "e2e_cudagraphs.md").read_text().strip()
    cudagraphs = cudagraphs if any(r["library"].endswith("-cg") for r in records) else ""
    return (
        (TEMPLATES / "performance_e2e.md")
        .read_text()
        .format(
            partial=f"- **partial run**: {partial}\n" if partial else "",
            gpu=meta.get("gpu", "?"),
            v=defaultdict(lambda: None, meta.get("versions", {})),
            sj=sj or "none",
            date=meta.get("date"),
            argv=" ".join(meta.get("argv", [])),
            s=defaultdict(lambda: None, results.get("settings", {})),
            dry=" (**dry run**)" if meta.get("dry_run") else "",
            table=e2e_table(records),
            cudagraphs=cudagraphs,
        )
    )


def e2e_plot(results: dict[str, Any], path: str | Path) -> str | None:
    """Grouped bars of the time each library's neurons add over the floor, one panel per
    network x precision; returns an error text instead of raising (e.g. no matplotlib)."""
    try:
        plt = pyplot()
        recs = [r for r in results.get("records", []) if r["library"] not in E2E_FLOORS]
        panels = sorted(
            {(r["network"], r["precision"]) for r in recs},
            key=lambda p: _e2e_order(dict(network=p[0], precision=p[1], library="floor", model="")),
        )
        if not panels:
            return "no plot: no records"
        libs = [lib for lib in E2E_LIBRARIES if any(r["library"] == lib for r in recs)]
        colors = {lib: f"C{list(E2E_LIBRARIES).index(lib)}" for lib in libs}
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.0), squeeze=False)
        for ax, (net, prec) in zip(axes[0], panels, strict=True):
            mine = [r for r in recs if r["network"] == net and r["precision"] == prec]
            added = {(r["library"], r["model"]): r.get("added_ms") for r in mine}
            models = sorted({model for _, model in added})
            series = [
                ([added.get((lib, m)) for m in models], dict(color=color, label=E2E_LIBRARIES[lib]))
                for lib, color in colors.items()
            ]
            grouped_bars(ax, len(models), series, missing="n/a")
            ax.set_xticks(range(len(models)), models)
            ax.axhline(0, color="black", linewidth=0.5)
            ax.set_title(f"{E2E_NETWORKS.get(net, net)}, {prec}", fontsize=9)
            ax.set_ylabel("time added over the floor (ms / step)")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=8)
        title = f"Training step: time added by the neurons ({results['meta'].get('gpu')})"
        save_figure(fig, path, title, dpi=120, rect=(0, 0.08, 1, 0.95))
        return None
    except Exception as exc:  # noqa: BLE001
        return f"no plot: {type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    p = core.parser(__doc__)
    p.add_argument("results", nargs="+", type=Path, help="result JSON files (merged in order)")
    p.add_argument(
        "-o", "--output", type=Path, help="markdown (default docs/performance.md; --zoo: print)"
    )
    p.add_argument("--plot", help="also draw the plot to this PNG (linked from the markdown)")
    p.add_argument(
        "--zoo", action="store_true", help="the zoo page (bench_neurons.py --models zoo)"
    )
    p.add_argument("--ncu", type=Path, default=None, help="--zoo: profile_ncu.py CSV directory")
    p.add_argument("--before", type=Path, default=None, help="--zoo: an earlier zoo result JSON")
    args = p.parse_args(argv)
    if args.zoo:
        text = zoo_report(args.results, args.ncu, args.before)
        print(text, end="") if args.output is None else args.output.write_text(text)
        return 0
    results = load(args.results)
    out = args.output or Path(__file__).resolve().parent.parent / "docs" / "performance.md"
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
