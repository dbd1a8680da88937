"""``sn.rank_seed``: one int seed shared by every DDP rank gives each rank its own stream."""

from __future__ import annotations

import pytest
import torch

import symneuron as sn
from symneuron.runtime import cpu

pytestmark = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")


def _noise(seed: int) -> torch.Tensor:
    """The membrane increments of a noisy LIF with no input (its noise alone), the rows
    of one rank."""
    x = torch.zeros(100, 2, 32, dtype=torch.float64)
    layer = sn.NeuronLayer(sn.models.NoisyLIF(), backend="cpu", seed=seed, store_v_seq=True)
    layer(x)
    return torch.diff(layer.v_seq, dim=0)  # (increments: near-independent draws)


def test_ranks_given_one_seed_draw_alike_unless_rank_seed_is_used() -> None:
    same = [_noise(5) for _ in range(2)]  # what two ranks with seed=5 draw
    assert torch.equal(same[0], same[1])
    own = [_noise(sn.rank_seed(5, rank=r)) for r in range(4)]
    assert sn.rank_seed(5, rank=0) == 5 and torch.equal(own[0], same[0])
    for i in range(4):
        for j in range(i):
            corr = torch.corrcoef(torch.stack([own[i].flatten(), own[j].flatten()]))[0, 1]
            assert abs(float(corr)) < 0.1, (i, j)  # (6336 pairs: sd 0.013)


def test_rank_seed_defaults_to_this_process_and_checks_its_arguments() -> None:
    assert sn.rank_seed(11) == 11  # no process group: rank 0
    with pytest.raises(ValueError, match="rank must be an int >= 0"):
        sn.rank_seed(11, rank=-1)
    with pytest.raises(TypeError, match="seed must be an int"):
        sn.rank_seed(1.5)  # type: ignore[arg-type]
