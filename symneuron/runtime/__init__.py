"""The runtime stage: generated source -> compiled kernels -> launches on torch tensors.

* :mod:`~symneuron.runtime.kernels`: a neuron's kernels on one backend
  (:class:`~symneuron.runtime.kernels.Program`): each variant rendered, compiled
  and looked up on first use, its arguments packed by name from the named arguments
  in :mod:`symneuron.signature`, launched with the variant's geometry; the table of
  backends.
* :mod:`~symneuron.runtime.cpu`, :mod:`~symneuron.runtime.cuda`: compile, load and
  launch for each backend (the system C compiler and ctypes; NVRTC through CuPy
  and ``cuLaunchKernel``); :mod:`~symneuron.runtime.nvrtc` compiles CUDA to PTX
  without a GPU (used by the tests).
* :mod:`~symneuron.runtime.cache`: where everything is stored and how it is keyed.
* :data:`settings`: the launch tuning knobs (threads per block, lanes), one
  :class:`~symneuron.runtime.tuning.Settings` object.
"""

from __future__ import annotations

from .tuning import Settings

__all__ = ["Kinds", "settings"]

#: A launch's argument kinds, one ``struct`` format character per value: "P" a device
#: pointer, "q" a ``long long``, "i" an ``int``, "d" a ``double`` (fixed per program and
#: pass, so a launch passes only the values).
Kinds = str

#: The process's launch settings (see :class:`~symneuron.runtime.tuning.Settings`).
settings = Settings()
