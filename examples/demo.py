"""symneuron in one script: define a neuron in SymPy, verify it, train an SNN on real digits.

1. A custom neuron: a leaky neuron driven through a saturating (tanh) input,
   with a learnable time constant and gain. Nothing but its charge equation.
2. The derivatives SymPy derived for it, and ``sn.check``'s verification of
   those derivatives and of the compiled kernels against the torch reference.
3. A two-layer spiking network (64 -> 128 -> 10) trained on scikit-learn's
   bundled handwritten digits (1,797 8x8 images, shipped inside scikit-learn:
   no download), on the CPU with ``backend="auto"`` (generated C kernels when a
   C compiler exists, else the torch reference). It prints the held-out
   accuracy (about 0.95; chance is 0.1).
4. Pictures of the trained network with ``sn.plot``: a spike raster of one test
   digit through the layers, membrane traces of its busiest hidden neurons with
   the threshold, and the firing-rate histogram of each layer.
5. The first lines of the CUDA kernel generated from the same equation.

Encoding: **rate coding**. Each pixel's intensity (0-16, scaled to [0, 1]) is
its spike probability at every one of T = 12 steps (Bernoulli draws, fresh for
each training batch, fixed for the test set). The class information then lives
in spike counts, which the leaky neuron integrates whatever their order, and the
output layer's firing rates serve directly as logits. Latency coding (one spike
per pixel, brighter = earlier) would put the information in spike times, which
a neuron forgetting half its potential each step (tau = 2) keeps for only a few
steps; the zero pixels (about half of each image) would never spike at all.

Needs the ``examples`` extra (scikit-learn, tqdm, matplotlib)::

    python3 -m pip install -e ".[examples]"
    python3 examples/demo.py                       # figures into a temp directory
    python3 examples/demo.py --out docs/images     # the README's figures

Everything is seeded (weights, data split, spike draws, batch order): two runs
print the same numbers. About 20-30 s on two CPU cores (``--epochs 1`` for a
quick look).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import sympy as sp
import torch
from torch import nn

import symneuron as sn
import symneuron.plot
from symneuron.simulate import resolve_backend

# -- 1. The neuron: H[t] = V[t-1] - V[t-1]/tau + g * tanh(X[t]) -----------------------

V, X = sn.V, sn.X
tau, g = sp.symbols("tau g", positive=True)

neuron = sn.Neuron(
    V - V / tau + g * sp.tanh(X),
    params={tau: 2.0, g: 1.0},
    learnable=[tau, g],
    v_threshold=1.0,
    v_reset=0.0,
    surrogate=sn.surrogate.ATan(alpha=2.0),
    name="TanhLIF",
)


def show_neuron() -> None:
    print(neuron, "\n")
    print("Derived partials of the charge H = f(V, X; tau, g):")
    for name, expr in neuron.derivatives().items():
        print(f"  {name:8s} = {expr}")
    spec = neuron.spec()
    print(f"Backward needs V[t-1]: {spec.needs_v}, needs X[t]: {spec.needs_x}\n")


def show_check() -> None:
    report = sn.check(neuron, seed=0)
    print(report, "\n")
    assert report.passed, "the generated kernels disagree with the reference"


# -- 2. Real data: scikit-learn's handwritten digits, rate-coded into spikes ----------

T, PIXELS, HIDDEN, CLASSES = 12, 64, 128, 10
BATCH, LEARNING_RATE, LOGIT_SCALE = 128, 1e-2, 5.0


def require_extras() -> None:
    """Fail early, naming the extra to install, if scikit-learn, tqdm or matplotlib is missing."""
    missing = []
    for module in ("sklearn", "tqdm", "matplotlib"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise SystemExit(f"the demo needs {missing}: pip install 'symneuron[examples]'")


def load_digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pixels in [0, 1] ([n, 64]) and labels, split 75/25, stratified and seeded."""
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    digits = sklearn_digits()
    split = train_test_split(
        digits.data / 16.0, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    x_train, x_test, y_train, y_test = (torch.as_tensor(a) for a in split)
    return x_train.float(), y_train, x_test.float(), y_test


def rate_encode(pixels: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Spikes [T, n, 64]: each pixel fires with probability = its intensity, every step."""
    return (torch.rand(T, *pixels.shape, generator=gen) < pixels).float()


class SNN(nn.Module):
    """Linear -> spiking layer -> Linear -> spiking layer; logits = output spike rates."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(PIXELS, HIDDEN)
        self.sn1 = sn.NeuronLayer(neuron, backend="auto")
        self.fc2 = nn.Linear(HIDDEN, CLASSES)
        self.sn2 = sn.NeuronLayer(neuron, backend="auto")

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        self.sn1.reset()  # each batch is a fresh sequence: forget the membrane state
        self.sn2.reset()
        out = self.sn2(self.fc2(self.sn1(self.fc1(x_seq))))  # [T, batch, CLASSES]
        return out.mean(0)  # firing rate per class


def accuracy(model: SNN, x_seq: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x_seq).argmax(1) == y).float().mean())


def train(epochs: int, data: tuple[torch.Tensor, ...], gen: torch.Generator) -> tuple[SNN, float]:
    """Adam on cross-entropy of the scaled output rates; returns the model and test accuracy."""
    from tqdm import tqdm

    x_train, y_train, x_test, y_test = data
    test_seq = rate_encode(x_test, gen)
    model = SNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    backend = resolve_backend("auto", x_train.device)
    print(
        f"Digits: {len(x_train)} training and {len(x_test)} test images, T={T}, "
        f"backend='auto' -> {backend!r}"
    )
    print(f"  before training: test accuracy {accuracy(model, test_seq, y_test):.3f} (chance 0.1)")
    batches = -(-len(x_train) // BATCH)
    acc = 0.0
    with tqdm(total=epochs * batches, unit="batch", desc="training") as bar:
        for epoch in range(1, epochs + 1):
            order = torch.randperm(len(x_train), generator=gen)
            for start in range(0, len(x_train), BATCH):
                idx = order[start : start + BATCH]
                logits = LOGIT_SCALE * model(rate_encode(x_train[idx], gen))
                loss = nn.functional.cross_entropy(logits, y_train[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                bar.update()
                bar.set_postfix(epoch=epoch, loss=f"{loss.item():.3f}")
            acc = accuracy(model, test_seq, y_test)
            bar.set_postfix(epoch=epoch, loss=f"{loss.item():.3f}", test_acc=f"{acc:.3f}")
    print(f"  after {epochs} epochs: held-out test accuracy {acc:.3f}")
    print(f"  learned tau per layer: {model.sn1.tau.item():.3f}, {model.sn2.tau.item():.3f}")
    print(f"  learned g   per layer: {model.sn1.g.item():.3f}, {model.sn2.g.item():.3f}\n")
    return model, acc


# -- 3. Pictures of the trained network ----------------------------------------------


def save_plots(model: SNN, pixels: torch.Tensor, labels: torch.Tensor, out: Path) -> list[Path]:
    """raster.png, traces.png and rates.png of the trained model on test digits."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no window
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(1)
    x_seq = rate_encode(pixels, gen)
    model.sn1.store_v_seq = True  # keep V of every step for the traces
    with torch.no_grad():
        model.sn1.reset()
        model.sn2.reset()
        hidden = model.sn1(model.fc1(x_seq[:, :1]))  # [T, 1, HIDDEN]: the first test digit
        output = model.sn2(model.fc2(hidden))
    v_seq = model.sn1.v_seq
    model.sn1.store_v_seq = False
    assert v_seq is not None
    predicted = int(output.mean(0).argmax())
    paths = [out / name for name in ("raster.png", "traces.png", "rates.png")]

    fig, axes = plt.subplots(
        3, 1, sharex=True, figsize=(7, 7), gridspec_kw={"height_ratios": [3, 4, 1.6]}
    )
    sn.plot.raster(x_seq[:, 0], ax=axes[0], size=12, title="input: rate-coded pixels")
    sn.plot.raster(hidden[:, 0], ax=axes[1], size=12, title="hidden layer (sn1)")
    sn.plot.raster(
        output[:, 0],
        ax=axes[2],
        size=16,
        marker="s",
        color="C3",
        title="output layer (sn2): one neuron per class",
    )
    for axis, label in zip(axes, ["pixel", "hidden neuron", "class"], strict=True):
        axis.set_ylabel(label)
    for axis in axes[:2]:
        axis.set_xlabel("")
    axes[2].set_yticks(range(CLASSES))
    axes[2].tick_params(axis="y", labelsize="x-small")
    fig.suptitle(f"one test digit: label {int(labels[0])}, predicted {predicted}")
    fig.tight_layout()
    fig.savefig(paths[0], dpi=100)

    counts = hidden[:, 0].sum(0)  # spikes per hidden neuron
    some = (counts - T / 3).abs().argsort()[:3].tolist()  # fire now and then: V climbs, resets
    fig = sn.plot.traces(
        v_seq[:, 0],
        threshold=neuron,
        params=model.sn1.param_values(),
        neurons=some,
        spike_seq=hidden[:, 0],
        title="hidden neurons: V after each step, and their spikes",
    )
    fig.set_size_inches(7, 3.5)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=100)

    fig = sn.plot.rates(model, x_seq, title="firing rates on the test digits")
    fig.set_size_inches(7, 4.5)
    fig.tight_layout()
    fig.savefig(paths[2], dpi=100)
    plt.close("all")
    return paths


# -- 4. The CUDA source generated from the same equation -------------------------------


def show_cuda_source(lines: int = 30) -> None:
    source = neuron.source("cuda", "float32")
    start = source.index("template <int K>\n__device__ __forceinline__ void TanhLIF_forward_h")
    print(f"Generated CUDA (float32), first {lines} lines of the forward kernel:")
    print("\n".join(source[start:].splitlines()[:lines]))
    print(f"... ({len(source.splitlines())} lines in all: every forward and backward variant)")


def parse_args(argv: list[str] | None) -> Any:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="passes over the training set")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(tempfile.gettempdir()) / "symneuron-demo",
        help="directory for raster.png, traces.png, rates.png (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> float:
    """Run the demo; returns the held-out test accuracy."""
    args = parse_args(argv)
    require_extras()
    begin = time.perf_counter()
    torch.manual_seed(0)  # the layers' initial weights
    gen = torch.Generator().manual_seed(0)  # spike draws and batch order
    show_neuron()
    show_check()
    data = load_digits()
    model, final = train(args.epochs, data, gen)
    paths = save_plots(model, data[2][:256], data[3][:256], args.out)
    print("Figures:", ", ".join(str(p) for p in paths), "\n")
    show_cuda_source()
    seconds = time.perf_counter() - begin
    print(f"\nheld-out test accuracy {final:.3f}; {seconds:.1f} s after imports")
    return final


if __name__ == "__main__":
    main()
