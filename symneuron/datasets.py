"""Small data sets generated in the package, seeded, for the examples (no download).

:func:`yin_yang` draws the Yin-Yang data set of Kriener, Göltz & Petrovici (2021, "The
Yin-Yang dataset", NICE '22; arXiv 2102.08211): points in the unit square inside a
circle of radius R = 0.5 centred at (0.5, 0.5), in three classes: the two S-shaped
halves of the symbol (0 and 1) and its two dots (2) of radius r = 0.1 centred at
(0.25, 0.5) and (0.75, 0.5), with the authors' labels. Each sample's class is drawn
first, uniformly, and its point by rejection until it falls in that class, so the
classes are balanced in expectation (as the authors' generator does; the numbers drawn
differ from theirs). :func:`latency_code` turns points into one spike per input:
(x, y, 1 − x, 1 − y) as latencies in [t_early, t_late] and a bias spike.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["YinYang", "yin_yang", "yin_yang_class", "latency_code"]

#: the radius of the whole figure and of its two dots
R_BIG, R_SMALL = 0.5, 0.1
#: the classes' names, by label, as the authors' generator names them
CLASSES = ("yin", "yang", "dot")


class YinYang(NamedTuple):
    """Points [n, 2] (x, y in the unit square) and their classes [n] (0, 1, 2)."""

    points: torch.Tensor
    labels: torch.Tensor


def yin_yang_class(points: torch.Tensor) -> torch.Tensor:
    """The label of each point [..., 2] inside the circle (the authors' rule).

    2: within r of either dot's centre. 1: the upper half (y > 0.5) outside the disc of
    radius R/2 around the right dot, and the disc of radius R/2 around the left dot
    (its dot excluded). 0: the rest, the lower half outside the left dot's disc and the
    disc of radius R/2 around the right dot: two S-shaped halves, each holding the
    other's dot."""
    x, y = points[..., 0], points[..., 1]
    d_right = torch.hypot(x - 1.5 * R_BIG, y - R_BIG)
    d_left = torch.hypot(x - 0.5 * R_BIG, y - R_BIG)
    upper = (
        (d_right <= R_SMALL)
        | ((d_left > R_SMALL) & (d_left <= 0.5 * R_BIG))
        | ((y > R_BIG) & (d_right > 0.5 * R_BIG))
    )
    dots = (d_right < R_SMALL) | (d_left < R_SMALL)
    return torch.where(dots, 2, upper.long())


def yin_yang(size: int, seed: int) -> YinYang:
    """``size`` points of the Yin-Yang data set, drawn with ``seed`` (classes drawn
    uniformly, each point by rejection within its class).

    >>> data = yin_yang(300, seed=0)
    >>> data.points.shape, sorted(data.labels.unique().tolist())
    (torch.Size([300, 2]), [0, 1, 2])
    """
    g = torch.Generator().manual_seed(seed)
    goals = torch.randint(0, 3, (size,), generator=g)
    points = torch.full((size, 2), float("nan"), dtype=torch.float64)
    missing = torch.ones(size, dtype=torch.bool)
    while bool(missing.any()):
        index = missing.nonzero()[:, 0]
        draw = torch.rand(len(index), 2, generator=g, dtype=torch.float64) * 2 * R_BIG
        inside = torch.hypot(draw[:, 0] - R_BIG, draw[:, 1] - R_BIG) <= R_BIG
        hit = inside & (yin_yang_class(draw) == goals[index])
        points[index[hit]] = draw[hit]
        missing[index[hit]] = False
    return YinYang(points, goals)


def latency_code(
    points: torch.Tensor, t_early: float, t_late: float, bias: float | None = None
) -> torch.Tensor:
    """Spike times [n, 4 or 5, 1]: x, y, 1 − x, 1 − y each as t_early + value·(t_late −
    t_early) (larger values later), and a spike at ``bias`` for every sample (a fifth
    input) when given.

    >>> latency_code(torch.tensor([[0.25, 1.0]]), 0.0, 10.0, bias=0.0)[0, :, 0].tolist()
    [2.5, 10.0, 7.5, 0.0, 0.0]
    """
    values = torch.cat([points, 1 - points], dim=-1)
    times = t_early + values * (t_late - t_early)
    if bias is not None:
        times = torch.cat([times, torch.full_like(times[:, :1], bias)], dim=-1)
    return times[..., None]
