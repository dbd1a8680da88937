"""The Yin-Yang generator (symneuron/datasets.py). Oracles: the symbol's geometry written
out here (points whose class follows from the circles alone), the class balance that
drawing each class first gives, and the areas of the regions (Monte Carlo over the
square, independent of the generator's rejection loop)."""

from __future__ import annotations

import math

import torch

from symneuron.datasets import latency_code, yin_yang, yin_yang_class


def test_known_points_have_the_symbols_classes() -> None:
    points = torch.tensor(
        [
            [0.25, 0.5],  # the left dot's centre
            [0.75, 0.5],  # the right dot's
            [0.5, 0.95],  # top: the upper half
            [0.5, 0.05],  # bottom: the lower half
            [0.25, 0.65],  # the ring around the left dot (0.15 from it): the upper half's
            [0.25, 0.35],  # below the left dot, in its ring: still the upper half's
            [0.75, 0.65],  # the ring around the right dot: the lower half's
            [0.75, 0.35],
        ],
        dtype=torch.float64,
    )
    assert yin_yang_class(points).tolist() == [2, 2, 1, 0, 1, 1, 0, 0]


def test_regions_have_their_areas() -> None:
    """Each half has (π R² − 2π r²)/2 of the circle, the dots 2π r² (R = 0.5, r = 0.1)."""
    g = torch.Generator().manual_seed(0)
    points = torch.rand(400_000, 2, generator=g, dtype=torch.float64)
    inside = torch.hypot(points[:, 0] - 0.5, points[:, 1] - 0.5) <= 0.5
    classes = yin_yang_class(points[inside])
    areas = torch.bincount(classes, minlength=3).double() / len(points)
    dots = 2 * math.pi * 0.1**2
    half = (math.pi * 0.25 - dots) / 2
    torch.testing.assert_close(
        areas, torch.tensor([half, half, dots], dtype=torch.float64), atol=3e-3, rtol=0
    )


def test_the_generator_is_seeded_balanced_and_inside_the_circle() -> None:
    data = yin_yang(3000, seed=42)
    again = yin_yang(3000, seed=42)
    other = yin_yang(3000, seed=43)
    assert torch.equal(data.points, again.points) and torch.equal(data.labels, again.labels)
    assert not torch.equal(data.points, other.points)
    assert torch.hypot(data.points[:, 0] - 0.5, data.points[:, 1] - 0.5).max() <= 0.5
    assert torch.equal(yin_yang_class(data.points), data.labels)
    counts = torch.bincount(data.labels, minlength=3)
    # drawing the class first: 1000 each in expectation (sd 26), though dots cover 8 %
    assert (counts - 1000).abs().max() < 100, counts


def test_latency_code_puts_larger_values_later() -> None:
    points = torch.tensor([[0.2, 0.9]], dtype=torch.float64)
    times = latency_code(points, 1.0, 11.0, bias=0.5)
    assert times.shape == (1, 5, 1)
    torch.testing.assert_close(
        times[0, :, 0], torch.tensor([3.0, 10.0, 9.0, 2.0, 0.5], dtype=torch.float64)
    )
    assert latency_code(points, 0.0, 1.0).shape == (1, 4, 1)
