#!/usr/bin/env python3
"""One training step (forward + backward) of a feedforward LIF network with current
synapses, by exact EventProp kernels and by symneuron's own surrogate BPTT; the networks,
the losses and what is measured: ``docs/eventprop.md`` (section "EventProp against BPTT").

    python3 benchmarks/eventprop_bptt.py                      # on a GPU: both cases
    python3 benchmarks/eventprop_bptt.py --device cpu --quick # CPU smoke test, tiny sizes
    python3 benchmarks/eventprop_bptt.py --profile            # where a step's time goes

Cases (:data:`CASES`): an SHD-sized 700 → 256 → 20 network whose inputs each spike a few
times in 1 s (Poisson, :data:`RATE_HZ`), and a Yin-Yang-sized 5 → 200 → 3 one (latency
inputs, :func:`symneuron.datasets.latency_code`), batch 256, 1000 steps of 1 ms. Rows:

* ``eventprop``: :func:`symneuron.eventprop.event_network` (the CUDA kernels on a GPU, the
  C ones on the CPU) on spike times, no delays, grazing spikes not looked for
  (``grazing=-inf``: no host sync); loss: the first-spike cross-entropy of the output layer's spike
  times (τ₀ = :data:`TAU0`).
* ``eventprop-recurrent``: the ``eventprop`` row with its hidden layer recurrent
  (:func:`recurrent`: W_rec ~ N(0, :data:`REC_SPREAD`²), D_rec uniform in 1–4 ms, at
  least a step), by the recurrent kernels (a sample's neurons in step).
* ``bptt``: ``nn.Linear`` (no bias, the same weights) → ``sn.NeuronLayer`` of
  :func:`symneuron.models.CuLIF` (the same τ_m, τ_s, threshold and reset, dt = 1 ms) →
  ``nn.Linear`` → ``sn.NeuronLayer``, on the inputs binned per step; loss: the
  cross-entropy of the output layer's spike counts.

Per row: time per step (CUDA events around forward + backward, after warm-up; the
median), the peak memory that forward + backward allocate above what was allocated
before (``torch.cuda.max_memory_allocated``, reset before each row), and the spikes per
sample of each layer.

``--profile``: instead, each row's steps under ``torch.profiler`` (:func:`profile_row`):
per kernel its calls and device time per step, the host's wall time per step, its
kernel launches and the host syncs (device-to-host copies, synchronisations) per step.
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import core  # noqa: E402
import sympy as sp  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import symneuron as sn  # noqa: E402
from symneuron.datasets import latency_code, yin_yang  # noqa: E402
from symneuron.eventprop import EventLayer, event_network, first_spike_cross_entropy  # noqa: E402

ROWS = ("eventprop", "bptt", "eventprop-recurrent")
TAU_M, TAU_S, THETA, RATE_HZ, TAU0 = 20.0, 5.0, 1.0, 4.0, 5.0
#: the spread of the ``eventprop-recurrent`` row's recurrent weights
REC_SPREAD = 0.02


class Case(NamedTuple):
    """A network's sizes, batch, steps of 1 ms, and its weights' mean and spread per layer
    (chosen so that the hidden and output neurons spike a few times)."""

    name: str
    sizes: tuple[int, int, int]
    batch: int
    steps: int
    weights: tuple[tuple[float, float], tuple[float, float]]


CASES = (
    Case("shd", (700, 256, 20), 256, 1000, ((0.05, 0.1), (0.1, 0.2))),
    Case("yinyang", (5, 200, 3), 256, 1000, ((1.5, 1.0), (0.2, 0.3))),
)
QUICK = (
    Case("shd", (40, 16, 4), 4, 60, ((1.0, 0.5), (1.0, 0.5))),
    Case("yinyang", (5, 12, 3), 4, 60, ((1.5, 1.0), (0.4, 0.3))),
)


def lif_ode() -> sn.Neuron:
    """τ_m dV/dt = −V + I, τ_s dI/dt = −I (+ w at an input spike), spike at ϑ, reset to 0."""
    tau_m, tau_s, theta = sp.symbols("tau_m tau_s theta", positive=True)
    current = sp.Symbol("I", real=True)
    return sn.Neuron.from_ode(
        (-sn.V + current) / tau_m,
        dt=1.0,
        method="exact",
        params={tau_m: TAU_M, tau_s: TAU_S, theta: THETA},
        states={current: sn.ODEState(-current / tau_s + sn.X)},
        v_threshold=theta,
        v_reset=0.0,
    )


def input_times(case: Case, generator: torch.Generator) -> torch.Tensor:
    """Spike times [B, n_in, K] (+inf padded, ascending): Poisson counts at
    :data:`RATE_HZ` in the case's window, uniform times (SHD-sized); x, y, 1 − x, 1 − y
    and a bias at 0 as latencies in [0, 30] ms (Yin-Yang)."""
    if case.name == "yinyang":
        points = yin_yang(case.batch, seed=int(torch.randint(1 << 30, (1,), generator=generator)))
        return latency_code(points.points, 0.0, 30.0, bias=0.0).float()
    n_in, window = case.sizes[0], float(case.steps)
    rate = torch.full((case.batch, n_in), RATE_HZ * window / 1000.0)
    counts = torch.poisson(rate, generator=generator).long()
    k = max(1, int(counts.max()))
    times = torch.rand(case.batch, n_in, k, generator=generator) * window
    times = times.masked_fill(torch.arange(k) >= counts[..., None], float("inf"))
    return times.sort(-1).values


def weights(case: Case, generator: torch.Generator) -> list[torch.Tensor]:
    """Each layer's weights [n_out, n_in], N(mean, spread) as the case says."""
    out = []
    for (n_in, n_out), (mean, spread) in zip(
        zip(case.sizes[:-1], case.sizes[1:], strict=True), case.weights, strict=True
    ):
        out.append(mean + spread * torch.randn(n_out, n_in, generator=generator))
    return out


def recurrent(case: Case, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The hidden layer's recurrent weights N(0, :data:`REC_SPREAD`²) and delays uniform
    in [1, 4] ms, [n, n]."""
    n = case.sizes[1]
    weight = REC_SPREAD * torch.randn(n, n, generator=generator)
    return weight, 1.0 + 3.0 * torch.rand(n, n, generator=generator)


def binned(times: torch.Tensor, steps: int) -> torch.Tensor:
    """Spike times [B, n, K] as counts per 1 ms step [steps, B, n] (the BPTT input)."""
    batch, n, _ = times.shape
    out = torch.zeros(steps, batch, n, device=times.device)
    finite = torch.isfinite(times) & (times < steps)
    b, i, k = finite.nonzero(as_tuple=True)
    step = times[b, i, k].floor().long()
    out.index_put_((step, b, i), torch.ones_like(step, dtype=out.dtype), accumulate=True)
    return out


#: a forward + backward; returns each layer's spike count of the batch (no host sync)
Step = Callable[[], list[torch.Tensor]]


def eventprop_step(
    case: Case,
    times: torch.Tensor,
    ws: list[torch.Tensor],
    labels: torch.Tensor,
    loop: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Step:
    """A forward + backward by EventProp; returns each layer's spikes. ``loop``: the
    hidden layer's recurrent weights and delays (learned too), or none."""
    neuron, delays = lif_ode(), [torch.zeros_like(w) for w in ws]
    leaves = [w.clone().requires_grad_() for w in ws]
    rec = {}
    if loop is not None:
        rec_weight, rec_delay = (t.clone().requires_grad_() for t in loop)
        rec = {"recurrent_weight": rec_weight, "recurrent_delay": rec_delay}

    def step() -> list[torch.Tensor]:
        for w in [*leaves, *rec.values()]:
            w.grad = None
        layers = [EventLayer(w, d) for w, d in zip(leaves, delays, strict=True)]
        layers[0] = layers[0]._replace(**rec)
        out = event_network(neuron, layers, times, t_end=float(case.steps), grazing=-math.inf)
        first_spike_cross_entropy(out[-1], labels, tau0=TAU0, t_end=float(case.steps)).backward()
        return [torch.isfinite(t).sum() for t in out]

    return step


class BPTTNet(nn.Module):
    """Linear → CuLIF layer → Linear → CuLIF layer on [T, B, n_in]; spikes of both."""

    def __init__(self, ws: list[torch.Tensor], backend: str) -> None:
        super().__init__()
        neuron = sn.models.CuLIF(tau=TAU_M, tau_syn=TAU_S, v_threshold=THETA, v_reset=0.0)
        self.linears = nn.ModuleList()
        for w in ws:
            linear = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device)
            linear.weight.data.copy_(w)
            self.linears.append(linear)
        self.neurons = nn.ModuleList(
            [sn.NeuronLayer(neuron, backend=backend, device=ws[0].device) for _ in ws]
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for linear, neurons in zip(self.linears, self.neurons, strict=True):
            neurons.reset()
            x = neurons(linear(x))
            out.append(x)
        return out


def bptt_step(case: Case, x: torch.Tensor, ws: list[torch.Tensor], labels: torch.Tensor) -> Step:
    """A forward + backward by surrogate BPTT; returns each layer's spikes."""
    net = BPTTNet(ws, "auto")

    def step() -> list[torch.Tensor]:
        net.zero_grad(set_to_none=True)
        out = net(x)
        F.cross_entropy(out[-1].sum(0), labels).backward()
        return [s.detach().sum() for s in out]

    return step


def measure(
    step: Step, batch: int, timer: core.Timer, device: torch.device, args: argparse.Namespace
) -> core.Rec:
    """Spikes per sample, peak memory above the baseline and the median time of ``step``."""
    for _ in range(max(1, args.warmup)):
        spikes = step()
    timer.sync()
    rec: core.Rec = {"spikes_per_sample": [float(s) / batch for s in spikes]}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        rec["peak_bytes"] = torch.cuda.max_memory_allocated(device) - base
    times = timer.events(lambda i: step(), args.steps)
    rec.update(median_s=statistics.median(times), times_s=times)
    return rec


#: host calls that wait for the device (a copy back, a synchronisation)
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaMemcpyAsync")


def _device_us(event: object) -> float:
    """An averaged profiler event's own device time (µs), under either of torch's names."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def profile_row(step: Step, steps: int, device: torch.device) -> str:
    """``step`` run ``steps`` times (after two warm-up runs) under ``torch.profiler``: the
    wall time per step, then per kernel (device time > 0) its calls and ms per step, and
    per host call that launches or waits its calls per step."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    step(), step(), sync()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        wall = (time.perf_counter() - start) / steps
    events = prof.key_averages()
    lines = [f"wall {wall * 1e3:.2f} ms/step"]
    kernels = sorted((e for e in events if _device_us(e) > 0), key=_device_us, reverse=True)
    device_total = sum(_device_us(e) for e in kernels) / steps / 1e3
    lines.append(f"device (kernels and copies) {device_total:.2f} ms/step")
    for e in kernels[:20]:
        per = _device_us(e) / steps / 1e3
        lines.append(f"  {per:8.3f} ms {e.count / steps:6.1f}x  {e.key[:90]}")
    for e in sorted(events, key=lambda e: e.key):
        if e.key.startswith(("cudaLaunch", "cuLaunch")) or e.key in SYNCS:
            host = e.cpu_time_total / steps / 1e3
            lines.append(f"  host {e.key}: {e.count / steps:.1f} per step, {host:.3f} ms")
    host_ops = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    lines.append("host, most self time per step:")
    for e in host_ops:
        per = e.self_cpu_time_total / steps / 1e3
        lines.append(f"  {per:8.3f} ms {e.count / steps:6.1f}x  {e.key[:90]}")
    return "\n".join(lines)


def profile_cases(cases: tuple[Case, ...], device: torch.device, args: argparse.Namespace) -> None:
    """:func:`profile_row` of every row of every case, printed."""
    for case in cases:
        makers = step_makers(case, device, args.seed)
        for row in args.rows:
            report = profile_row(makers[row](), args.steps, device)
            print(f"## {case.name} {row}\n{report}\n", flush=True)


def step_makers(case: Case, device: torch.device, seed: int) -> dict[str, Callable[[], Step]]:
    """Each row's step of ``case``, on the same seeded inputs and weights."""
    generator = torch.Generator().manual_seed(seed)
    times = input_times(case, generator).to(device)
    ws = [w.to(device) for w in weights(case, generator)]
    labels = torch.randint(case.sizes[-1], (case.batch,), generator=generator).to(device)
    rec_weight, rec_delay = (t.to(device) for t in recurrent(case, generator))
    return {
        "eventprop": lambda: eventprop_step(case, times, ws, labels),
        "eventprop-recurrent": lambda: eventprop_step(
            case, times, ws, labels, (rec_weight, rec_delay)
        ),
        "bptt": lambda: bptt_step(case, binned(times, case.steps), ws, labels),
    }


def run_case(
    case: Case, timer: core.Timer, device: torch.device, args: argparse.Namespace
) -> list[core.Rec]:
    """Every row of ``case`` on the same inputs and weights."""
    makers = step_makers(case, device, args.seed)
    records = []
    for row in args.rows:
        rec = dict(case=case.name, sizes=case.sizes, B=case.batch, T=case.steps, row=row)
        try:
            rec.update(measure(makers[row](), case.batch, timer, device, args), status="ok")
        except Exception as exc:  # noqa: BLE001  (a row's failure is reported, not fatal)
            rec.update(status="error", error=core.short_error(exc))
        core.log(
            f"[{case.name}] {row}: {rec.get('status')} {rec.get('median_s', rec.get('error'))}"
        )
        records.append(rec)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return records


def table(records: list[core.Rec]) -> str:
    """Per case and row: ms per step, peak MiB, spikes per sample, and EventProp's ratios."""
    rows = []
    for rec in records:
        if rec["status"] != "ok":
            rows.append([rec["case"], rec["row"], "error", "", "", rec["error"][:60]])
            continue
        peak = rec.get("peak_bytes")
        spikes = " / ".join(f"{s:.1f}" for s in rec["spikes_per_sample"])
        mib = f"{peak / 2**20:.1f}" if peak is not None else "n/a"
        rows.append([rec["case"], rec["row"], f"{rec['median_s'] * 1e3:.2f}", mib, spikes, ""])
    header = ["case", "row", "ms/step", "peak MiB", "spikes/sample (hidden / out)", "note"]
    return core.md_table(header, rows, "llrrll") + "\n" + "\n".join(ratios(records))


def ratios(records: list[core.Rec]) -> list[str]:
    """EventProp's time and memory as fractions of BPTT's, and its recurrent row's time
    as a multiple of its feedforward one's, per case."""
    ok = {(r["case"], r["row"]): r for r in records if r["status"] == "ok"}
    out = []
    for case in dict.fromkeys(r["case"] for r in records):
        ev, bp = ok.get((case, "eventprop")), ok.get((case, "bptt"))
        if ev and bp:
            line = f"{case}: EventProp time / BPTT = {ev['median_s'] / bp['median_s']:.2f}"
            if ev.get("peak_bytes") is not None and bp.get("peak_bytes"):
                line += f", memory / BPTT = {ev['peak_bytes'] / bp['peak_bytes']:.3f}"
            out.append(line)
        loop = ok.get((case, "eventprop-recurrent"))
        if ev and loop:
            out.append(
                f"{case}: EventProp recurrent / feedforward time = "
                f"{loop['median_s'] / ev['median_s']:.2f}"
            )
    return out


def plot(records: list[core.Rec], path: Path, title: str) -> None:
    """Time per step and peak memory, a bar per row in each case."""
    plt = core.pyplot()
    cases = list(dict.fromkeys(r["case"] for r in records))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    panels = (("median_s", 1e3, "ms per step"), ("peak_bytes", 2.0**-20, "peak MiB"))
    for ax, (key, scale, label) in zip(axes, panels, strict=True):
        series = []
        for row in ROWS:
            found = {r["case"]: r for r in records if r["row"] == row and r["status"] == "ok"}
            heights = [
                found[c][key] * scale if c in found and found[c].get(key) else None for c in cases
            ]
            series.append((heights, {"label": row}))
        core.grouped_bars(ax, len(cases), series, missing="n/a")
        ax.set_xticks(range(len(cases)), cases)
        ax.set_ylabel(label)
        ax.legend()
    core.save_figure(fig, path, title, 120)


def main(argv: list[str] | None = None) -> int:
    p = core.parser(__doc__)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help="tiny sizes, few steps (a smoke test)")
    p.add_argument("--rows", type=core.csv_list(str, ROWS), default=list(ROWS), help=",".join(ROWS))
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10; quick 2)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true", help="kernel and host times per step")
    p.add_argument(
        "--out", type=Path, default=None, help="default results/<gpu>-<date>-eventprop.json"
    )
    args = p.parse_args(argv)
    args.steps = args.steps or (2 if args.quick else 10)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: use --device cpu --quick")
    device = torch.device(args.device)
    if args.profile:
        profile_cases(QUICK if args.quick else CASES, device, args)
        return 0
    info = core.device_info(device)
    date = datetime.date.today().isoformat()
    out = args.out or core.result_path(
        core.HERE / "results", info["gpu"], suffix=f"-{date}-eventprop"
    )
    timer, records = core.Timer(device), []
    for case in QUICK if args.quick else CASES:
        records += run_case(case, timer, device, args)
    meta = dict(date=core.now_iso(), argv=sys.argv[1:], **info, versions=core.versions())
    settings = {**vars(args), "out": str(out), "rate_hz": RATE_HZ, "tau0": TAU0}
    core.write_json(out, dict(meta=meta, settings=settings, records=records))
    try:
        plot(records, out.with_suffix(".png"), f"EventProp vs surrogate BPTT — {info['gpu']}")
    except Exception as exc:  # noqa: BLE001  (no matplotlib: the JSON and table still count)
        core.log(f"# no plot: {core.short_error(exc)}")
    print(f"# wrote {out} (and its plot beside it)", file=sys.stderr)
    print(table(records), flush=True)
    return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
