#!/usr/bin/env python3
"""The end-to-end benchmark's report: its JSON -> a markdown section and a bar plot.

``bench_e2e.py`` calls :func:`markdown` and :func:`plot` at the end of a run, and redoes
both from a saved JSON with ``--report``::

    python3 benchmarks/bench_e2e.py --report e2e.json --md e2e.md --plot e2e.png
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core import md_table, pyplot

#: Library key -> how the table and the plot name it (also the order of the rows).
LIBRARIES = {
    "floor": "no neuron (nn.ReLU)",
    "floor-cg": "no neuron + CUDA graphs",
    "symneuron": "symneuron",
    "symneuron-cg": "symneuron + CUDA graphs",
    "sj-cupy": "SpikingJelly 0.0.0.0.14 CuPy",
    "sj-triton": "SpikingJelly 2.0.0 Triton",
    "sj-torch": "SpikingJelly torch backend",
}
FLOORS = ("floor", "floor-cg")
NETWORKS = {"cnn": "CIFAR-10 CNN", "mlp": "SHD MLP"}
PRECISIONS = {
    "fp32": "fp32",
    "fp16": "AMP fp16 (autocast + GradScaler)",
    "bf16": "AMP bf16 (autocast)",
}


def _ms(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:+.2f}" if value < 0 else f"{value:.2f}"


def _added(value: Any) -> str:
    return "—" if value is None else f"{value:+.2f}"


def _order(rec: dict[str, Any]) -> tuple[int, int, str, int]:
    nets, precs, libs = list(NETWORKS), list(PRECISIONS), list(LIBRARIES)
    return (
        nets.index(rec["network"]) if rec["network"] in nets else 99,
        precs.index(rec["precision"]) if rec["precision"] in precs else 99,
        "" if rec["library"] in FLOORS else rec["model"],
        libs.index(rec["library"]) if rec["library"] in libs else 99,
    )


def _note(rec: dict[str, Any]) -> str:
    parts = []
    if rec.get("status") != "ok":
        parts.append(f"n/a: {rec.get('reason') or rec.get('status')}")
    for key in ("implementation", "note"):
        if rec.get(key):
            parts.append(str(rec[key]))
    if rec.get("loss_check"):
        parts.append(rec["loss_check"])
    if rec.get("spike_rates") and rec["library"] not in FLOORS:
        parts.append("rates " + "/".join(f"{r:.2f}" for r in rec["spike_rates"]))
    text = "; ".join(parts).replace("|", "/").replace("\n", " ")
    return text[:160] + ("…" if len(text) > 160 else "")


def table(records: Iterable[dict[str, Any]]) -> str:
    """The results as one markdown table, floor rows first in each (network, precision)."""
    header = ["network", "precision", "neuron", "library", "step ms", "added ms", "wall ms"]
    rows = [
        [
            NETWORKS.get(rec["network"], rec["network"]),
            rec["precision"],
            "—" if rec["library"] in FLOORS else rec["model"],
            LIBRARIES.get(rec["library"], rec["library"]),
            _ms(rec.get("step_ms")),
            _added(rec.get("added_ms")),
            _ms(rec.get("wall_ms")),
            _added(rec.get("added_wall_ms")),
            _note(rec),
        ]  # fmt: skip
        for rec in sorted(records, key=_order)
    ]
    return md_table([*header, "added wall ms", "notes"], rows, "llllrrrrl")


def markdown(results: dict[str, Any]) -> str:
    """A section for ``docs/performance.md``: setup lines, the table, how to read it."""
    meta, settings = results.get("meta", {}), results.get("settings", {})
    versions = meta.get("versions", {})
    sj = ", ".join(
        f"{kind}: {w.get('spikingjelly') or w.get('error', '?')}"
        for kind, w in sorted(results.get("workers", {}).items())
        if kind != "main"
    )
    head = [
        "## End-to-end training step",
        "",
        f"- device: **{meta.get('gpu', '?')}**; torch {versions.get('torch')} "
        f"(CUDA {versions.get('torch_cuda')}), CuPy {versions.get('cupy')}, "
        f"Triton {versions.get('triton')}; SpikingJelly ({sj or 'none'})",
        f"- date {meta.get('date')}; command `python3 benchmarks/bench_e2e.py "
        f"{' '.join(meta.get('argv', []))}`" + (" (**dry run**)" if meta.get("dry_run") else ""),
        f"- {settings.get('rounds')} rounds, peers in alternating order; per round "
        f"{settings.get('steps')} steps timed with CUDA events (back to back, as in a training "
        f"loop) and {settings.get('wall_steps')} wall-timed steps (synchronize, perf_counter, "
        f"step, synchronize); medians, then the median of the rounds",
        "",
        "A step: `zero_grad`, `reset` of the neuron states, forward, cross-entropy, backward, "
        "SGD step (momentum 0.9). CNN: T = 4, batch 64, three conv3x3-BN-neuron-maxpool "
        "blocks (64-128-256 channels); MLP: T = 100, batch 64, 700-256-256-20. *added* = "
        "step time minus the same network's with `nn.ReLU` in place of the neurons "
        "(the floor). AMP fp16: `torch.autocast(dtype=float16)` with `GradScaler`. "
        "*check*: first-step loss against symneuron's (same weights, same batch); *rates*: "
        "the neuron layers' firing rates in that step.",
        "",
    ]
    if any(r["library"].endswith("-cg") for r in results.get("records", [])):
        head[-1:-1] = [
            "",
            '*+ CUDA graphs*: the network under `torch.compile(mode="reduce-overhead")` '
            "(forward and backward graphs captured; zero_grad, GradScaler and the SGD step "
            "eager), its added time against the floor compiled the same way.",
        ]
    if not results.get("complete", True):
        head.insert(2, "- **partial run**: " + "; ".join(results.get("stopped", [])))
    return "\n".join(head) + "\n" + table(results.get("records", [])) + "\n"


def plot(results: dict[str, Any], path: str | Path) -> str | None:
    """Grouped bars of the time each library's neurons add over the floor, one panel per
    network x precision; returns an error text instead of raising (e.g. no matplotlib)."""
    try:
        plt = pyplot()
    except Exception as exc:  # noqa: BLE001
        return f"no plot: {type(exc).__name__}: {exc} (pip install matplotlib)"
    try:
        return _plot(plt, results, path)
    except Exception as exc:  # noqa: BLE001
        return f"no plot: {type(exc).__name__}: {exc}"


def _plot(plt: Any, results: dict[str, Any], path: str | Path) -> str | None:
    recs = [r for r in results.get("records", []) if r["library"] not in FLOORS]
    panels = sorted({(r["network"], r["precision"]) for r in recs}, key=lambda p: _order(
        {"network": p[0], "precision": p[1], "library": "floor", "model": ""}))  # fmt: skip
    if not panels:
        return "no plot: no records"
    libs = [lib for lib in LIBRARIES if any(r["library"] == lib for r in recs)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.0), squeeze=False)
    width = 0.8 / max(1, len(libs))
    for ax, (net, prec) in zip(axes[0], panels, strict=True):
        mine = [r for r in recs if r["network"] == net and r["precision"] == prec]
        models = sorted({r["model"] for r in mine})
        for i, lib in enumerate(libs):
            for j, model in enumerate(models):
                rec = next((r for r in mine if r["library"] == lib and r["model"] == model), {})
                x, value = j + (i - (len(libs) - 1) / 2) * width, rec.get("added_ms")
                if value is None:
                    ax.text(x, 0, "n/a", rotation=90, ha="center", va="bottom", fontsize=6)
                    continue
                ax.bar(x, value, width, color=f"C{list(LIBRARIES).index(lib)}",
                       label=LIBRARIES[lib] if j == 0 else None)  # fmt: skip
        ax.set_xticks(range(len(models)), models)
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_title(f"{NETWORKS.get(net, net)}, {prec}", fontsize=9)
        ax.set_ylabel("time added over the floor (ms / step)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=8)
    fig.suptitle(f"Training step: time added by the neurons ({results['meta'].get('gpu')})")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
