"""symneuron: spiking neurons from SymPy equations, compiled to fused kernels.

Write a neuron's charge H = f(V, X; θ) in SymPy; symneuron derives every
gradient, generates CUDA and C kernels for the forward and backward passes
through time, and returns torch-ready functions and layers.

Examples
--------
>>> import sympy as sp, symneuron as sn
>>> tau = sp.Symbol("tau", positive=True)
>>> lif = sn.Neuron(sn.V + (sn.X - sn.V) / tau, params={tau: 2.0}, learnable=[tau])
>>> layer = sn.NeuronLayer(lif)
"""

from . import models, nir, plot, surrogate, testing
from .check import CheckReport, check
from .definition import H, S, State, V, X
from .layer import NeuronLayer
from .neuron import Neuron
from .ode import ODEState
from .recurrent import RecurrentNeuronLayer
from .simulate import simulate
from .stochastic import rank_seed
from .symbols import NOISE as noise
from .symbols import XI as xi
from .validate import NonFiniteError

__all__ = [
    "V",
    "X",
    "H",
    "S",
    "noise",
    "xi",
    "State",
    "ODEState",
    "Neuron",
    "NeuronLayer",
    "RecurrentNeuronLayer",
    "simulate",
    "rank_seed",
    "NonFiniteError",
    "check",
    "CheckReport",
    "models",
    "surrogate",
    "plot",
    "nir",
    "testing",
]
__version__ = "0.1.0"
