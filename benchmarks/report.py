#!/usr/bin/env python3
"""Turn benchmark results (``benchmarks/results/*.json``) into ``docs/performance.md``.

::

    python3 benchmarks/report.py benchmarks/results/NVIDIA-H100-80GB-HBM3-2026-11-22.json
    python3 benchmarks/report.py a.json b.json -o docs/performance.md --plot docs/performance.png

Several files are merged in order (a later file's record for the same model, T,
N, dtype, mode and peer replaces an earlier one), so a matrix measured in
several runs becomes one report. Derived figures (floor fractions, speed-ups,
memory in [T, N] tensors) are recomputed here from the raw times, each with the
copy bandwidth of its own run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

PEERS = ["symneuron", "sj014", "sj200", "torch", "compile"]
PEER_LABEL = {
    "symneuron": "symneuron",
    "sj014": "SJ 0.0.0.0.14 CuPy",
    "sj200": "SJ 2.0.0",
    "torch": "torch eager",
    "compile": "torch.compile",
}
SHORT = {"sj014": "sj014", "sj200": "sj200", "torch": "torch", "compile": "compile"}
SINGLE_MODELS = ["IF", "LIF", "PLIF", "QIF", "EIF"]
MODELS = [*SINGLE_MODELS, "Izhikevich", "ALIF"]
#: extra state variables per model: each adds one saved [T, N] tensor (W̃) to training's
#: minimal traffic (forward writes it, backward reads it); inference keeps it in registers
EXTRA_STATES = {"Izhikevich": 1, "ALIF": 1, "CuLIF": 1, "AdEx": 1}
DTYPES = ["fp32", "bf16", "fp16"]
ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8}
#: DESIGN.md §5: inference reads X and writes S; training also writes H (forward), then
#: reads dL/dS and H and writes dL/dX (backward). Half for 16-bit types.
BYTES_PER_ELEMENT = {
    ("inference", 4): 8,
    ("training", 4): 24,
    ("inference", 2): 4,
    ("training", 2): 12,
    ("inference", 8): 16,
    ("training", 8): 48,
}
KEY = ("model", "T", "N", "dtype", "mode", "peer")


def floor_bytes_per_element(model: str, mode: str, itemsize: int) -> int:
    """Minimal bytes per element (DESIGN.md §5), plus 2 per saved extra state in training."""
    extra = 2 * itemsize * EXTRA_STATES.get(model, 0) if mode == "training" else 0
    return BYTES_PER_ELEMENT[(mode, itemsize)] + extra


METHOD_TEXT = """\
**Floor model** (DESIGN.md §5). Minimal traffic per element: inference 8 B (read X, write S),
training 24 B (forward: read X, write S and H; backward: read dL/dS and H, write dL/dX); half
of that for fp16/bf16. A model with extra states (Izhikevich, ALIF) saves one more [T, N]
tensor per state for the backward (W̃, written in the forward and read in the backward), so its
training floor is 32 B fp32 (16 B 16-bit). *floor* = (bytes / copy bandwidth) / time, so 1.0
means copy speed.
*wall* = median over calls, each started from an idle GPU (synchronize, time the call and
`spikes.sum().backward()` from the host, synchronize): host overhead counts. *GPU* = median
CUDA-event time per call, with a GPU sleep queued ahead of each batch of calls so that the
host's launch gaps are not counted. *Speed-up* = peer time / symneuron time (> 1: symneuron
faster). Every configuration is checked against symneuron's float64 torch reference before it
is timed (✓/✗; fp32: spikes equal up to threshold ties, 16-bit: ≥ 99 % equal with H rounded
to the storage type in the reference; the mismatching fraction is shown when not 0).

Peers: SpikingJelly 0.0.0.0.14 with `backend='cupy'`; SpikingJelly 2.0.0 with its default
CUDA implementation (Triton; it has no backend argument); a plain PyTorch loop over t
(heaviside forward, sigmoid surrogate as an `autograd.Function`, `torch.stack` of the spikes),
eager and under `torch.compile` (whole loop unrolled, N dynamic). All use the zoo's constants
and the Sigmoid(α = 4) surrogate; PLIF's w is learnable everywhere; Izhikevich runs with
a = 0.3, b = 0.2 everywhere (SpikingJelly's `IzhikevichNode`, whose 0.0.0.0.14 CuPy kernel is
fp32 only); ALIF has no SpikingJelly counterpart. Inputs rotate among several copies (about
256 MiB in all) so that a repeat does not read its input from L2.

N = 2^14 is the small-layer regime: its working set fits in L2, so floor fractions there can
exceed 1 and measure launch overhead more than bandwidth."""

MEMORY_TEXT = """\
`torch.cuda.memory_allocated()` after a forward with grad minus after one without, outputs
alive in both; in units of one [T, N] tensor of the storage dtype (MiB in brackets)."""


def _n(n: int) -> str:
    e = math.log2(n) if n > 0 else 0
    return f"2^{int(e)}" if e == int(e) else str(n)


def _get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


# --------------------------------------------------------------------------------------
# loading and derived metrics
# --------------------------------------------------------------------------------------


def load(paths: list[str | Path]) -> dict[str, Any]:
    """Merge result files; the later record for the same configuration and peer wins."""
    merged: dict[str, Any] | None = None
    records: dict[tuple[Any, ...], dict[str, Any]] = {}
    sources = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        bw = _get(data, "copy", "bandwidth_Bps")
        sources.append(
            {
                "file": Path(path).name,
                "date": _get(data, "meta", "date"),
                "gpu": _get(data, "meta", "gpu"),
                "copy_Bps": bw,
                "complete": data.get("complete"),
            }
        )
        for rec in data.get("records", []):
            rec = dict(rec)
            rec.setdefault("copy_Bps", bw)
            old = records.get(tuple(rec.get(k) for k in KEY))
            if old is not None and old.get("status") == "ok" and rec.get("status") == "skipped":
                continue  # a skipped entry never hides a measurement
            records[tuple(rec.get(k) for k in KEY)] = rec
        if merged is None:
            merged = data
        else:
            for section in ("first_call", "derivation", "workers"):
                for k, v in (data.get(section) or {}).items():
                    if v and not (
                        isinstance(v, dict) and v.get("error") and merged.get(section, {}).get(k)
                    ):
                        merged.setdefault(section, {})[k] = v
            merged.setdefault("events", []).extend(data.get("events", []))
    if merged is None:
        raise SystemExit("no result files given")
    merged["records"] = list(records.values())
    merged["sources"] = sources
    annotate(merged)
    return merged


def annotate(results: dict[str, Any]) -> dict[str, Any]:
    """Add floor fractions, memory in [T, N] units, and symneuron's speed-ups (in place)."""
    run_bw = _get(results, "copy", "bandwidth_Bps")
    by_cfg: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = defaultdict(dict)
    for rec in results.get("records", []):
        by_cfg[tuple(rec.get(k) for k in KEY[:-1])][rec.get("peer")] = rec
        if rec.get("status") != "ok":
            continue
        item = ITEMSIZE.get(rec["dtype"], 4)
        elements = rec["T"] * rec["N"]
        rec["floor_bytes"] = floor_bytes_per_element(rec["model"], rec["mode"], item) * elements
        bw = rec.get("copy_Bps") or run_bw
        if bw:
            floor_s = rec["floor_bytes"] / bw
            rec["floor_s"] = floor_s
            rec["floor_frac_gpu"] = floor_s / rec["gpu_s"] if rec.get("gpu_s") else None
            rec["floor_frac_wall"] = floor_s / rec["wall_s"] if rec.get("wall_s") else None
            rec["achieved_Bps"] = rec["floor_bytes"] / rec["gpu_s"] if rec.get("gpu_s") else None
        if rec.get("retained_bytes") is not None:
            rec["retained_tn"] = rec["retained_bytes"] / (elements * item)
            rec["retained_excess_B_per_neuron"] = (rec["retained_bytes"] - elements * item) / rec[
                "N"
            ]
    for peers in by_cfg.values():
        sn = peers.get("symneuron")
        if not sn or sn.get("status") != "ok":
            continue
        vs = {}
        for peer, rec in peers.items():
            if peer == "symneuron" or rec.get("status") != "ok":
                continue
            vs[peer] = {"wall": rec["wall_s"] / sn["wall_s"], "gpu": rec["gpu_s"] / sn["gpu_s"]}
        sn["vs"] = vs
    return results


def index(results: dict[str, Any]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {tuple(r.get(k) for k in KEY): r for r in results.get("records", [])}


def configs(results: dict[str, Any], mode: str | None = None) -> list[tuple[Any, ...]]:
    seen = {tuple(r.get(k) for k in KEY[:-1]) for r in results.get("records", [])}
    if mode:
        seen = {c for c in seen if c[4] == mode}
    mrank = {m: i for i, m in enumerate(MODELS)}
    drank = {d: i for i, d in enumerate(DTYPES)}
    return sorted(
        seen,
        key=lambda c: (c[4] != "training", drank.get(c[3], 9), -c[2], mrank.get(c[0], 9), c[1]),
    )


# --------------------------------------------------------------------------------------
# text
# --------------------------------------------------------------------------------------


def _status_cell(rec: dict[str, Any] | None) -> str:
    if rec is None:
        return "—"
    return {"unsupported": "unsup.", "error": "error", "skipped": "skip"}.get(
        rec.get("status", ""), "?"
    )


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


def _fallback(rec: dict[str, Any]) -> bool:
    return "reference" in str(rec.get("implementation") or "")


def _marks(rec: dict[str, Any]) -> str:
    """' ✗' when the peer failed its check, ' †' when it fell back to a torch loop."""
    out = "" if (rec.get("check") or {}).get("pass") else " ✗"
    return out + (" †" if _fallback(rec) else "")


def _check(rec: dict[str, Any] | None) -> str:
    chk = (rec or {}).get("check") or {}
    if not chk:
        return "—"
    mark = "✓" if chk.get("pass") else "✗"
    if not chk.get("identical", True):
        frac = chk.get("mismatch_frac", 0.0)
        mark += f" ({frac:.1e})" if frac < 1e-3 else f" ({frac:.1%})"
    return mark


def short_table(results: dict[str, Any]) -> str:
    """One line per configuration: symneuron's times, floor fraction, wall speed-up vs each peer."""
    annotate(results)
    idx = index(results)
    peers = [p for p in PEERS[1:] if any(r.get("peer") == p for r in results.get("records", []))]
    head = (
        f"{'model':<10} {'T':>4} {'N':>5} {'dtype':<5} {'mode':<9} {'wall_us':>9} {'gpu_us':>9} "
        f"{'floor':>6} {'fl_wall':>7} {'chk':<3} | wall speed-up vs "
        + " ".join(f"{SHORT[p]:>8}" for p in peers)
    )
    lines = [head, "-" * len(head)]
    for cfg in configs(results):
        sn = idx.get((*cfg, "symneuron"))
        model, t, n, dtype, mode = cfg
        row = f"{model:<10} {t:>4} {_n(n):>5} {dtype:<5} {mode:<9} "
        if sn and sn.get("status") == "ok":
            chk = "ok" if (sn.get("check") or {}).get("pass") else "BAD"
            row += (
                f"{sn['wall_s'] * 1e6:>9.1f} {sn['gpu_s'] * 1e6:>9.1f} "
                f"{_f(sn.get('floor_frac_gpu')):>6} {_f(sn.get('floor_frac_wall')):>7} {chk:<3} | "
            )
        else:
            row += f"{_status_cell(sn):>9} {'':>9} {'':>6} {'':>7} {'':<3} | "
        cells = []
        for p in peers:
            rec = idx.get((*cfg, p))
            if sn and sn.get("status") == "ok" and rec and rec.get("status") == "ok":
                cell = _x(sn["vs"][p]["wall"])
                if not (rec.get("check") or {}).get("pass"):
                    cell += "!"
            else:
                cell = _status_cell(rec)
            cells.append(f"{cell:>8}")
        lines.append(row + " ".join(cells))
    bw = _get(results, "copy", "bandwidth_Bps")
    lines.append(
        f"copy floor {bw / 1e9:.0f} GB/s (read + write); speed-up = peer time / symneuron time; "
        "'!' = peer failed its check"
        if bw
        else "no copy bandwidth measured"
    )
    return "\n".join(lines)


def _md_table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "l" * len(header)
    sep = ["---:" if a == "r" else "---" for a in align]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _peers_present(results: dict[str, Any]) -> list[str]:
    return [p for p in PEERS if any(r.get("peer") == p for r in results.get("records", []))]


def speedup_table(results: dict[str, Any], mode: str) -> str:
    idx = index(results)
    peers = [p for p in _peers_present(results) if p != "symneuron"]
    header = [
        "model",
        "T",
        "N",
        "dtype",
        "wall µs",
        "GPU µs",
        "floor (GPU)",
        "floor (wall)",
        "check",
    ]
    header += [f"vs {PEER_LABEL[p]} (wall / GPU)" for p in peers]
    rows = []
    for cfg in configs(results, mode):
        sn = idx.get((*cfg, "symneuron"))
        row = [cfg[0], str(cfg[1]), _n(cfg[2]), cfg[3]]
        if sn and sn.get("status") == "ok":
            row += [
                _us(sn["wall_s"]),
                _us(sn["gpu_s"]),
                _f(sn.get("floor_frac_gpu")),
                _f(sn.get("floor_frac_wall")),
                _check(sn),
            ]
        else:
            row += [_status_cell(sn), "", "", "", ""]
        for p in peers:
            rec = idx.get((*cfg, p))
            if sn and sn.get("status") == "ok" and rec and rec.get("status") == "ok":
                v = sn["vs"][p]
                cell = f"{_x(v['wall'])} / {_x(v['gpu'])}"
                cell += _marks(rec)
            else:
                cell = _status_cell(rec)
            row.append(cell)
        rows.append(row)
    return _md_table(header, rows, "lrrlrrrrl" + "r" * len(peers))


def absolute_table(results: dict[str, Any], mode: str) -> str:
    idx = index(results)
    peers = _peers_present(results)
    header = ["model", "T", "N", "dtype"] + [
        f"{PEER_LABEL[p]} wall / GPU µs (floor)" for p in peers
    ]
    rows = []
    for cfg in configs(results, mode):
        row = [cfg[0], str(cfg[1]), _n(cfg[2]), cfg[3]]
        for p in peers:
            rec = idx.get((*cfg, p))
            if rec and rec.get("status") == "ok":
                cell = (
                    f"{_us(rec['wall_s'])} / {_us(rec['gpu_s'])} ({_f(rec.get('floor_frac_gpu'))})"
                )
                cell += _marks(rec)
            else:
                cell = _status_cell(rec)
            row.append(cell)
        rows.append(row)
    return _md_table(header, rows, "lrrl" + "r" * len(peers))


def memory_table(results: dict[str, Any]) -> str:
    idx = index(results)
    peers = _peers_present(results)
    header = ["model", "T", "N", "dtype"] + [PEER_LABEL[p] for p in peers]
    rows = []
    for cfg in configs(results, "training"):
        row = [cfg[0], str(cfg[1]), _n(cfg[2]), cfg[3]]
        any_value = False
        for p in peers:
            rec = idx.get((*cfg, p))
            if rec and rec.get("retained_tn") is not None:
                any_value = True
                row.append(f"{rec['retained_tn']:.2f} ({rec['retained_bytes'] / 2**20:.1f} MiB)")
            else:
                row.append(_status_cell(rec) if rec and rec.get("status") != "ok" else "—")
        if any_value:
            rows.append(row)
    if not rows:
        return "_No memory measurements (CPU dry run, or no training configurations)._"
    return _md_table(header, rows, "lrrl" + "r" * len(peers))


def first_call_section(results: dict[str, Any]) -> str:
    fc = results.get("first_call") or {}
    if not fc:
        return "_Not measured._"
    rows = []
    for impl in ("symneuron", "sj014", "sj200"):
        phases = fc.get(impl)
        if not phases:
            continue
        models = sorted(
            {m for ph in phases.values() for m in (ph.get("models") or {})},
            key=lambda m: MODELS.index(m) if m in MODELS else 9,
        )
        for model in models:
            cold = _get(phases, "cold", "models", model) or {}
            warm = _get(phases, "warm", "models", model) or {}
            err = cold.get("error") or warm.get("error")
            rows.append(
                [
                    PEER_LABEL[impl],
                    model,
                    _ms(cold.get("first_s")),
                    _ms(warm.get("first_s")),
                    _ms(warm.get("second_s")),
                    ("error: " + err.splitlines()[0][:80]) if err else "",
                ]
            )
        for phase in ("cold", "warm"):
            if _get(phases, phase, "error"):
                rows.append(
                    [PEER_LABEL[impl], f"({phase})", "", "", "", str(phases[phase]["error"])[:120]]
                )
    sym = fc.get("symneuron") or {}
    extra = []
    for phase in ("cold", "warm"):
        ph = sym.get(phase) or {}
        if ph.get("runtime_init_s") is not None:
            extra.append(
                f"{phase}: CuPy/NVRTC start {_ms(ph['runtime_init_s'])} ms, "
                f"import symneuron {_ms(ph.get('import_s'))} ms, "
                f"CUDA init {_ms(ph.get('cuda_init_s'))} ms"
            )
    t = _get(sym, "cold", "T") or _get(fc, "sj014", "cold", "T")
    n = _get(sym, "cold", "N") or _get(fc, "sj014", "cold", "N")
    text = (
        f"First forward + backward in a fresh process, fp32, T = {t}, N = {n} "
        "(the kernels' compile time does not depend on the size). *Fresh cache*: empty "
        "`SYMNEURON_CACHE`, `CUPY_CACHE_DIR`, `TRITON_CACHE_DIR`; *warm disk cache*: a second "
        "fresh process reusing them. symneuron's figure per model excludes the one-time runtime "
        "start listed below the table (a user's very first call pays it once); the SpikingJelly "
        "figures include everything after CUDA initialisation.\n\n"
    )
    text += _md_table(
        ["implementation", "model", "fresh cache ms", "warm disk cache ms", "2nd call ms", "note"],
        rows,
        "llrrrl",
    )
    if extra:
        text += "\n\nsymneuron one-time costs: " + "; ".join(extra) + "."
    return text


def _ms(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e3:.1f}"


def derivation_section(results: dict[str, Any]) -> str:
    der = results.get("derivation") or {}
    if not der:
        return "_Not measured._"
    rows = []
    for model in sorted(der, key=lambda m: MODELS.index(m) if m in MODELS else 9):
        r = der[model]
        if r.get("error"):
            rows.append([model, "", "", "", "", "error: " + r["error"].splitlines()[0][:100]])
            continue
        rows.append(
            [
                model,
                _ms(r.get("ctor_s")),
                _ms(r.get("spec_s")),
                _ms(r.get("source_s")),
                _ms(r.get("total_s")),
                _ms(r.get("sympy_first_use_s")),
                _ms(r.get("import_s")),
            ]
        )
    return (
        "Each model in a fresh process: `ctor()` (validation), `neuron.spec()` (SymPy "
        "derivation and CSE), `neuron.source('cuda', 'float32')` (printing; every kernel "
        "variant, where a first call renders only the two it runs). *SymPy first use*: "
        "SymPy's one-off costs in a process (lazy imports on first use), measured on a "
        "throwaway neuron before the model and not counted in its total (runs without "
        "this column counted them in the first model's ctor).\n\n"
        + _md_table(
            [
                "model",
                "ctor ms",
                "spec() ms",
                "source() ms",
                "total ms",
                "SymPy first use ms",
                "import symneuron ms",
            ],
            rows,
            "lrrrrrr",
        )
    )


# --------------------------------------------------------------------------------------
# targets of the performance issue
# --------------------------------------------------------------------------------------


def _sn(results: dict[str, Any], **where: Any) -> list[dict[str, Any]]:
    out = []
    for r in results.get("records", []):
        if r.get("peer") != "symneuron" or r.get("status") != "ok":
            continue
        ok = True
        for k, v in where.items():
            if callable(v):
                ok = ok and v(r.get(k))
            elif isinstance(v, (list, tuple, set)):
                ok = ok and r.get(k) in v
            else:
                ok = ok and r.get(k) == v
        if ok:
            out.append(r)
    return out


def _where(rec: dict[str, Any]) -> str:
    return f"{rec['model']} T={rec['T']} N={_n(rec['N'])} {rec['dtype']}"


def targets(results: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    big = max((r["N"] for r in results.get("records", [])), default=2**20)

    def add(
        name: str, recs: list[dict[str, Any]], value: Any, goal: str, ok: Any, fmt: Any = None
    ) -> None:
        if not recs:
            rows.append([name, "no data", goal, "—"])
            return
        worst = min(recs, key=value) if ok[0] == "min" else max(recs, key=value)
        v = value(worst)
        passed = v >= ok[1] if ok[0] == "min" else v <= ok[1]
        text = fmt(v) if fmt else f"{v:.2f}"
        rows.append([name, f"{text} (worst: {_where(worst)})", goal, "✓" if passed else "✗"])

    # issue 3's rows cover the single-state zoo; the stateful models have their own row
    single = tuple(SINGLE_MODELS)
    recs = _sn(
        results,
        model=single,
        mode="training",
        dtype=("fp32", "bf16"),
        N=big,
        T=lambda t: t >= 16,
    )
    recs = [r for r in recs if r.get("floor_frac_gpu") is not None]
    add(
        "training GPU time, fp32+bf16, T ≥ 16",
        recs,
        lambda r: r["floor_frac_gpu"],
        "≥ 0.90 of floor",
        ("min", 0.90),
    )
    recs = [r for r in recs if r["T"] >= 64]
    add(
        "training wall time, fp32+bf16, T ≥ 64",
        recs,
        lambda r: r["floor_frac_wall"],
        "≥ 0.80 of floor",
        ("min", 0.80),
    )
    recs = _sn(results, model=single, mode="training", dtype=("fp32", "bf16"), N=big, T=16)
    recs = [r for r in recs if r.get("floor_frac_wall") is not None]
    add(
        "training wall time, fp32+bf16, T = 16",
        recs,
        lambda r: r["floor_frac_wall"],
        "≥ 0.60 of floor",
        ("min", 0.60),
    )
    recs = _sn(results, model=single, mode="inference", dtype="fp32", N=big, T=lambda t: t >= 16)
    recs = [r for r in recs if r.get("floor_frac_gpu") is not None]
    add(
        "inference GPU time, fp32, T ≥ 16",
        recs,
        lambda r: r["floor_frac_gpu"],
        "≥ 0.90 of floor",
        ("min", 0.90),
    )
    recs2 = [r for r in recs if "compile" in (r.get("vs") or {})]
    add(
        "inference GPU time vs torch.compile, fp32, T ≥ 16",
        recs2,
        lambda r: r["vs"]["compile"]["gpu"],
        "≥ 0.95× (matching)",
        ("min", 0.95),
        lambda v: f"{v:.2f}×",
    )
    for peer, goal in (("sj014", 3.0), ("sj200", 1.5)):
        recs = [
            r
            for r in _sn(results, model=single, mode="training", T=(4, 16, 64))
            if peer in (r.get("vs") or {})
        ]
        add(
            f"training wall speed-up vs {PEER_LABEL[peer]}, T ∈ {{4, 16, 64}}",
            recs,
            lambda r, p=peer: r["vs"][p]["wall"],
            f"≥ {goal}×",
            ("min", goal),
            lambda v: f"{v:.2f}×",
        )
    recs = [
        r
        for r in _sn(results, model="Izhikevich", mode="training", N=big, T=(16, 64))
        if "sj014" in (r.get("vs") or {})
    ]
    add(
        "Izhikevich training wall speed-up vs SJ CuPy, T ∈ {16, 64}",
        recs,
        lambda r: r["vs"]["sj014"]["wall"],
        "≥ 3×",
        ("min", 3.0),
        lambda v: f"{v:.2f}×",
    )
    for kind in ("wall", "gpu"):
        recs = [r for r in _sn(results) if r.get("vs")]
        add(
            f"faster than every peer, every configuration ({kind})",
            recs,
            lambda r, k=kind: min(v[k] for v in r["vs"].values()),
            "> 1×",
            ("min", 1.0),
            lambda v: f"{v:.2f}×",
        )
    small = min((r["N"] for r in results.get("records", [])), default=2**14)
    recs = _sn(results, model=single, mode="training", T=4, N=small)
    add(
        f"host overhead, training T = 4, N = {_n(small)}",
        recs,
        lambda r: r["wall_s"],
        "≤ 150 µs wall",
        ("max", 150e-6),
        lambda v: f"{v * 1e6:.0f} µs",
    )
    recs = [
        r
        for r in _sn(results, model=single, mode="training")
        if r.get("retained_bytes") is not None
    ]
    add(
        "memory retained for backward",
        recs,
        lambda r: r["retained_excess_B_per_neuron"],
        "≤ one [T, N] tensor + O(N) (excess ≤ 32 B/neuron)",
        ("max", 32.0),
        lambda v: f"one [T, N] + {v:.1f} B/neuron",
    )
    fc = results.get("first_call") or {}
    cold = _get(fc, "symneuron", "cold", "models") or {}
    warm = _get(fc, "symneuron", "warm", "models") or {}
    for name, data, limit in (
        ("first call, fresh cache", cold, 0.5),
        ("first call, warm disk cache", warm, 0.03),
    ):
        vals = {m: r["first_s"] for m, r in data.items() if r.get("first_s") is not None}
        if vals:
            m = max(vals, key=vals.get)  # type: ignore[arg-type]
            rows.append(
                [
                    name,
                    f"{vals[m] * 1e3:.0f} ms (worst: {m})",
                    f"≤ {limit * 1e3:.0f} ms",
                    "✓" if vals[m] <= limit else "✗",
                ]
            )
        else:
            rows.append([name, "no data", f"≤ {limit * 1e3:.0f} ms", "—"])
    der = {
        m: r.get("total_s")
        for m, r in (results.get("derivation") or {}).items()
        if r.get("total_s") is not None
    }
    if der:
        m = max(der, key=der.get)  # type: ignore[arg-type]
        first_use = [
            r["sympy_first_use_s"]
            for r in (results.get("derivation") or {}).values()
            if r.get("sympy_first_use_s") is not None
        ]
        once = (
            f"; plus SymPy's first use, once per process: {max(first_use) * 1e3:.0f} ms"
            if first_use
            else ""
        )
        rows.append(
            [
                "derivation per zoo model",
                f"{der[m] * 1e3:.0f} ms (worst: {m}){once}",
                "≤ 200 ms",
                "✓" if der[m] <= 0.2 else "✗",
            ]
        )
    else:
        rows.append(["derivation per zoo model", "no data", "≤ 200 ms", "—"])
    sn_all = [r for r in results.get("records", []) if r.get("peer") == "symneuron"]
    bad = [r for r in sn_all if r.get("status") == "ok" and not (r.get("check") or {}).get("pass")]
    failed = [r for r in sn_all if r.get("status") in ("error", "unsupported")]
    rows.append(
        [
            "symneuron correct and running in every configuration",
            f"{len(bad)} check failures, {len(failed)} errors of {len(sn_all)}",
            "0",
            "✓" if sn_all and not bad and not failed else "✗",
        ]
    )
    return rows


def _cfg_name(r: dict[str, Any]) -> str:
    return f"{r['model']}/T{r['T']}/{_n(r['N'])}/{r['dtype']}/{r['mode']}"


def problems_section(results: dict[str, Any]) -> str:
    groups: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for r in results.get("records", []):
        if r.get("status") in ("error", "unsupported", "skipped"):
            msg = (r.get("error") or "").strip().splitlines()[0][:160] if r.get("error") else ""
            groups[(r["peer"], r["status"], msg)].append(
                f"{r['model']}/T{r['T']}/{_n(r['N'])}/{r['dtype']}/{r['mode']}"
            )
        elif r.get("status") == "ok" and not (r.get("check") or {}).get("pass"):
            chk = r.get("check") or {}
            groups[(r["peer"], "check failed", chk.get("rule", ""))].append(
                f"{_cfg_name(r)} ({chk.get('mismatch_frac', 0):.2%})"
            )
        if _fallback(r):
            groups[(r["peer"], "note", r["implementation"])].append(
                f"{r['model']}/T{r['T']}/{_n(r['N'])}/{r['dtype']}/{r['mode']}"
            )
    if not groups:
        return "_None._"
    lines = []
    for (peer, status, msg), where in sorted(groups.items()):
        shown = ", ".join(where[:6]) + (f" and {len(where) - 6} more" if len(where) > 6 else "")
        lines.append(
            f"- **{PEER_LABEL.get(peer, peer)}**, {status} ({len(where)}): {msg or '—'}"
            f"  \n  {shown}"
        )
    return "\n".join(lines)


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
    out = [
        "# Performance",
        "",
        "<!-- generated by benchmarks/report.py from "
        + ", ".join(s["file"] for s in srcs)
        + "; do not edit -->",
        "",
    ]
    if meta.get("dry_run"):
        out += [
            "> **CPU dry run**: these figures only exercise the pipeline; "
            "they say nothing about GPU speed.",
            "",
        ]
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
        f"- date {meta.get('date')}; run files: "
        + ", ".join(
            f"`{s['file']}`"
            + (f" (copy {s['copy_Bps'] / 1e9:.0f} GB/s)" if s.get("copy_Bps") else "")
            + ("" if s.get("complete") else " (partial)")
            for s in srcs
        ),
        f"- copy floor: **{bw / 1e9:.0f} GB/s** ({copy_gib:g} GiB device-to-device copy, "
        "bytes read + written)"
        if bw
        else "- copy floor: not measured",
        "",
        METHOD_TEXT,
        "",
    ]
    if plot_name:
        out += [f"![floor fractions and speed-ups]({plot_name})", ""]
    out += [
        "## Targets",
        "",
        "Issue 3's rows cover the single-state zoo (IF, LIF, PLIF, QIF, EIF); the Izhikevich "
        "row is the target for the neurons with extra states.",
        "",
        _md_table(["target", "measured", "goal", "met"], targets(results), "lllc"),
        "",
        "## Training (forward + backward)",
        "",
        "symneuron's times, floor fractions and check, then its speed-up over each peer "
        "(wall / GPU). ✗: the peer failed its check; †: the peer fell back to its torch loop.",
        "",
        speedup_table(results, "training"),
        "",
        "## Inference (forward, no grad)",
        "",
        speedup_table(results, "inference"),
        "",
        "## Memory retained for backward",
        "",
        MEMORY_TEXT,
        "",
        memory_table(results),
        "",
        "## First-call latency",
        "",
        first_call_section(results),
        "",
        "## Symbolic derivation",
        "",
        derivation_section(results),
        "",
        "## Absolute times",
        "",
        "### Training",
        "",
        absolute_table(results, "training"),
        "",
        "### Inference",
        "",
        absolute_table(results, "inference"),
        "",
        "## Failures, unsupported and skipped",
        "",
        problems_section(results),
        "",
    ]
    return "\n".join(out)


# --------------------------------------------------------------------------------------
# plot
# --------------------------------------------------------------------------------------


def _series(
    recs: list[dict[str, Any]], peer: str, mode: str, model: str, n: int, field: str
) -> list[tuple[int, float]]:
    """(T, field) points of one peer's fp32 records for the plot, sorted by T."""
    return sorted(
        (r["T"], r[field])
        for r in recs
        if r["peer"] == peer
        and r["mode"] == mode
        and r["model"] == model
        and r["dtype"] == "fp32"
        and r["N"] == n
        and r.get(field) is not None
    )


def plot(results: dict[str, Any], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    annotate(results)
    recs = [r for r in results.get("records", []) if r.get("status") == "ok"]
    path = Path(path)
    big = max((r["N"] for r in recs), default=2**20)
    models_present = [m for m in MODELS if any(r["model"] == m for r in recs)]
    model = "LIF" if "LIF" in models_present else (models_present[0] if models_present else "LIF")
    colors = {"symneuron": "C3", "sj014": "C0", "sj200": "C1", "torch": "C7", "compile": "C2"}
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    for ax, mode in zip(axes[:2], ("training", "inference"), strict=True):
        drawn = False
        for peer in PEERS:
            pts = _series(recs, peer, mode, model, big, "floor_frac_gpu")
            if pts:
                drawn = True
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    "o-",
                    color=colors[peer],
                    label=PEER_LABEL[peer],
                )
                wpts = _series(recs, peer, mode, model, big, "floor_frac_wall")
                ax.plot(
                    [p[0] for p in wpts], [p[1] for p in wpts], "x:", color=colors[peer], alpha=0.6
                )
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(0.9, color="k", lw=0.6, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("T")
        ax.set_ylabel("fraction of copy floor (o- GPU, x: wall)")
        ax.set_title(f"{mode}, {model}, fp32, N = {_n(big)}")
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax = axes[2]
    peers = [p for p in PEERS[1:] if any(r["peer"] == p for r in recs)]
    sn = [
        r
        for r in recs
        if r["peer"] == "symneuron"
        and r["mode"] == "training"
        and r["dtype"] == "fp32"
        and r["N"] == big
        and r.get("vs")
    ]
    width = 0.8 / max(1, len(peers))
    drawn = False
    for i, peer in enumerate(peers):
        heights = []
        for m in models_present:
            vals = [r["vs"][peer]["wall"] for r in sn if r["model"] == m and peer in r["vs"]]
            heights.append(
                math.exp(statistics.mean(math.log(v) for v in vals)) if vals else float("nan")
            )
        if any(math.isfinite(h) for h in heights):
            drawn = True
        ax.bar(
            [j + (i - (len(peers) - 1) / 2) * width for j in range(len(models_present))],
            heights,
            width,
            color=colors[peer],
            label=PEER_LABEL[peer],
        )
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda val, _pos: f"{val:g}×"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda val, _pos: ""))
    ax.set_xticks(range(len(models_present)), models_present)
    ax.set_ylabel("symneuron wall speed-up (geomean over T)")
    ax.set_title(f"training, fp32, N = {_n(big)}: peer wall / symneuron wall")
    if drawn:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    meta = results.get("meta") or {}
    fig.suptitle(
        f"symneuron benchmark — {meta.get('gpu', '?')}, {str(meta.get('date', ''))[:10]}"
        + (" (CPU DRY RUN)" if meta.get("dry_run") else "")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="result JSON files (merged in order)")
    p.add_argument(
        "-o", "--output", default=None, help="markdown output (default docs/performance.md)"
    )
    p.add_argument(
        "--plot", default=None, help="also draw the plot to this PNG (linked from the markdown)"
    )
    p.add_argument("--short", action="store_true", help="print the short text table and exit")
    args = p.parse_args(argv)
    results = load(args.results)
    if args.short:
        print(short_table(results))
        return 0
    out = (
        Path(args.output)
        if args.output
        else Path(__file__).resolve().parent.parent / "docs" / "performance.md"
    )
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
