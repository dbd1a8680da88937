"""The recurrent benchmark's results: its tables, speed-ups and plots, and a sweep split
into shards (one process a GPU) whose files are merged into one.

    python3 benchmarks/recurrent.py --sweep --shard 0/4 --out r0.json   # one per GPU
    python3 benchmarks/recurrent.py --merge r0.json r1.json r2.json r3.json --out all.json
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import core

#: the rows a speed-up is taken against (the best of them graphed, the best eager)
PEERS = ("torch", "spikingjelly", "torch.compile")
#: a step's host cost (launches of the peers' eager loops), in batch rows × neurons² of
#: recurrent product that cost as much: the eager torch loop took about 0.4 ms a step of
#: T at every size on an H200, and the graphed step 0.26 ms at 64 × 4096 (2.4e-10 ms per
#: row × neuron², 1.7e9 rows × neurons² for 0.4 ms)
HOST_COST = 1.7e9

Job = tuple[str, int, int, int]  # (amp, B, H, T)


def config_name(r: core.Rec) -> str:
    return f"B={r['B']} H={r['H']} T={r['T']} {r.get('amp', 'fp32')}"


def cost(job: Job) -> float:
    """A configuration's relative run time: T steps, each a host cost and a product of
    B·H² (:data:`HOST_COST`)."""
    _, b, h, t = job
    return t * (HOST_COST + b * h * h)


def shard(jobs: Sequence[Job], index: int, count: int) -> list[Job]:
    """The ``index``-th of ``count`` shards of ``jobs``, balanced by :func:`cost` (the
    costliest first, each to the shard with the least so far), in their given order."""
    if not 0 <= index < count:
        raise SystemExit(f"--shard {index}/{count}: K/N with 0 <= K < N, e.g. 0/4")
    loads, owner = [0.0] * count, {}
    for job in sorted(jobs, key=cost, reverse=True):
        least = loads.index(min(loads))
        owner[job], loads[least] = least, loads[least] + cost(job)
    return [job for job in jobs if owner[job] == index]


def merge(paths: Sequence[Path]) -> dict[str, Any]:
    """One result of several runs' files (the shards of a sweep): their records, the
    union of what each refused, and each run's meta."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    records = [r for run in runs for r in run["records"]]
    refused = {k: v for run in runs for k, v in run["refused"].items()}
    meta = dict(runs[0]["meta"], shards=[run["meta"] for run in runs])
    return dict(meta=meta, settings=runs[0]["settings"], refused=refused, records=records)


def table(records: list[core.Rec]) -> str:
    """Per configuration and row: firing rate, eager and graphed ms per step."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in records:
        cell = f"{r['step_ms']:.3f}" if r["status"] == "ok" else f"error: {r['error'][:60]}"
        key = (r["B"], r["H"], r["T"], r.get("amp", "fp32"), r["row"])
        row = rows.setdefault(key, {"rate": r.get("rate")})
        row[r["mode"]] = cell.replace("|", "/").replace("\n", " ")
    body = [
        [
            *map(str, key[:4]),
            key[4],
            "—" if v["rate"] is None else f"{v['rate']:.3f}",
            v.get("eager", "—"),
            v.get("graphed", "—"),
        ]
        for key, v in rows.items()
    ]
    head = ["B", "H", "T", "amp", "row", "firing rate", "eager ms", "graphed ms"]
    return core.md_table(head, body, "rrrllrrr")


def speedups(records: list[core.Rec]) -> list[core.Rec]:
    """Per configuration and mode: symneuron's time against the best peer's and the
    floor's (the floor of the same precision: float32's, or bf16's under autocast)."""
    ms: dict[tuple[Any, ...], dict[str, float]] = {}
    for r in records:
        if r["status"] == "ok":
            key = (r["B"], r["H"], r["T"], r.get("amp", "fp32"), r["mode"])
            ms.setdefault(key, {})[r["row"]] = r["step_ms"]
    out = []
    for (b, h, t, amp, mode), rows in ms.items():
        peers = {p: rows[p] for p in PEERS if p in rows}
        if "symneuron" not in rows or not peers:
            continue
        mine, best = rows["symneuron"], min(peers, key=peers.__getitem__)
        rec = dict(B=b, H=h, T=t, amp=amp, mode=mode, symneuron_ms=mine, best_peer=best)
        rec["best_peer_ms"], rec["speedup_vs_best_peer"] = peers[best], peers[best] / mine
        if "floor" in rows:
            rec["over_floor"] = mine / rows["floor"]
        if "feedforward" in rows:
            rec["over_feedforward"] = mine / rows["feedforward"]
        out.append(rec)
    return out


def speedup_table(found: list[core.Rec]) -> str:
    """symneuron against the best peer, the floor and the feedforward step, per
    configuration and mode."""

    def ratio(r: core.Rec, key: str) -> str:
        return f"{r[key]:.2f}" if key in r else "—"

    body = [
        [
            *(str(r[k]) for k in ("B", "H", "T", "amp", "mode")),
            f"{r['symneuron_ms']:.3f}",
            f"{r['speedup_vs_best_peer']:.2f} ({r.get('best_peer', '?')})",
            ratio(r, "over_floor"),
            ratio(r, "over_feedforward"),
        ]
        for r in found
    ]
    head = ["B", "H", "T", "amp", "mode", "symneuron ms", "× best peer", "/ floor", "/ ff"]
    return core.md_table(head, body, "rrrllrrrr")


def plot_speedups(found: list[core.Rec], path: Path, title: str) -> None:
    """Speed-up over the best peer against the layer's size: a panel per precision and
    mode, a line per batch and T."""
    plt = core.pyplot()
    panels = sorted({(r["amp"], r["mode"]) for r in found}, key=lambda p: (p[1], p[0]))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), squeeze=False)
    for ax, (amp, mode) in zip(axes[0], panels, strict=True):
        lines = sorted({(r["B"], r["T"]) for r in found if (r["amp"], r["mode"]) == (amp, mode)})
        for i, (b, t) in enumerate(lines):
            mine = sorted(
                (r["H"], r["speedup_vs_best_peer"])
                for r in found
                if (r["B"], r["T"], r["amp"], r["mode"]) == (b, t, amp, mode)
            )
            ax.plot(*zip(*mine, strict=True), marker="o", color=f"C{i % 10}", label=f"B={b} T={t}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("neurons of the recurrent layer")
        ax.set_ylabel("best peer's ms / symneuron's ms")
        ax.set_title(f"{amp}, {mode}", fontsize=9)
        ax.legend(fontsize=6)
    core.save_figure(fig, path, title, dpi=110)


def plot(records: list[core.Rec], path: Path, title: str) -> None:
    """Milliseconds per step of each row (eager, graphed hatched), one panel per config."""
    plt, configs = core.pyplot(), list(dict.fromkeys(config_name(r) for r in records))
    fig, axes = plt.subplots(1, len(configs), figsize=(4.5 * len(configs), 4), squeeze=False)
    for ax, config in zip(axes[0], configs, strict=True):
        mine = [r for r in records if config_name(r) == config and r["status"] == "ok"]
        ms = {(r["row"], r["mode"]): r["step_ms"] for r in mine}
        names = list(dict.fromkeys(row for row, _ in ms))
        colors = [f"C{i}" for i in range(len(names))]
        series = [([ms.get((n, "eager")) for n in names], dict(color=colors))]
        series.append(([ms.get((n, "graphed")) for n in names], dict(color=colors, hatch="//")))
        core.grouped_bars(ax, len(names), series)
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("ms per training step (hatched: CUDA graph)")
        ax.set_title(config, fontsize=9)
    core.save_figure(fig, path, title, dpi=110)


def write(out: Path, result: dict[str, Any], plots: bool = True) -> list[core.Rec]:
    """``result`` with its speed-ups to ``out`` (JSON), and, with ``plots``, its plots
    beside it; the speed-ups."""
    found = speedups(result["records"])
    core.write_json(out, {**result, "speedups": found})
    if plots:
        title = f"Recurrent SNN training step — {result['meta']['gpu']}"
        if len({config_name(r) for r in result["records"]}) <= 8:
            plot(result["records"], out.with_suffix(".png"), title)
        if found:
            plot_speedups(found, out.with_name(out.stem + "-speedup.png"), title)
    return found
