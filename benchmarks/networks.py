"""The end-to-end networks: a CIFAR-10-sized CNN and an SHD-sized MLP.

Both take a multi-step input ``[T, B, ...]`` and return logits ``[B, classes]`` (the readout
averaged over time). Conv, BatchNorm, pooling and linear layers run with time folded into
the batch (:class:`SeqToANN`); the neuron layers see the whole sequence at once. Every
network is built with a *neuron factory*: a callable from the per-sample shape of the
activations (``(C, H, W)`` or ``(F,)``) to a module: :func:`symneuron_neurons`
(``sn.NeuronLayer``), or :func:`relu`, the no-neuron floor.

>>> import torch
>>> from benchmarks.networks import cifar_cnn, symneuron_neurons, synthetic_batch
>>> net = cifar_cnn(symneuron_neurons("PLIF"), channels=(8, 16, 32))
>>> net(synthetic_batch("cnn", batch=2, generator=torch.Generator().manual_seed(0))[0]).shape
torch.Size([2, 10])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

import torch
from torch import nn

from symneuron.nir.modules import PerStep

#: Per-sample activation shape -> a neuron module taking ``[T, B, *shape]``.
NeuronFactory = Callable[[tuple[int, ...]], nn.Module]

#: Network name -> (T, per-sample input shape, classes).
INPUTS: dict[str, tuple[int, tuple[int, ...], int]] = {
    "cnn": (4, (3, 32, 32), 10),
    "mlp": (100, (700,), 20),
}

_PARAM_SHAPES = ("scalar", "channel", "neuron")


#: Runs modules on [T, B, ...] with time folded into the batch (symneuron's own).
SeqToANN = PerStep


class SpikingNet(nn.Sequential):
    """A sequence of multi-step modules whose output ``[T, B, classes]`` is averaged
    over time into logits ``[B, classes]``."""

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if x_seq.dim() < 3:
            raise ValueError(
                f"x_seq must be [T, B, ...], got shape {tuple(x_seq.shape)}; "
                "add the time axis first (x.unsqueeze(0).expand(T, ...))."
            )
        return super().forward(x_seq).mean(0)

    def reset(self) -> None:
        """Forget every neuron layer's state (call before each new batch of sequences)."""
        reset_states(self)


def reset_states(module: nn.Module) -> None:
    """Call ``reset()`` on every submodule of ``module`` that has one (the neuron layers)."""
    for sub in module.modules():
        if sub is not module and callable(getattr(sub, "reset", None)):
            sub.reset()


def relu(shape: tuple[int, ...]) -> nn.Module:
    """The no-neuron floor: ``nn.ReLU`` in place of each neuron layer (``shape`` unused)."""
    del shape
    return nn.ReLU()


def symneuron_neurons(
    model: str = "LIF",
    *,
    backend: str = "auto",
    param_shape: str | None = None,
    **model_kw: Any,
) -> NeuronFactory:
    """A factory of :class:`symneuron.NeuronLayer` of the zoo model ``model``.

    Parameters
    ----------
    model : str
        A name in ``symneuron.models`` (``"LIF"``, ``"PLIF"``, ``"Izhikevich"``, ...).
    backend : str
        The layers' backend (``"auto"``, ``"cuda"``, ``"cpu"``, ``"torch"``).
    param_shape : {None, "scalar", "channel", "neuron"}
        Shape of each learnable param: ``None`` or ``"scalar"`` one value per layer,
        ``"channel"`` one per channel (a ``[C, 1, ...]`` tensor), ``"neuron"`` one per
        neuron (a ``[C, H, W]`` or ``[F]`` tensor).
    **model_kw
        Passed to the model constructor (``learnable=["tau"]``, ``v_reset=None``, ...).
    """
    import symneuron as sn

    if param_shape is not None and param_shape not in _PARAM_SHAPES:
        raise ValueError(f"param_shape must be None or one of {_PARAM_SHAPES}, got {param_shape!r}")
    constructor = getattr(sn.models, model, None)
    if not callable(constructor):
        raise ValueError(f"unknown model {model!r}; use a name from symneuron.models")
    neuron = constructor(**model_kw)

    def make(shape: tuple[int, ...]) -> nn.Module:
        dims = {"scalar": (), "channel": (shape[0],) + (1,) * (len(shape) - 1), "neuron": shape}
        size = dims[param_shape or "scalar"]
        params = {name: torch.full(size, float(neuron.params[name])) for name in neuron.learnable}
        return sn.NeuronLayer(neuron, backend=backend, params=params)

    return make


def cifar_cnn(
    neuron: NeuronFactory,
    *,
    channels: Sequence[int] = (64, 128, 256),
    classes: int = 10,
    in_shape: tuple[int, int, int] = (3, 32, 32),
) -> SpikingNet:
    """CIFAR-10-sized CNN: three conv3x3-BN-neuron-maxpool blocks and a linear readout.

    Input ``[T, B, *in_shape]`` (T = 4 for CIFAR-10, the image repeated each step);
    output logits ``[B, classes]``.
    """
    layers: list[nn.Module] = []
    c_in, height, width = in_shape
    for c_out in channels:
        conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        layers += [SeqToANN(conv, nn.BatchNorm2d(c_out)), neuron((c_out, height, width))]
        layers.append(SeqToANN(nn.MaxPool2d(2)))
        c_in, height, width = c_out, height // 2, width // 2
    layers.append(SeqToANN(nn.Flatten(), nn.Linear(c_in * height * width, classes)))
    return SpikingNet(*layers)


def shd_mlp(neuron: NeuronFactory, *, sizes: Sequence[int] = (700, 256, 256, 20)) -> SpikingNet:
    """SHD-sized MLP ``700-256-256-20``: linear-neuron layers and a linear readout.

    Input ``[T, B, sizes[0]]`` (T = 100 for SHD); output logits ``[B, sizes[-1]]``.
    """
    if len(sizes) < 2:
        raise ValueError(f"sizes needs at least input and output widths, got {list(sizes)}")
    layers: list[nn.Module] = []
    for f_in, f_out in pairwise(sizes[:-1]):
        layers += [SeqToANN(nn.Linear(f_in, f_out)), neuron((f_out,))]
    layers.append(SeqToANN(nn.Linear(sizes[-2], sizes[-1])))
    return SpikingNet(*layers)


def synthetic_batch(
    network: str,
    batch: int,
    generator: torch.Generator,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    steps: int | None = None,
    shape: tuple[int, ...] | None = None,
    classes: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable synthetic batch ``(x_seq [T, B, *shape], labels [B])`` for ``network``.

    Each class has a fixed random template (from a generator seeded 0); a sample is its
    class's template plus noise drawn from ``generator``. ``"cnn"`` repeats one image
    over the T steps (direct encoding); ``"mlp"`` draws Bernoulli spikes whose rates are
    the template (as SHD's spike trains). ``steps``, ``shape`` and ``classes`` override
    :data:`INPUTS` (for smaller test networks).
    """
    if network not in INPUTS:
        raise ValueError(f"network must be one of {sorted(INPUTS)}, got {network!r}")
    default_steps, default_shape, default_classes = INPUTS[network]
    steps, shape = steps or default_steps, shape or default_shape
    classes = classes or default_classes
    templates = torch.rand(classes, *shape, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(classes, (batch,), generator=generator)
    noise = torch.rand(batch, *shape, generator=generator)
    if network == "cnn":
        image = 0.7 * templates[labels] + 0.3 * noise
        x_seq = image.unsqueeze(0).expand(steps, *image.shape)
    else:
        rates = 0.2 * templates[labels]
        draws = torch.rand(steps, batch, *shape, generator=generator)
        x_seq = (draws < rates).to(torch.float32)
    return x_seq.to(device=device, dtype=dtype).contiguous(), labels.to(device)
