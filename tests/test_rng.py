"""The counter-based generator (symneuron.rng): Random123's known answers, the C, CUDA
and torch forms bit for bit, the key layout, the accuracy of the normals against
float64 and mpmath, and their statistics against closed forms."""

from __future__ import annotations

import ctypes
import math
import re

import mpmath
import numpy as np
import pytest
import torch
from conftest import nvrtc_or_skip

from symneuron import rng
from symneuron.runtime import cpu

# Random123 tests/kat_vectors, the three "philox4x32 7" lines (the draws' rounds):
# counter, key, words
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A),
    ),
]
# and its three "philox4x32 10" lines (Random123's default rounds)
KAT10 = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]

# One driver for both languages: SN_KERNEL and SN_EACH are set per language.
DRIVER = """
#define SN_KEY(i) (sn_u64)seed[i], (sn_u64)offset[i], (sn_u32)stream[i], (sn_u64)step[i], \\
    (sn_u64)neuron[i]
#define SN_ARGS long long n, const long long* seed, const long long* offset, \\
    const long long* stream, const long long* step, const long long* neuron

SN_KERNEL test_philox(long long n, const unsigned int* ctr, const unsigned int* key,
                      unsigned int* out) {
    SN_EACH(i) {
        sn_u32x4 c = {{ctr[4 * i], ctr[4 * i + 1], ctr[4 * i + 2], ctr[4 * i + 3]}};
        c = sn_philox4x32(c, key[2 * i], key[2 * i + 1]);
        for (int k = 0; k < 4; ++k) out[4 * i + k] = c.v[k];
    }
}

SN_KERNEL test_words(SN_ARGS, unsigned int* out) {
    SN_EACH(i) {
        const sn_u32x4 w = sn_rng_block(SN_KEY(i));
        for (int k = 0; k < 4; ++k) out[4 * i + k] = w.v[k];
    }
}

SN_KERNEL test_uniform_float(SN_ARGS, float* out) {
    SN_EACH(i) out[i] = sn_rng_uniform_float(SN_KEY(i));
}
SN_KERNEL test_uniform_double(SN_ARGS, double* out) {
    SN_EACH(i) out[i] = sn_rng_uniform_double(SN_KEY(i));
}
SN_KERNEL test_normal_float(SN_ARGS, float* out) {
    SN_EACH(i) out[i] = sn_rng_normal_float(SN_KEY(i));
}
SN_KERNEL test_normal_double(SN_ARGS, double* out) {
    SN_EACH(i) out[i] = sn_rng_normal_double(SN_KEY(i));
}
"""
# CUDA only: a step's K lanes from their first key (the keys of one thread: neurons i0 ..
# i0 + K - 1, i0 a multiple of K, one seed, offset, stream and step)
LANES = """
template <int K, typename T, void (*FILL)(T*, sn_u64, sn_u64, sn_u32, sn_u64, sn_u64)>
__device__ void sn_lanes(SN_ARGS, T* out) {
    SN_EACH(t) {
        if (t % K == 0) {
            T z[K];
            FILL(z, SN_KEY(t));
            for (int j = 0; j < K && t + j < n; ++j) out[t + j] = z[j];
        }
    }
}
#define SN_LANES(name, K, T, fill) SN_KERNEL name(SN_ARGS, T* out) { \\
    sn_lanes<K, T, fill<K>>(n, seed, offset, stream, step, neuron, out); }
SN_LANES(test_lanes4_float, 4, float, sn_rng_normals_float)
SN_LANES(test_lanes2_double, 2, double, sn_rng_normals_double)
SN_LANES(test_lanes4_fast, 4, float, sn_rng_normals_fast_float)
SN_LANES(test_lanes1_fast, 1, float, sn_rng_normals_fast_float)
extern "C" __global__ void test_box_muller_fast(long long n, const unsigned int* wu,
                                                const unsigned int* wv, float* out) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const sn_pair_float z = sn_box_muller_fast_float(wu[i], wv[i]);
        out[2 * i] = z.z0;
        out[2 * i + 1] = z.z1;
    }
}
"""
C_DRIVER = "#define SN_KERNEL void\n#define SN_EACH(i) for (long long i = 0; i < n; ++i)\n" + DRIVER
CUDA_DRIVER = (
    '#define SN_KERNEL extern "C" __global__ void\n'
    "#define SN_EACH(i) const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;"
    " if (i < n)\n" + DRIVER
)
FLOAT = {"float": torch.float32, "double": torch.float64}


def _keys(combos: int, count: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Random keys that reach every word of the counter and the key (seeds and neurons
    above 2^32, offset + step above 2^32, all streams): ``combos`` of (seed, offset,
    stream), each with ``count`` random (step, neuron)."""
    g = torch.Generator().manual_seed(seed)

    def draw(bits: int, n: int) -> torch.Tensor:
        return torch.randint(0, min(2**bits, 2**63 - 1), (n,), generator=g, dtype=torch.int64)

    out = []
    for _ in range(combos):
        fixed = {"seed": draw(63, 1), "offset": draw(62, 1), "stream": draw(16, 1)}
        keys = {k: v.expand(count) for k, v in fixed.items()}
        out.append({**keys, "step": draw(10, count), "neuron": draw(40, count)})
    return out


def _torch_form(keys: dict[str, torch.Tensor], draw: str, dtype: torch.dtype) -> torch.Tensor:
    """The torch form (:func:`rng.uniform` or :func:`rng.normal`) of keys sharing their
    seed, offset and stream."""
    fixed = [int(keys[k][0]) for k in ("seed", "offset", "stream")]
    return getattr(rng, draw)(*fixed, keys["step"], keys["neuron"], dtype=dtype)


def _layout(keys: dict[str, torch.Tensor]) -> tuple[tuple, tuple]:
    """The counter and key as the module docstring writes them (the test's own copy)."""
    group, time = keys["neuron"] // 4, keys["offset"] + keys["step"]
    high = (time // 2**32) % 2**16 + 2**16 * keys["stream"]
    return (group % 2**32, group // 2**32, time % 2**32, high), (
        keys["seed"] % 2**32,
        keys["seed"] // 2**32,
    )


def _words(keys: dict[str, torch.Tensor]) -> torch.Tensor:
    """[n, 4] words of Philox at the documented counter and key."""
    return torch.stack(rng.philox4x32(*_layout(keys)), -1)


@pytest.fixture(scope="module")
def c_library() -> ctypes.CDLL:
    if cpu.problem():
        pytest.skip(cpu.problem())
    return cpu.load(rng.source("c") + C_DRIVER)


def _ptr(a: np.ndarray | torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data if isinstance(a, np.ndarray) else a.data_ptr())


def _c_form(
    lib: ctypes.CDLL, name: str, keys: dict[str, torch.Tensor], dtype: torch.dtype
) -> torch.Tensor:
    """Driver kernel ``name`` of the C form on every key (``int32``: four words per key)."""
    args = [keys[k].contiguous() for k in ("seed", "offset", "stream", "step", "neuron")]
    n = len(args[0])
    out = torch.zeros((n, 4) if dtype == torch.int32 else (n,), dtype=dtype)
    getattr(lib, name)(ctypes.c_longlong(n), *(_ptr(a) for a in args), _ptr(out))
    return out.to(torch.int64) & 0xFFFFFFFF if dtype == torch.int32 else out


# -- the generator --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("counter", "key", "expected", "rounds"),
    [(*kat, 7) for kat in KAT] + [(*kat, 10) for kat in KAT10],
)
def test_known_answers_of_random123_in_torch(counter, key, expected, rounds) -> None:
    assert rng.philox4x32(counter, key, rounds=rounds) == expected
    as_tensors = rng.philox4x32(
        tuple(torch.tensor([c]) for c in counter),
        tuple(torch.tensor([k]) for k in key),
        rounds=rounds,
    )
    assert tuple(int(w) for w in as_tensors) == expected


def test_the_draws_take_seven_rounds() -> None:
    assert rng.ROUNDS == 7 and "Philox4x32-7" in rng.source("c")
    assert rng.philox4x32((0, 0, 0, 0), (0, 0)) == KAT[0][2]


def test_known_answers_of_random123_in_c(c_library: ctypes.CDLL) -> None:
    ctr = np.array([c for c, _, _ in KAT], dtype=np.uint32)
    key = np.array([k for _, k, _ in KAT], dtype=np.uint32)
    out = np.zeros((len(KAT), 4), dtype=np.uint32)
    c_library.test_philox(ctypes.c_longlong(len(KAT)), *(_ptr(a) for a in (ctr, key, out)))
    assert out.tolist() == [list(e) for _, _, e in KAT]


def test_the_torch_form_takes_the_documented_key_layout() -> None:
    for keys in _keys(4, 64, seed=1):
        got = torch.stack(
            rng.words(
                *(int(keys[k][0]) for k in ("seed", "offset", "stream")),
                keys["step"],
                keys["neuron"],
            ),
            -1,
        )
        assert torch.equal(got, _words(keys))


def test_c_words_equal_torch_words_over_1e5_keys(c_library: ctypes.CDLL) -> None:
    keys = {k: torch.cat([c[k] for c in _keys(8, 16384, seed=2)]) for k in _keys(1, 1)[0]}
    assert torch.equal(_c_form(c_library, "test_words", keys, torch.int32), _words(keys))


@pytest.mark.parametrize("draw", ["uniform", "normal"])
@pytest.mark.parametrize("real", ["float", "double"])
def test_c_draws_equal_torch_draws_bit_for_bit(
    c_library: ctypes.CDLL, draw: str, real: str
) -> None:
    """Uniforms and normals: the same bits in C and torch over 8 x 16384 keys."""
    for keys in _keys(8, 16384, seed=3):
        c = _c_form(c_library, f"test_{draw}_{real}", keys, FLOAT[real])
        t = _torch_form(keys, draw, FLOAT[real])
        assert torch.equal(c.view(-1), t.view(-1)), (c - t).abs().max()


# -- the key layout -------------------------------------------------------------------


def test_a_draw_does_not_depend_on_which_others_are_computed() -> None:
    steps, neurons = torch.arange(6)[:, None], torch.arange(4096)
    whole = rng.normal(11, 5, 2, steps, neurons)
    picked = torch.randperm(4096, generator=torch.Generator().manual_seed(4))[:333]
    assert torch.equal(rng.normal(11, 5, 2, steps, picked), whole[:, picked])
    assert torch.equal(rng.normal(11, 5, 2, 3, neurons[1::7]), whole[3, 1::7])
    one = torch.stack([rng.normal(11, 5, 2, 4, torch.tensor([n]))[0] for n in range(0, 4096, 97)])
    assert torch.equal(one, whole[4, ::97])


def test_the_offset_continues_the_steps_of_the_previous_call() -> None:
    """Two calls of T steps (the offset advanced by T) draw what one call of 2T draws."""
    neurons, t = torch.arange(256), torch.arange(8)[:, None]
    both = rng.normal(3, 100, 0, torch.arange(16)[:, None], neurons)
    assert torch.equal(rng.normal(3, 100, 0, t, neurons), both[:8])
    assert torch.equal(rng.normal(3, 108, 0, t, neurons), both[8:])


@pytest.mark.parametrize(
    "other",
    [
        {"seed": 8},
        {"seed": 7 + 2**32},
        {"offset": 1},
        {"offset": 2**32},
        {"stream": 1},
        {"stream": rng.ESCAPE_STREAM},
    ],
    ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()),
)
def test_another_seed_offset_or_stream_draws_other_numbers(other: dict[str, int]) -> None:
    key = {"seed": 7, "offset": 0, "stream": 0}
    neurons = torch.arange(2**14)
    a = rng.uniform(**key, step=0, neuron=neurons)
    b = rng.uniform(**{**key, **other}, step=0, neuron=neurons)
    # independent uniforms on 2^23 cells: a few coincidences at most, never systematic
    assert int((a == b).sum()) <= 2


def test_the_four_neurons_of_a_group_take_the_four_words() -> None:
    w = torch.stack(rng.words(9, 0, 0, 2, torch.tensor([40])), -1)[0]
    u = rng.uniform(9, 0, 0, 2, torch.arange(40, 44), dtype=torch.float64)
    assert torch.equal(u, ((w >> 9) * 2 + 1).double() * 2.0**-24)
    assert len(set(rng.normal(9, 0, 0, 2, torch.arange(40, 44)).tolist())) == 4


# -- accuracy -------------------------------------------------------------------------


def _oracle_inputs(step: torch.Tensor, neuron: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(u, v, sine) of each draw, from the words by the documented formulas: normal n % 4
    is Box–Muller of words (0, 1) or (2, 3), the cosine for even n, the sine for odd."""
    w = torch.stack(rng.words(5, 0, 0, step, neuron), -1)
    first = (neuron & 2).expand(w.shape[:-1])[..., None]
    u, v = (((w.gather(-1, first + k)[..., 0] >> 9) * 2 + 1).double() * 2.0**-24 for k in (0, 1))
    return u, v, (neuron & 1).expand(u.shape) == 1


def _float32_ulps(normal) -> tuple[torch.Tensor, float]:
    """``normal``'s float32 normals on 256 x 4096 keys and their largest distance, in
    float32 ulps, from Box–Muller in float64 with torch's log, cos and sin on the same
    uniforms (whose own error, about 1e-16 relative off the zeros of cos and sin, is
    negligible)."""
    step, neuron = torch.arange(256)[:, None], torch.arange(4096)
    u, v, sine = _oracle_inputs(step, neuron)
    turn = torch.where(sine, torch.sin(2 * math.pi * v), torch.cos(2 * math.pi * v))
    ref = torch.sqrt(-2 * torch.log(u)) * turn
    z = normal(5, 0, 0, step, neuron)
    ulps = (z.double() - ref).abs() / torch.from_numpy(np.spacing(ref.abs().float().numpy()))
    return z, float(ulps.max())


def test_float32_normals_are_within_4_ulps_of_box_muller_in_float64() -> None:
    ulps = _float32_ulps(rng.normal)[1]
    assert ulps <= 4, ulps


def test_fast_float_normals_model_is_within_1e_6_of_box_muller_in_float64() -> None:
    """The fast conversion of 16-bit kernels, modelled with torch's float32 log2, sin and
    cos: within 1e-6 of Box–Muller in float64 (8.4e-7 measured; an absolute bound, since
    its angle 2π(v − ½) is rounded once, which near a zero of the sine or cosine is many
    ulps of the tiny result), and not the exact float32 normals' bits."""
    step, neuron = torch.arange(256)[:, None], torch.arange(4096)
    u, v, sine = _oracle_inputs(step, neuron)
    turn = torch.where(sine, torch.sin(2 * math.pi * v), torch.cos(2 * math.pi * v))
    ref = torch.sqrt(-2 * torch.log(u)) * turn
    z = rng.normal_fast(5, 0, 0, step, neuron)
    assert float((z.double() - ref).abs().max()) < 1e-6
    assert not torch.equal(z, rng.normal(5, 0, 0, step, neuron))


def test_float64_normals_are_within_4_ulps_of_box_muller_in_mpmath() -> None:
    step, neuron = torch.arange(3)[:, None], torch.arange(1000)
    u, v, sine = (t.flatten().tolist() for t in _oracle_inputs(step, neuron))
    z = rng.normal(5, 0, 0, step, neuron, dtype=torch.float64).flatten().tolist()
    worst = 0.0
    with mpmath.workdps(40):
        for zi, ui, vi, si in zip(z, u, v, sine, strict=True):
            turn = (mpmath.sin if si else mpmath.cos)(2 * mpmath.pi * vi)
            ref = mpmath.sqrt(-2 * mpmath.log(ui)) * turn
            worst = max(worst, float(abs(zi - ref)) / float(np.spacing(abs(float(ref)))))
    assert worst <= 4, worst


# -- statistics -----------------------------------------------------------------------

N_STAT = 2**20


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_normals_have_mean_0_variance_1_and_no_correlation(dtype: torch.dtype) -> None:
    """2^20 draws (256 steps x 4096 neurons) within 5 standard errors of N(0, 1): mean
    (SE 1/sqrt(n)), variance (SE sqrt(2/n)), and zero correlation between the two normals
    of a Box–Muller pair, between neighbouring groups and between consecutive steps."""
    z = rng.normal(21, 0, 0, torch.arange(256)[:, None], torch.arange(4096), dtype=dtype).double()
    n = z.numel()
    assert abs(float(z.mean())) < 5 / math.sqrt(n)
    assert abs(float(z.var()) - 1) < 5 * math.sqrt(2 / n)
    pairs = [(z[:, 0::2], z[:, 1::2]), (z[:, :-4], z[:, 4:]), (z[:-1], z[1:])]
    for a, b in pairs:
        assert abs(float((a * b).mean())) < 5 / math.sqrt(a.numel())


def test_box_muller_radius_and_angle_have_their_distributions() -> None:
    """r² = z0² + z1² is exponential with mean 2 and atan2(z1, z0) uniform: chi-square
    over 64 equiprobable bins each, below the 1e-6 quantile of chi2(63) (133)."""
    z = rng.normal(22, 0, 0, torch.arange(256)[:, None], torch.arange(4096), dtype=torch.float64)
    z0, z1 = z[:, 0::2].flatten(), z[:, 1::2].flatten()
    cdf_r = 1 - torch.exp(-(z0**2 + z1**2) / 2)
    cdf_angle = (torch.atan2(z1, z0) + math.pi) / (2 * math.pi)
    for cdf in (cdf_r, cdf_angle):
        assert _chi_square(cdf, 64) < 133


def _chi_square(cdf: torch.Tensor, bins: int) -> float:
    """Pearson's statistic of values that are uniform on (0, 1) under the hypothesis."""
    counts = torch.bincount((cdf.flatten() * bins).long().clamp(0, bins - 1), minlength=bins)
    expected = cdf.numel() / bins
    return float(((counts - expected) ** 2 / expected).sum())


def test_uniforms_fill_1024_bins_evenly() -> None:
    """Chi-square over 1024 bins of 2^20 uniforms: mean 1023, sd 45; bound at 5 sd."""
    u = rng.uniform(23, 0, rng.ESCAPE_STREAM, torch.arange(256)[:, None], torch.arange(4096))
    assert abs(_chi_square(u.double(), 1024) - 1023) < 5 * math.sqrt(2 * 1023)
    assert float(u.min()) >= 2.0**-24 and float(u.max()) <= 1 - 2.0**-24


def test_kolmogorov_smirnov_against_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    step, neuron = torch.arange(64)[:, None], torch.arange(4096)
    z = rng.normal(24, 0, 0, step, neuron, dtype=torch.float64).flatten().numpy()
    u = rng.uniform(24, 0, 1, step, neuron, dtype=torch.float64).flatten().numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-4
    assert stats.kstest(u, "uniform").pvalue > 1e-4


# -- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"seed": -1}, ValueError, r"seed must be in \[0, 2\*\*63\), not -1"),
        ({"seed": 2**63}, ValueError, "seed % 2\\*\\*63"),
        ({"seed": float("nan")}, TypeError, "seed must be an integer"),
        ({"seed": True}, TypeError, "seed must be an integer"),
        ({"offset": 1.5}, TypeError, "offset must be an integer"),
        ({"seed": torch.tensor(3)}, None, None),
        ({"seed": torch.tensor([3, 4])}, TypeError, "one int64 value"),
        ({"offset": torch.tensor(3.0)}, TypeError, "one int64 value"),
        ({"stream": 2**16}, ValueError, "stream must be in"),
        ({"dtype": torch.float16}, TypeError, "draw in float32"),
    ],
)
def test_bad_keys_are_refused_with_the_fix(kw: dict, error: type | None, match: str | None) -> None:
    args = {"seed": 1, "offset": 0, "stream": 0, "step": 0, "neuron": torch.arange(4), **kw}
    if error is None:
        assert torch.equal(rng.normal(**args), rng.normal(**{**args, "seed": 3}))
        return
    with pytest.raises(error, match=match):
        rng.normal(**args)


def test_an_unknown_target_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"targets: \['c', 'cuda'\]"):
        rng.source("metal")


# -- the C and CUDA texts -------------------------------------------------------------


def test_the_uniform_prints_as_one_operation_per_statement() -> None:
    expected = {
        "c": "const float t3 = t2 * 0x1p-24f;",
        "cuda": "const float t3 = __fmul_rn(t2, 0x1p-24f);",
    }
    for target, line in expected.items():
        text = rng.source(target)
        body = text[text.index("sn_uniform_float(sn_u32 w) {") :].split("}")[0]
        assert body.splitlines()[1:] == [
            "    const sn_u32 t0 = w >> 8;",
            "    const sn_u32 t1 = t0 | 1u;",
            "    const float t2 = (float)t1;",
            f"    {line}",
            "    return t3;",
        ]
        qualifier = {
            "c": "static inline __attribute__((always_inline))",
            "cuda": "__device__ __forceinline__",
        }[target]
        assert f"{qualifier} float sn_uniform_float(sn_u32 w)" in text
        # no libm call in a draw (a call keeps the C lane loops scalar); sqrt is inline
        for call in ("frexp", "log", "sin(", "cos("):
            assert call not in text, call


def test_the_cuda_text_compiles_with_nvrtc_and_nothing_is_fused() -> None:
    """Six kernels; no multiply-add in the PTX (a fused a·b + c rounds once, torch twice)."""
    ptx = nvrtc_or_skip().compile_to_ptx(rng.source("cuda") + CUDA_DRIVER, name="rng.cu")
    assert ptx.count(".entry") == 6
    assert "fma" not in ptx
    assert ptx.count("mul.rn.f32") >= 20 and ptx.count("add.rn.f64") >= 20


def test_the_cuda_lane_templates_compile_and_share_one_block_per_four_lanes() -> None:
    """K = 4: one Philox call (seven products of each multiplier's high half) and two
    Box–Muller pairs (one division each; when fast, no division and one approximate
    logarithm, sine, cosine and square root each)."""
    ptx = nvrtc_or_skip().compile_to_ptx(rng.source("cuda") + CUDA_DRIVER + LANES, name="lanes.cu")
    entries = dict(re.findall(r"\.entry (\w+)\((.*?)\n\}\n", ptx, re.S))
    four, fast = entries["test_lanes4_float"], entries["test_lanes4_fast"]
    products = 2 * rng.ROUNDS
    assert four.count("mul.hi.u32") == products and four.count("div.rn.f32") == 2
    assert fast.count("mul.hi.u32") == products and "div.rn" not in fast
    for op in ("lg2", "sin", "cos", "sqrt"):
        assert fast.count(f"{op}.approx.ftz.f32") == 2, op
        assert entries["test_lanes1_fast"].count(f"{op}.approx.ftz.f32") == 1, op


# -- on a GPU -------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("words", torch.int32),
        ("uniform_float", torch.float32),
        ("uniform_double", torch.float64),
        ("normal_float", torch.float32),
        ("normal_double", torch.float64),
    ],
)
def test_cuda_draws_equal_torch_draws_on_cpu_and_gpu(name: str, dtype: torch.dtype) -> None:
    from symneuron.runtime import cuda
    from symneuron.signature import Geometry

    launch = cuda.launcher(cuda.load(rng.source("cuda") + CUDA_DRIVER, 0), f"test_{name}", 0)
    for keys in _keys(4, 16384, seed=6):
        on_gpu = {k: v.contiguous().cuda() for k, v in keys.items()}
        n = len(keys["seed"])
        out = torch.zeros((n, 4) if name == "words" else (n,), dtype=dtype, device="cuda")
        pointers = [on_gpu[k].data_ptr() for k in ("seed", "offset", "stream", "step", "neuron")]
        launch("q" + "P" * 6, [n, *pointers, out.data_ptr()], Geometry((n + 255) // 256, 256))
        got = out.cpu().to(torch.int64) & 0xFFFFFFFF if name == "words" else out.cpu()
        if name == "words":
            assert torch.equal(got, _words(keys))
            continue
        draw, real = name.split("_")
        assert torch.equal(got, _torch_form(keys, draw, FLOAT[real]))
        on_torch_gpu = _torch_form(on_gpu, draw, FLOAT[real]).cpu()
        assert torch.equal(got, on_torch_gpu), (got - on_torch_gpu).abs().max()


@pytest.mark.cuda
def test_cuda_lane_templates_draw_the_torch_normals_and_fast_ones_to_4e_6() -> None:
    """K lanes at once draw each key's normal: exact ones bit for bit (float32, K = 4;
    float64, K = 2); fast ones (16-bit kernels) the same bits for K = 4 and K = 1, and,
    where the normal is at least 0.01 in size, within 4e-6 of Box–Muller in float64 and
    of their torch model (the special function unit's sine and cosine are within about
    2^-21 on (−π, π), times a radius up to 5.6); within 1e-3 everywhere
    (:func:`test_cuda_fast_conversion_over_every_uniform` says why)."""
    from symneuron.runtime import cuda
    from symneuron.signature import Geometry

    module = cuda.load(rng.source("cuda") + CUDA_DRIVER + LANES, 0)
    n = 65536
    keys = {
        "seed": torch.full((n,), 12345),
        "offset": torch.full((n,), 2**40 + 7),
        "stream": torch.full((n,), 3),
        "step": torch.full((n,), 11),
        "neuron": torch.arange(n) + 2**33,
    }
    on_gpu = [keys[k].cuda() for k in ("seed", "offset", "stream", "step", "neuron")]

    def run(name: str, dtype: torch.dtype) -> torch.Tensor:
        out = torch.zeros(n, dtype=dtype, device="cuda")
        launch = cuda.launcher(module, name, 0)
        pointers = [a.data_ptr() for a in on_gpu]
        launch("q" + "P" * 6, [n, *pointers, out.data_ptr()], Geometry((n + 255) // 256, 256))
        return out.cpu()

    assert torch.equal(
        run("test_lanes4_float", torch.float32), _torch_form(keys, "normal", torch.float32)
    )
    assert torch.equal(
        run("test_lanes2_double", torch.float64), _torch_form(keys, "normal", torch.float64)
    )
    fast = run("test_lanes4_fast", torch.float32)
    assert torch.equal(fast, run("test_lanes1_fast", torch.float32))
    exact = _torch_form(keys, "normal", torch.float64)
    fixed = [int(keys[k][0]) for k in ("seed", "offset", "stream")]
    model = rng.normal_fast(*fixed, keys["step"], keys["neuron"])
    wide = exact.abs() >= 0.01
    for name, ref in (("float64", exact), ("the model", model.double())):
        error = (fast.double() - ref).abs()
        print(f"fast normals on the GPU from {name}: {float(error[wide].max()):.3g} where")
        print(f"|z| >= 0.01 ({int((~wide).sum())} draws below), {float(error.max()):.3g} overall")
        assert float(error[wide].max()) < 4e-6 and float(error.max()) < 1e-3


@pytest.mark.cuda
def test_cuda_fast_conversion_over_every_uniform() -> None:
    """The fast conversion of every one of the 2^23 radius words (the angle's word fixed)
    and of every angle word (the radius's fixed) against Box–Muller in float64: within
    4e-6 wherever the radius is at least 0.01; below it (u within 5e-5 of 1, a draw in
    20,000) the approximate logarithm's absolute error, about 2^-22, leaves the radius
    within 1e-3, a normal that small being stored in a 16-bit H among values of order 1."""
    from symneuron.runtime import cuda
    from symneuron.signature import Geometry

    launch = cuda.launcher(
        cuda.load(rng.source("cuda") + CUDA_DRIVER + LANES, 0), "test_box_muller_fast", 0
    )
    every = torch.arange(2**23, dtype=torch.int64) << 9
    fixed = torch.full_like(every, 0x5A5A5A5A)

    def fast(wu: torch.Tensor, wv: torch.Tensor) -> torch.Tensor:
        n, args = len(wu), [w.to(torch.int32).cuda() for w in (wu, wv)]
        out = torch.zeros(n, 2, device="cuda")
        launch(
            "qPPP",
            [n, *(a.data_ptr() for a in args), out.data_ptr()],
            Geometry((n + 255) // 256, 256),
        )
        return out.cpu().double()

    def exact(wu: torch.Tensor, wv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u, v = (((w >> 9) * 2 + 1).double() * 2.0**-24 for w in (wu, wv))
        r = torch.sqrt(-2 * torch.log(u))
        return torch.stack([r * torch.cos(2 * math.pi * v), r * torch.sin(2 * math.pi * v)], -1), r

    for wu, wv in ((every, fixed), (fixed, every)):
        z = fast(wu, wv)
        ref, r = exact(wu, wv)
        error = (z - ref).abs().amax(-1)
        wide = float(error[r >= 0.01].max())
        print(f"fast conversion: {wide:.3g} where r >= 0.01, {float(error.max()):.3g} overall")
        assert wide < 4e-6 and float(error.max()) < 1e-3
