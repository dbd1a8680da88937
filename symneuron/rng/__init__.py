"""Counter-based random draws for noisy neurons: Philox4x32-7 in C, CUDA and torch.

A draw is a pure function of its key, so the backward regenerates the forward's noise
without storing it, and no value depends on the block, lane or thread layout that
computes it. The generator is Philox4x32-7 (Salmon et al. 2011, "Parallel random
numbers: as easy as 1, 2, 3"; Random123): 7 rounds map a 128-bit counter and a 64-bit
key to four 32-bit words. Seven is the fewest rounds with which its authors report that
Philox4x32 passes all of TestU01's BigCrush; cuRAND and torch's dropout take ten, for a
margin. Seven take about a quarter off a draw's instructions, which bound a noisy
neuron's backward on a GPU (:mod:`symneuron.rng.philox`).

Key layout. The draw of ``stream`` for ``neuron`` n at ``step`` t of a call whose
generator state is (``seed``, ``offset``) is part of one Philox block:

* key = (seed mod 2^32, seed div 2^32): the 64-bit seed;
* counter = (g mod 2^32, g div 2^32, τ mod 2^32, (τ div 2^32) mod 2^16 + 2^16·stream),
  with g = n div 4 (:data:`GROUP` adjacent neurons share a block) and τ = offset + t
  (48 bits: 2.8e14 steps before it wraps);
* neuron n takes word n mod 4 of the block (uniforms) or normal n mod 4 of the block's
  four (normals).

``offset`` counts steps: a layer that runs T steps advances it by T, so no two calls of
one seed share a number, and two calls of T steps draw what one call of 2T steps draws.
``stream`` (16 bits) tells draws of one neuron-step apart: 0, 1, ... for the noise
sources (V first, then the states in order), :data:`ESCAPE_STREAM` for the uniforms of
escape noise. Seeds and offsets are integers in [0, 2^63).

Conversions. Both dtypes convert the same words to the same value, so a float32 kernel
and the float64 reference draw one number, rounded to each precision:

* uniform: u = (2·(w div 2^9) + 1)·2^-24, the midpoint of one of 2^23 equal cells of
  (0, 1): in [2^-24, 1 − 2^-24], never 0 or 1, exact in float32 and float64;
* normal: Box–Muller on two uniforms (u from one word, v from the next),
  z = √(−2 ln u)·(cos 2πv, sin 2πv); the block's words (w0, w1) and (w2, w3) give its
  four normals (z0, z1, z2, z3), so one Philox call serves four neurons. |z| ≤
  √(48 ln 2) ≈ 5.77: the tails beyond it (8 in 10^9 draws of N(0, 1)) are cut.

Bit for bit. The words and uniforms are integer operations and exact conversions, so
every form returns the same bits. ln, sin and cos are not correctly rounded: torch
(Sleef, MKL), glibc and CUDA's libdevice differ by an ulp or two (a Box–Muller from
torch's and glibc's log, cos and sin differs in 21% of float32 and 1.3% of float64
draws, by up to 3 ulps). So the normal is built from correctly rounded operations
only (+, −, ×, /, √, and the exponent and mantissa read off the bits):
ln u = e·ln 2 + 2 atanh((m − 1)/(m + 1)) for u = m·2^e, and 2πv is reduced exactly in
integers to j quarter turns and a fraction f ∈ [−½, ½] (4v = j + f), with sin(πf/2)
and cos(πf/2) as polynomials in f. The steps are written once
(:func:`symneuron.rng.convert.box_muller`), run by torch and printed as C and CUDA, one
operation each in one order, so the three forms agree bit for bit
provided nothing fuses a product and a sum into one rounding: the CUDA text spells each
operation with a ``__f*_rn`` / ``__d*_rn`` intrinsic (never contracted; the PTX holds no
``fma``), the C text puts one operation in each statement (GCC at ``-std=c99``,
symneuron's flags, and clang by default contract within a statement only), and torch
runs each as its own kernel (eager mode: code that ``torch.compile`` fuses may
contract). torch's CPU square root is not correctly rounded (MKL: 16% of float32 and
1% of float64 results are one ulp off), so the torch form corrects it with an exact
residual (:func:`symneuron.rng.convert.sqrt`). The normals are within 4 ulps of exact
Box–Muller values (measured: 3.7 ulps in float32 against float64, 2.9 in float64
against mpmath). The alternatives were weighed: an inverse CDF (Wichura's AS241) needs
ln in its tails and a rational of degree 7 per normal; a Box–Muller from the targets'
own ln, sin and cos (no cheaper on a GPU: 104 PTX instructions per pair with CUDA's
``logf``, ``sincospif`` and ``sqrtf``, 100 here) agrees across forms only to 3 ulps.

Fast conversion. 16-bit CUDA kernels draw normals by
:func:`symneuron.rng.convert.box_muller_fast` (the GPU's approximate base-2 logarithm,
sine, cosine and square root): within 4e-6 of the exact normals where they are at least
0.01 in size and 2e-4 below, not bit for bit (:func:`normal_fast` is its torch model
with torch's float32 log2, sin and cos).

Guarantees. The same (seed, offset, stream, step, neuron) gives the same words and
uniforms on every form and dtype, and the same normal bits in C, CUDA and eager torch
(CPU and GPU) of one dtype; float32 and float64 normals of a key differ only by the
float32 rounding (a few ulps). No draw depends on which other draws are computed.

Forms. :func:`source` is the C (``"c"``) or CUDA (``"cuda"``) text with the functions
``sn_philox4x32``, ``sn_rng_block(seed, offset, stream, step, neuron)`` (the block of
a key), ``sn_uniform_<T>(word)``, ``sn_normal_<T>(block, neuron)``, ``sn_word(block,
neuron)``, and ``sn_rng_uniform_<T>`` / ``sn_rng_normal_<T>`` (the draw of one key), for
``T`` = ``float`` and ``double``. :func:`words`, :func:`uniform` and :func:`normal` are
the torch forms, vectorised over tensors of steps and neurons.

Examples
--------
>>> import torch
>>> from symneuron import rng
>>> z = rng.normal(seed=7, offset=0, stream=0, step=3, neuron=torch.arange(8))
>>> torch.equal(z[5:], rng.normal(7, 0, 0, 3, torch.arange(5, 8)))
True
"""

from __future__ import annotations

from .convert import normal, normal_fast, uniform
from .philox import ESCAPE_STREAM, GROUP, PHILOX_M, PHILOX_W, ROUNDS, philox4x32, words
from .text import TARGETS, source

__all__ = [
    "ESCAPE_STREAM",
    "GROUP",
    "PHILOX_M",
    "PHILOX_W",
    "ROUNDS",
    "TARGETS",
    "normal",
    "normal_fast",
    "philox4x32",
    "source",
    "uniform",
    "words",
]
