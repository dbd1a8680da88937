"""Yin-Yang learned from first-spike times with exact gradients (EventProp), on the CPU.

The data set (Kriener, Göltz & Petrovici 2021) is points in the unit square inside a
circle, in three classes: the two S-shaped halves of the yin-yang symbol and its two
dots. A linear classifier gets about 64 % of it; a network must learn the curved
boundaries. It is generated here, seeded (``symneuron.datasets.yin_yang``: 5,000
training and 1,000 test points, seeds 42 and 40 as the authors' split; no download).

Network (as Wunderlich & Pehle 2021, Sci Rep 11:12829, Fig. 3): 5 inputs → 200 hidden
→ 3 output LIF neurons with current synapses, written as two ODEs in SymPy,
τ_m dV/dt = −V + I, τ_s dI/dt = −I (+ the input spikes' jumps I ← I + w), threshold 1,
reset to 0, τ_m = 20 ms, τ_s = 5 ms. Inputs are latencies: x, y, 1 − x, 1 − y each
spike once at value × 30 ms, and a bias input spikes at 0. The class is the output
neuron that spikes first.

Training: the loss is the first-spike cross-entropy, −log softmax(−t/τ₀) at the label
(τ₀ = 0.5 ms), plus W&P's term α(e^{t_label/τ₁} − 1) (α = 3e-3, τ₁ = 6.4 ms) that
rewards an early spike of the right neuron; Adam, batches of 32, the learning rate on
a cosine schedule. ``symneuron.eventprop.event_network`` runs each batch exactly (spike
times located inside the step to rounding) in generated C kernels and gives the exact
gradient of this loss by EventProp: no surrogate, no time grid in the result.

Silent neurons have no gradient (a spike time that does not exist does not move), and
silence is catching: with a silent label output counted as spiking at t_end, the
cross-entropy's only gradient for that sample pushes the other outputs later, until
they fall silent too (4 of the 5 runs tried without a remedy collapsed to 35-46 % test
accuracy that way, every output silent on most samples). So: (1) the weights are drawn
with a positive mean, hidden N(1.5, 1) and output N(0.2, 0.3), so that about 40 % of
the (sample, hidden neuron) pairs and nearly all outputs spike from the start (the
literature's remedy, e.g. Wunderlich & Pehle's initialisation); (2) a sample whose
label output is silent adds nothing to the loss (the network then learns from the
others; the literature's alternative, Göltz et al.'s "weight bumping" of a silent
label neuron's weights, gave the same accuracy here). A sample whose predicted neuron
is silent counts as wrong.

Figures: the decision map (the trained network's class over a grid of the square, the
test points on it, the misclassified ones marked) and a spike-time raster of one test
point per class through the three layers.

Needs the ``examples`` extra (tqdm, matplotlib) and a C compiler::

    python3 examples/yinyang_eventprop.py                  # figures into a temp directory
    python3 examples/yinyang_eventprop.py --out docs/images  # the README's figures

20 epochs, about 80 s on two CPU cores shared with other jobs: test accuracy 0.979 when
measured (the published exact-gradient results are about 95 %). Everything is seeded.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import sympy as sp
import torch

import symneuron as sn
from symneuron.datasets import CLASSES, latency_code, yin_yang, yin_yang_class
from symneuron.eventprop import EventLayer, GrazingSpikeWarning, event_network

tau_m, tau_s, theta = sp.symbols("tau_m tau_s theta", positive=True)
I_SYN = sp.Symbol("I", real=True)

#: the LIF with a current synapse; ``dt`` is only the step the exact forward advances
#: by (its spike times do not depend on it)
lif = sn.Neuron.from_ode(
    (-sn.V + I_SYN) / tau_m,
    dt=10.0,
    method="exact",
    params={tau_m: 20.0, tau_s: 5.0, theta: 1.0},
    states={I_SYN: sn.ODEState(-I_SYN / tau_s + sn.X)},
    v_threshold=theta,
    v_reset=0.0,
)

T_MAX, T_END = 30.0, 60.0  # input latencies in [0, T_MAX] ms; each sample runs to T_END
TAU0, TAU1, ALPHA = 0.5, 6.4, 3e-3
DTYPE = torch.float64


class Network(NamedTuple):
    """The two layers' weights (learned) and delays (zero, fixed)."""

    hidden: EventLayer
    output: EventLayer

    def __call__(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden and output spike times [batch, n, K] (+inf padded)."""
        hidden, output = event_network(lif, [self.hidden, self.output], inputs, t_end=T_END)
        return hidden, output


def require_extras() -> None:
    """Fail early, naming the extra to install, if tqdm or matplotlib is missing."""
    missing = []
    for module in ("tqdm", "matplotlib"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise SystemExit(f"this example needs {missing}: pip install 'symneuron[examples]'")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--train", type=int, default=5000, help="training points")
    parser.add_argument("--test", type=int, default=1000, help="test points")
    parser.add_argument("--seed", type=int, default=1, help="weights and batch order")
    parser.add_argument("--out", type=Path, default=None, help="folder for the figures")
    return parser.parse_args(argv)


def encode(points: torch.Tensor) -> torch.Tensor:
    """[n, 5, 1] spike times: x, y, 1 − x, 1 − y at value × T_MAX, the bias at 0."""
    return latency_code(points, 0.0, T_MAX, bias=0.0).to(DTYPE)


def initial_network(hidden: int, gen: torch.Generator) -> Network:
    """Positive-mean weights, so that hidden and output neurons spike from the start."""
    w1 = torch.randn(hidden, 5, generator=gen, dtype=DTYPE) * 1.0 + 1.5
    w2 = torch.randn(3, hidden, generator=gen, dtype=DTYPE) * 0.3 + 0.2
    return Network(
        EventLayer(w1.requires_grad_(), torch.zeros(hidden, 5, dtype=DTYPE)),
        EventLayer(w2.requires_grad_(), torch.zeros(3, hidden, dtype=DTYPE)),
    )


def first_spikes(output: torch.Tensor) -> torch.Tensor:
    """Each output's first spike time [batch, 3]; a silent one at T_END (no gradient)."""
    first = output[..., 0]
    return torch.where(torch.isfinite(first), first, torch.full_like(first, T_END))


def loss_of(output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """First-spike cross-entropy + α(e^{t_label/τ₁} − 1), averaged over the batch; a
    sample whose label output is silent adds 0 (see the module's docstring)."""
    first = first_spikes(output)
    cross_entropy = torch.nn.functional.cross_entropy(-first / TAU0, labels, reduction="none")
    t_label = first.gather(1, labels[:, None])[:, 0]
    per_sample = cross_entropy + ALPHA * (torch.exp(t_label / TAU1) - 1)
    label_fired = torch.isfinite(output[..., 0]).gather(1, labels[:, None])[:, 0]
    return torch.where(label_fired, per_sample, 0.0).mean()


def predict(net: Network, inputs: torch.Tensor) -> torch.Tensor:
    """The first output to spike, or −1 where none does."""
    with torch.no_grad():
        first = net(inputs)[1][..., 0]
    return torch.where(torch.isfinite(first).any(1), first.argmin(1), -1)


def accuracy(net: Network, inputs: torch.Tensor, labels: torch.Tensor) -> float:
    return float((predict(net, inputs) == labels).double().mean())


def train(args: argparse.Namespace, gen: torch.Generator) -> tuple[Network, float, int]:
    """Adam on :func:`loss_of`; returns the network, its test accuracy, the epochs run."""
    from tqdm import tqdm

    train_set, test_set = yin_yang(args.train, seed=42), yin_yang(args.test, seed=40)
    x_train, x_test = encode(train_set.points), encode(test_set.points)
    net = initial_network(args.hidden, gen)
    weights = [net.hidden.weight, net.output.weight]
    optimizer = torch.optim.Adam(weights, lr=args.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(1, args.epochs))
    print(f"Yin-Yang: {args.train} training and {args.test} test points, 5 → {args.hidden} → 3")
    print(f"  before training: test accuracy {accuracy(net, x_test, test_set.labels):.3f}")
    batches = math.ceil(args.train / args.batch)
    acc = 0.0
    with tqdm(total=args.epochs * batches, unit="batch", desc="EventProp") as bar:
        for epoch in range(1, args.epochs + 1):
            order = torch.randperm(args.train, generator=gen)
            for start in range(0, args.train, args.batch):
                index = order[start : start + args.batch]
                loss = loss_of(net(x_train[index])[1], train_set.labels[index])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                bar.update()
                bar.set_postfix(epoch=epoch, loss=f"{loss.item():.3f}", test_acc=f"{acc:.3f}")
            schedule.step()
            acc = accuracy(net, x_test, test_set.labels)
            bar.set_postfix(epoch=epoch, loss=f"{loss.item():.3f}", test_acc=f"{acc:.3f}")
            bar.write(f"  epoch {epoch}: test accuracy {acc:.3f}")
    return net, acc, args.epochs


COLOURS = ("tab:blue", "tab:orange", "tab:green")


def decision_map(net: Network, accuracy_: float, path: Path) -> None:
    """The network's class over a grid of the circle beside the true one, with the test
    points it gets wrong."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    side = torch.linspace(0, 1, 121, dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(side, side, indexing="xy"), dim=-1).reshape(-1, 2)
    inside = torch.hypot(grid[:, 0] - 0.5, grid[:, 1] - 0.5) <= 0.5
    predicted = torch.full((len(grid),), float("nan"), dtype=torch.float64)
    predicted[inside] = predict(net, encode(grid[inside])).double()
    predicted[predicted < 0] = float("nan")  # no output spiked: left blank
    truth = torch.full((len(grid),), float("nan"), dtype=torch.float64)
    truth[inside] = yin_yang_class(grid[inside]).double()
    test = yin_yang(1000, seed=40)
    wrong = predict(net, encode(test.points)) != test.labels
    cmap = ListedColormap(COLOURS)
    fig, axes = plt.subplots(1, 2, figsize=(10, 5))
    titles = (f"the network's class (test accuracy {accuracy_:.3f})", "the true class")
    for ax, title, classes in zip(axes, titles, (predicted, truth), strict=True):
        image = classes.reshape(121, 121).numpy()
        ax.imshow(image, origin="lower", extent=(0, 1, 0, 1), cmap=cmap, vmin=0, vmax=2)
        ax.set(title=title, xlabel="x", ylabel="y", aspect="equal")
    axes[0].scatter(*test.points[wrong].T.numpy(), marker="x", c="k", s=18)
    handles = [Patch(color=c, label=name) for c, name in zip(COLOURS, CLASSES, strict=True)]
    handles.append(axes[0].scatter([], [], marker="x", c="k", label="misclassified test point"))
    fig.legend(handles=handles, loc="lower center", ncol=4)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def raster(net: Network, path: Path) -> None:
    """Spike times of the first test point of each class through the three layers."""
    import matplotlib.pyplot as plt

    test = yin_yang(1000, seed=40)
    samples = [int((test.labels == c).nonzero()[0, 0]) for c in range(3)]
    inputs = encode(test.points[samples])
    with torch.no_grad():
        hidden, output = net(inputs)
    layers = ((inputs, "input", 16), (hidden, "hidden", 6), (output, "output", 24))
    fig, axes = plt.subplots(3, 3, figsize=(12, 7), sharex=True, height_ratios=(1, 4, 1))
    for col in range(3):
        axes[0, col].set_title(f"a '{CLASSES[col]}' test point")
        for row, (times, name, size) in enumerate(layers):
            spikes = torch.isfinite(times[col])
            neurons = spikes.nonzero()[:, 0]
            colour = [COLOURS[int(j)] for j in neurons] if name == "output" else "k"
            axes[row, col].scatter(times[col][spikes].numpy(), neurons.numpy(), s=size, c=colour)
            axes[row, 0].set_ylabel(f"{name} neuron")
        axes[0, col].set_yticks(range(5), ["x", "y", "1-x", "1-y", "bias"])
        axes[2, col].set_yticks(range(3), CLASSES)
        axes[2, col].set_ylim(-0.5, 2.5)
        axes[2, col].set_xlabel("time (ms)")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def save_figures(net: Network, accuracy_: float, out: Path) -> list[Path]:
    """yinyang_decision_map.png and yinyang_raster.png of the trained network, in ``out``."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no window
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "yinyang_decision_map.png", out / "yinyang_raster.png"]
    decision_map(net, accuracy_, paths[0])
    raster(net, paths[1])
    return paths


def main(argv: list[str] | None = None) -> float:
    """Train and draw; returns the test accuracy."""
    args = parse_args(argv)
    require_extras()
    begin = time.perf_counter()
    torch.set_num_threads(1)  # the tensors are small; the kernels use the cores (OpenMP)
    gen = torch.Generator().manual_seed(args.seed)
    with warnings.catch_warnings():
        # spikes that barely reach the threshold are common while weights move; their
        # gradients are exact (large, never clipped), and Adam's steps are bounded
        warnings.simplefilter("ignore", GrazingSpikeWarning)
        net, acc, epochs = train(args, gen)
        seconds = time.perf_counter() - begin
        out = args.out if args.out is not None else Path(tempfile.mkdtemp(prefix="yinyang-"))
        paths = save_figures(net, acc, out)
    print("Figures:", ", ".join(str(p) for p in paths))
    print(f"test accuracy {acc:.3f} after {epochs} epochs, {seconds:.1f} s of training")
    return acc


if __name__ == "__main__":
    main()
