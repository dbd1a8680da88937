"""The zoo: every model only as its equations, with its source and defaults.

Nothing here is a kernel, a derivative or an autograd function: each function
returns a :class:`~symneuron.Neuron`. :mod:`~symneuron.models.discrete` holds the
discrete-time models with SpikingJelly's conventions and defaults;
:mod:`~symneuron.models.papers` the models as their papers and simulators write
them, mostly differential equations discretised by :meth:`~symneuron.Neuron.from_ode`;
:mod:`~symneuron.models.noisy` noisy models (:data:`NOISY`, not in :data:`ZOO`).

>>> import symneuron as sn
>>> hh = sn.models.HodgkinHuxley()
>>> sorted(hh.states)
['h', 'm', 'n']
"""

from typing import Any

from ..neuron import Neuron
from .conductance import MorrisLecar, Pospischil2008, WangBuzsaki
from .discrete import (
    ALIF,
    DISCRETE,
    EIF,
    IF,
    LIF,
    PLIF,
    QIF,
    STATEFUL,
    AdEx,
    CuLIF,
    Izhikevich,
    ThresholdLIF,
)
from .noisy import NOISY, EscapeLIF, NoisyLIF
from .papers import (
    IZHIKEVICH_PRESETS,
    AdEx2005,
    AdLIF,
    FitzHughNagumo,
    HodgkinHuxley,
    IafCondExp,
    IafPscExp,
    Izhikevich2003,
    RefractoryLIF,
    ResonateAndFire,
    ThetaNeuron,
    vtrap,
)

#: The models from papers and simulators (``papers``): name -> constructor.
PAPERS = {
    "Izhikevich2003": Izhikevich2003,
    "AdEx2005": AdEx2005,
    "HodgkinHuxley": HodgkinHuxley,
    "FitzHughNagumo": FitzHughNagumo,
    "ResonateAndFire": ResonateAndFire,
    "AdLIF": AdLIF,
    "IafCondExp": IafCondExp,
    "IafPscExp": IafPscExp,
    "ThetaNeuron": ThetaNeuron,
    "RefractoryLIF": RefractoryLIF,
    "WangBuzsaki": WangBuzsaki,
    "MorrisLecar": MorrisLecar,
    "Pospischil2008": Pospischil2008,
}

#: Every model in the zoo: name -> constructor (each callable with no arguments).
ZOO = {**DISCRETE, **STATEFUL, **PAPERS}


def require_neuron(value: Any, what: str = "neuron") -> None:
    """Refuse a ``value`` that is not a :class:`~symneuron.Neuron` with a ``TypeError``
    naming the model to build when it is a model's name (``"LIF"``) or its uncalled
    constructor (``sn.models.LIF``)."""
    if isinstance(value, Neuron):
        return
    known = {**ZOO, **NOISY}
    hint = "; build one with sn.Neuron(...) or a zoo model, e.g. sn.models.LIF()"
    if isinstance(value, str) and value in known:
        hint = f"; build the zoo model first: sn.models.{value}()"
    elif callable(value) and getattr(value, "__name__", None) in known:
        hint = f"; call it to build the neuron: sn.models.{value.__name__}()"
    raise TypeError(
        f"{what} must be a symneuron.Neuron, got {type(value).__name__} {value!r}{hint}"
    )


__all__ = [  # noqa: PLE0604
    "IF",
    "LIF",
    "PLIF",
    "QIF",
    "EIF",
    "ThresholdLIF",
    "Izhikevich",
    "ALIF",
    "CuLIF",
    "AdEx",
    *PAPERS,
    "ZOO",
    "DISCRETE",
    "STATEFUL",
    "PAPERS",
    "IZHIKEVICH_PRESETS",
    "vtrap",
    "NoisyLIF",
    "EscapeLIF",
    "NOISY",
    "require_neuron",
]
