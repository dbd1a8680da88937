"""Draw docs/images/ou.png: the Ornstein–Uhlenbeck worked example of docs/noise.md.

Sample paths of the OU membrane (Euler–Maruyama, dt = 0.5, seed 0) with the
closed-form mean ± 2 standard deviations of the discrete step, and the histogram of V
at the last step over 2^16 neurons against the closed-form Gaussian::

    python3 docs/make_noise_figure.py
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import sympy as sp  # noqa: E402
import torch  # noqa: E402

import symneuron as sn  # noqa: E402

OUT = Path(__file__).resolve().parent / "images" / "ou.png"


def main() -> None:
    tau, mu, sigma = sp.symbols("tau mu sigma", positive=True)
    ou = sn.Neuron.from_ode(
        (mu - sn.V + sn.X) / tau + sigma * sn.xi,
        dt=0.5,
        method="euler",
        params={tau: 5.0, mu: 1.5, sigma: 0.4},
        v_threshold=1e9,
    )
    steps, n = 200, 65536
    _, v = sn.simulate(ou, torch.zeros(steps, n, dtype=torch.float64), v_init=0.0, seed=0)
    a, q = 1 - 0.5 / 5.0, 0.5 * 0.4**2
    t = torch.arange(1, steps + 1, dtype=torch.float64)
    mean = 1.5 * (1 - a**t)
    std = (q * (1 - a ** (2 * t)) / (1 - a**2)).sqrt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), width_ratios=(2, 1))
    time = 0.5 * t
    left.plot(time, v[:, :5], lw=0.8)
    left.plot(time, mean, "k", lw=1.5, label="closed-form mean")
    left.fill_between(time, mean - 2 * std, mean + 2 * std, color="0.85", label="± 2 sd")
    left.set(xlabel="time (ms)", ylabel="V", title="OU membrane, Euler–Maruyama (dt = 0.5)")
    left.legend(loc="lower right")
    var = q / (1 - a**2)
    right.hist(
        v[-1].numpy(),
        bins=80,
        density=True,
        color="C0",
        alpha=0.6,
        label=f"V[{steps}], {n} neurons",
    )
    grid = torch.linspace(1.5 - 4 * math.sqrt(var), 1.5 + 4 * math.sqrt(var), 200)
    density = torch.exp(-((grid - 1.5) ** 2) / (2 * var)) / math.sqrt(2 * math.pi * var)
    right.plot(grid, density, "k", label="N(μ, q/(1 − a²))")
    right.set(xlabel="V", title="stationary distribution")
    right.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
