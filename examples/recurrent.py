"""A recurrent spiking network remembers a cue across a delay; without recurrence it cannot.

The task, generated on the fly (seeded): one of 4 cues is shown for 4 steps (its 5
input channels fire with probability 0.6 per step), then nothing but background
noise (every channel fires with probability 0.02) for ``--delay`` steps (15), then a
"go" signal (5 more channels) for 4 steps. The network must name the cue from its
spikes during the go signal alone: the readout is a linear map of the hidden
spikes averaged over those 4 steps.

Two networks, the same but for one layer: 25 inputs -> 64 LIF neurons (tau = 2 steps:
V halves every step, so after the delay nothing of the cue is left in it) -> 4
outputs. In the first the hidden layer is a ``sn.RecurrentNeuronLayer``
(X_eff[t] = x[t] + R·s[t−1] + b), in the second a ``sn.NeuronLayer``. Both are
trained the same way (Adam, cross-entropy, batches of 128 fresh trials) with the
delay growing from 1 to its final value over the first half of training (a
curriculum: given the full delay from the first step, the recurrent network here is
still at chance after 800 steps). Held-out accuracy after 800 steps, delay 15: recurrent 1.00,
feed-forward 0.25 (chance). The recurrent network holds the cue in self-sustained
activity, and keeps it for delays twice as long as it was trained on.

Figures: ``recurrent_learning.png`` (accuracy during training, and held-out accuracy
against the delay) and ``recurrent_raster.png`` (hidden spikes of both networks for
one trial of each cue).

Needs tqdm and matplotlib (the ``examples`` extra; no data set)::

    python3 -m pip install -e ".[examples]"
    python3 examples/recurrent.py                     # figures into a temp directory
    python3 examples/recurrent.py --out docs/images   # the README's figures

Seeded: two runs on one machine print the same numbers. 20-40 s on two shared CPU
cores (the recurrent layer still runs its time loop step by step; it only gets faster).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import symneuron as sn
import symneuron.plot
from symneuron.simulate import resolve_backend

CUES, PER_CUE, GO_CHANNELS = 4, 5, 5
INPUTS = CUES * PER_CUE + GO_CHANNELS
T_CUE, T_GO = 4, 4
RATE_ON, RATE_NOISE = 0.6, 0.02
HIDDEN, INPUT_GAIN, RECURRENT_GAIN = 64, 8.0, 3.0
BATCH, LEARNING_RATE = 128, 2e-3
TEST_DELAYS = (0, 1, 2, 4, 8, 15, 30)


def trials(n: int, delay: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Input spikes [T_CUE + delay + T_GO, n, INPUTS] and the cue of each trial [n]."""
    cues = torch.randint(CUES, (n,), generator=gen)
    steps = T_CUE + delay + T_GO
    rate = torch.full((steps, n, INPUTS), RATE_NOISE)
    rows = torch.arange(n)
    for k in range(PER_CUE):
        rate[:T_CUE, rows, cues * PER_CUE + k] = RATE_ON
    rate[T_CUE + delay :, :, CUES * PER_CUE :] = RATE_ON
    return (torch.rand(steps, n, INPUTS, generator=gen) < rate).float(), cues


class Network(nn.Module):
    """Linear -> LIF layer (recurrent or not) -> Linear of its spikes during the go signal."""

    def __init__(self, recurrent: bool) -> None:
        super().__init__()
        lif = sn.models.LIF(tau=2.0)
        self.inputs = nn.Linear(INPUTS, HIDDEN)
        self.hidden: nn.Module
        if recurrent:
            self.hidden = sn.RecurrentNeuronLayer(lif, HIDDEN, bias=True)
            with torch.no_grad():  # near self-sustained activity from the start
                self.hidden.weight.mul_(RECURRENT_GAIN)
        else:
            self.hidden = sn.NeuronLayer(lif)
        self.readout = nn.Linear(HIDDEN, CUES)

    def forward(self, x_seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [n, CUES], hidden spikes [T, n, HIDDEN]) of a fresh sequence."""
        self.hidden.reset()
        spikes = self.hidden(self.inputs(INPUT_GAIN * x_seq))
        return self.readout(spikes[-T_GO:].mean(0)), spikes


def delay_at(step: int, steps: int, delay: int) -> int:
    """The curriculum: from 1 to ``delay`` over the first half of training, then ``delay``."""
    return min(delay, 1 + step * delay // max(1, steps // 2))


def train(model: Network, name: str, steps: int, delay: int, gen: torch.Generator) -> list:
    """Adam on cross-entropy over fresh trials; returns the batch accuracy of every step."""
    from tqdm import tqdm

    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    history = []
    with tqdm(range(steps), desc=f"{name:>12}", unit="batch") as bar:
        for step in bar:
            x_seq, cues = trials(BATCH, delay_at(step, steps, delay), gen)
            logits, _ = model(x_seq)
            loss = nn.functional.cross_entropy(logits, cues)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            history.append(float((logits.argmax(1) == cues).float().mean()))
            bar.set_postfix(delay=delay_at(step, steps, delay), loss=f"{loss.item():.3f}")
    return history


def accuracy(model: Network, delay: int, gen: torch.Generator, n: int = 1000) -> float:
    """Held-out accuracy on ``n`` fresh trials with this delay."""
    with torch.no_grad():
        x_seq, cues = trials(n, delay, gen)
        return float((model(x_seq)[0].argmax(1) == cues).float().mean())


def _smooth(values: list, window: int = 25) -> torch.Tensor:
    """The running mean of the last ``window`` values (fewer at the start)."""
    total = torch.tensor(values).cumsum(0)
    count = torch.arange(1, len(values) + 1).clamp(max=window)
    return (total - torch.cat([torch.zeros(window), total[:-window]])[: len(values)]) / count


def plot_learning(curves: dict, by_delay: dict, delay: int, steps: int, path: Path) -> None:
    """Batch accuracy during training, and held-out accuracy against the delay."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for (name, history), color in zip(curves.items(), ("C0", "C3"), strict=True):
        left.plot(_smooth(history), color=color, label=name)
        right.plot(TEST_DELAYS, by_delay[name], "o-", color=color, label=name)
    schedule = [delay_at(s, steps, delay) / delay for s in range(steps)]
    left.plot(schedule, color="0.6", lw=1, ls="--", label="delay / final delay")
    for axis in (left, right):
        axis.axhline(1 / CUES, color="0.3", lw=0.8, ls=":", label="chance")
        axis.set_ylim(0, 1.05)
        axis.set_ylabel("accuracy")
    left.set(xlabel="training step", title="training batches (running mean of 25)")
    right.axvline(delay, color="0.6", lw=1, ls="--")
    right.set(xlabel="delay (steps)", title=f"held-out trials (trained on delay {delay})")
    left.legend(fontsize="small", loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _by_preference(spikes: torch.Tensor, cues: torch.Tensor, delay: int) -> torch.Tensor:
    """Neuron order: by the cue they fire most for during the delay, then by rate."""
    during = spikes[T_CUE : T_CUE + delay].mean(0)  # [n, HIDDEN]
    rates = torch.stack([during[cues == c].mean(0) for c in range(CUES)])  # [CUES, HIDDEN]
    best, preferred = rates.max(0)
    return torch.tensor(sorted(range(HIDDEN), key=lambda i: (int(preferred[i]), -float(best[i]))))


def plot_rasters(models: dict, delay: int, gen: torch.Generator, path: Path) -> None:
    """Hidden spikes of each network for one trial of each cue (cue and go shaded)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(models), CUES, sharex=True, sharey=True, figsize=(11, 5.5))
    x_seq, cues = trials(400, delay, gen)
    for row, (name, model) in zip(axes, models.items(), strict=True):
        with torch.no_grad():
            spikes = model(x_seq)[1]
        order = _by_preference(spikes, cues, delay)
        for cue, ax in enumerate(row):
            trial = int((cues == cue).nonzero()[0])
            sn.plot.raster(spikes[:, trial, order], ax=ax, size=6, title=f"{name}: cue {cue}")
            ax.axvspan(-0.5, T_CUE - 0.5, color="C2", alpha=0.15, lw=0)
            ax.axvspan(T_CUE + delay - 0.5, len(spikes) - 0.5, color="C1", alpha=0.15, lw=0)
            ax.set_ylabel("neuron" if cue == 0 else "")
    fig.suptitle("hidden spikes: cue (green), delay, go signal (orange)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def save_plots(models: dict, curves: dict, by_delay: dict, args: Any) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no window
    import matplotlib.pyplot as plt

    args.out.mkdir(parents=True, exist_ok=True)
    paths = [args.out / "recurrent_learning.png", args.out / "recurrent_raster.png"]
    plot_learning(curves, by_delay, args.delay, args.steps, paths[0])
    plot_rasters(models, args.delay, torch.Generator().manual_seed(args.seed + 2), paths[1])
    plt.close("all")
    return paths


def parse_args(argv: list[str] | None) -> Any:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=800, help="training batches per network")
    parser.add_argument("--delay", type=int, default=15, help="steps between cue and go")
    parser.add_argument("--seed", type=int, default=0, help="weights, trials and batch order")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(tempfile.gettempdir()) / "symneuron-recurrent",
        help="directory for the two figures (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.steps < 2 or args.delay < 1:
        parser.error("--steps must be at least 2 and --delay at least 1")
    return args


def run(args: Any) -> dict[str, float]:
    """Train both networks, print and draw the comparison; held-out accuracy by network."""
    backend = resolve_backend("auto", torch.device("cpu"))
    print(
        f"Recall 1 of {CUES} cues after {args.delay} silent steps (T = "
        f"{T_CUE + args.delay + T_GO}); LIF tau = 2, backend='auto' -> {backend!r}"
    )
    models, curves = {}, {}
    for name, recurrent in (("recurrent", True), ("feedforward", False)):
        torch.manual_seed(args.seed)  # the initial weights
        gen = torch.Generator().manual_seed(args.seed)  # trials and their order
        models[name] = Network(recurrent)
        curves[name] = train(models[name], name, args.steps, args.delay, gen)
    test = torch.Generator().manual_seed(args.seed + 1)
    by_delay = {name: [accuracy(m, d, test) for d in TEST_DELAYS] for name, m in models.items()}
    final = {name: accuracy(m, args.delay, test) for name, m in models.items()}
    print(
        f"held-out accuracy at delay {args.delay}: recurrent {final['recurrent']:.3f}, "
        f"feedforward {final['feedforward']:.3f} (chance {1 / CUES:.2f})"
    )
    print("accuracy by delay:  " + "".join(f"{d:>7}" for d in TEST_DELAYS))
    for name, row in by_delay.items():
        print(f"  {name:<17}" + "".join(f"{a:7.3f}" for a in row))
    paths = save_plots(models, curves, by_delay, args)
    print("Figures:", ", ".join(str(p) for p in paths))
    return final


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the example; returns the held-out accuracy of each network at the trained delay."""
    args = parse_args(argv)
    for module in ("tqdm", "matplotlib"):
        try:
            __import__(module)
        except ImportError:
            raise SystemExit(
                f"this example needs {module}: pip install 'symneuron[examples]'"
            ) from None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # products of 64 x 64: a second thread only adds waiting
    begin = time.perf_counter()
    try:
        final = run(args)
    finally:
        torch.set_num_threads(threads)
    print(f"{time.perf_counter() - begin:.1f} s after imports")
    return final


if __name__ == "__main__":
    main()
