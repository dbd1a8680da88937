"""The target languages: what wraps the shared step bodies in C and in CUDA.

A :class:`Dialect` knows a language's scaffolding around the step bodies that
:mod:`~symneuron.codegen.steps` prints: the prelude, the K-lane vector type, the loop
over a thread's lanes and its unroll hints, the loop over neurons and its bounds check,
barriers and shared memory, and how one body becomes exported kernels. :class:`C` and
:class:`CUDA` are its subclasses (as tinygrad's renderers are built); the storage and
compute types come from :mod:`symneuron.dtypes`.

* CUDA: one thread per K adjacent neurons (K = 1 or the dtype's lanes, a template
  parameter), a loop over t inside the thread, no CUDA headers: 16-bit values are
  stored as ``unsigned short`` and converted with PTX ``cvt`` instructions, so
  NVRTC compiles without ``cuda_fp16.h`` and without a GPU or a CUDA toolkit.
* C: the same step bodies, one function per K: 1, or the dtype's lanes, K adjacent
  neurons per loop iteration, whose lane loops the compiler vectorises (the last
  N mod K neurons run one at a time in the same function), and an OpenMP loop over
  neurons (only for large N). One thread runs a block's neurons in order, so a
  barrier is nothing and shared memory is a local array.
"""

from __future__ import annotations

from .. import rng
from ..dtypes import DType
from .gather import Fetch, each_bit
from .lines import INDENT, indent

__all__ = ["Dialect", "C", "CUDA", "DIALECTS", "INDENT", "indent"]


class Dialect:
    """Scaffolding of one target language around the shared step bodies."""

    name = ""
    #: pointer qualifier promising no aliasing
    restrict = ""
    #: whether K is a template parameter (CUDA), so that a function over a thread's lanes
    #: is a template of K; else it is given K, and a step's draws for its lanes are
    #: filled into arrays before the lane loop (:mod:`.noise`)
    lane_templates = False

    def random_source(self) -> str:
        """The generator's functions a kernel that draws includes
        (:func:`symneuron.rng.source` for this language)."""
        return rng.source(self.name)

    def prelude(self, dtype: DType, lanes: tuple[int, ...]) -> str:
        """Definitions every kernel of a source uses (vector types, conversions)."""
        raise NotImplementedError

    def vector(self, dtype: DType) -> str:
        """The type of K adjacent storage values, loaded and stored as one."""
        raise NotImplementedError

    def unroll(self, factor: str | None = None) -> list[str]:
        """A hint to unroll the loop that follows (``factor`` times, or fully)."""
        return []

    def lane_loop(self, body: list[str]) -> list[str]:
        """``body`` once per lane ``j`` of the thread's K neurons."""
        return [*self.unroll(), "for (int j = 0; j < K; ++j) {", *indent(body), "}"]

    def neuron_loop(
        self, body: list[str], begin: str = "0", end: str = "N", parallel: bool = True
    ) -> list[str]:
        """``body`` for the K neurons from ``i0`` on, for every ``i0`` in [begin, end)."""
        raise NotImplementedError

    def barrier(self) -> str:
        """Wait until every thread of the block got here (and their writes are seen)."""
        raise NotImplementedError

    def kernels(
        self,
        name: str,
        params: list[str],
        body: list[str],
        lanes: dict[int, str],
        one_lane: bool = False,
    ) -> str:
        """``body`` as one exported kernel per lane count (``lanes``: K -> exported name);
        ``one_lane``: the wide kernel runs one neuron per iteration (C only)."""
        raise NotImplementedError

    # -- kernels whose neurons exchange data (one block per batch row) ----------
    #: whether the threads of a row exchange spikes as warp-vote words (:meth:`vote`)
    votes = False
    #: whether the dialect runs grid kernels (:meth:`grid_kernels`): blocks that wait
    #: for each other each step
    grids = False

    def row_kernels(
        self,
        name: str,
        params: list[str],
        body: list[str],
        lanes: dict[int, str],
        row_threads: str,
    ) -> str:
        """``body`` as the kernels of one batch row of ``F`` neurons each: it sees ``row0``
        (the row's first neuron), and runs its per-neuron parts in :meth:`threads`;
        ``row_threads``: the formula of the threads that own a row's neurons."""
        raise NotImplementedError

    def grid_kernels(
        self, name: str, params: list[str], body: list[str], lanes: dict[int, str], threads: int
    ) -> str:
        """``body`` as the kernels of a grid whose blocks each own ``S`` neurons of a row
        for a group of batch rows: it sees ``row`` (the thread's batch row), ``c0``,
        ``i0``, ``cs0`` (the block's first neuron of the row) and ``active``, and runs
        its per-neuron parts in :meth:`threads` (dialects with :attr:`grids`); blocks of
        ``threads`` threads."""
        raise NotImplementedError

    def grid_barrier(self, counter: str) -> list[str]:
        """Every thread of every block waits until all blocks reach this point; the
        values each wrote to global memory before it are then visible to all
        (``counter``: a zeroed word of global memory, this barrier's)."""
        raise NotImplementedError

    def warp_lanes(self) -> list[str]:
        """``sn_lane``, ``sn_warp``, ``sn_warps``: the thread's lane, its warp, the
        block's warps."""
        raise NotImplementedError

    def warp_sum(self, var: str, width: str) -> list[str]:
        """Add the ``var`` of lanes ``width`` apart into the first ``width`` lanes'."""
        raise NotImplementedError

    def shared_load(self, ref: str) -> str:
        """A load of a value another block wrote before the last grid barrier."""
        raise NotImplementedError

    def set_bit(self, words: str, index: str) -> str:
        """Set bit ``index`` of the bit array at ``words`` (other threads set others)."""
        raise NotImplementedError

    def each_set(self, words: str, count: str, storage: str, fetch: Fetch, use: Fetch) -> list[str]:
        """For each ``m`` whose bit is set in the ``count`` words at ``words``, in
        increasing order: ``fetch(a)``'s lines (they load m's values into ``a[j]``, an
        array of ``storage``), then ``use(a)``'s (they read them). CUDA fetches
        :data:`~.gather.GATHER` neurons' values before it uses the first, so that their loads are
        in flight together."""
        raise NotImplementedError

    def slice_cache(
        self, storage: str, source: str, base: str, columns: str | None, reserve: int
    ) -> list[str]:
        """``sn_wslice``: the first ``cached`` rows of columns [cs0, cs0 + S) of the
        [F, F] ``source``, as many as the launch's dynamic shared memory holds after its
        first ``base`` bytes: as [cached][S], or with ``columns`` (C text of the stride
        ``sn_stride`` in ``cached``, at most ``cached + reserve``) as [S][sn_stride]."""
        raise NotImplementedError

    def lane_arrays(self, arrays: list[tuple[str, str]]) -> list[str]:
        """Declare per-lane arrays (type, name) that live through the whole time loop."""
        raise NotImplementedError

    def threads(
        self, arrays: list[tuple[str, str]], body: list[str], helpers: bool = False
    ) -> list[str]:
        """``body`` for each thread's K neurons of the row (``c0``: the first one's column,
        ``i0``: its index in N), with ``arrays`` (:meth:`lane_arrays`) as ``name[j]``;
        ``helpers``: also in the threads that help the neuron's own (``part`` > 0 of
        ``n_parts``), which may not touch the arrays."""
        raise NotImplementedError

    def row_shared(self, nbytes: str) -> list[str]:
        """``sn_smem``: the ``nbytes`` bytes the threads of one row share."""
        raise NotImplementedError

    def vote(self, flags: str, words: str, slot: str, count: str) -> list[str]:
        """Every thread (active or not) votes its lanes' ``flags`` into the ``count``
        words of slot ``slot`` of ``words`` (dialects with :attr:`votes`)."""
        raise NotImplementedError

    def each_voted(
        self, words: str, count: str, storage: str, fetch: Fetch, use: Fetch
    ) -> list[str]:
        """As :meth:`each_set` for each neuron ``m`` whose vote bit is set in the
        ``count`` words at ``words``, in a fixed order (dialects with :attr:`votes`)."""
        raise NotImplementedError

    def release(self, names: list[str]) -> list[str]:
        """Free what :meth:`lane_arrays` and :meth:`row_shared` took (C's heap)."""
        return []

    def prefetch(self, declared: list[str], loads: list[str]) -> list[str]:
        """A step's ``loads`` issued by each neuron's own thread at the top of the time
        loop, into registers ``declared`` there, or nothing (C: the step loads them)."""
        return []

    def row_cache(self, storage: str, source: str, base: str, chunk: str) -> list[str]:
        """Rows of the [F, F] matrix ``source`` held on chip for the whole sequence, as
        many as the launch gave room for after the first ``base`` bytes of the row's
        shared memory: part p of the ``n_parts`` threads of a neuron finds the first
        ``cached`` rows of its ``chunk`` (the formula of its rows, p·chunk on) at
        ``wcache + (p·cached + q)·F``. Every thread of the block runs it, before the
        first barrier. C: none cached."""
        return [
            f"const long long chunk = {chunk};",
            "const long long cached = 0;",
            f"const {storage}* wcache = {source};",
        ]


class CDialect(Dialect):
    """C99: K lanes per loop iteration (macros set around each function), OpenMP."""

    name = "c"
    restrict = "restrict"
    #: neurons from which the loop over neurons runs in parallel (below, contention with
    #: torch's own thread pool made calls slower)
    parallel_from = 262144

    def prelude(self, dtype: DType, lanes: tuple[int, ...]) -> str:
        vectors = "".join(
            f"typedef struct {{\n{INDENT}{dtype.storage} v[{k}];\n}} sn_vec{k};\n" for k in lanes
        )
        return "#include <math.h>\n" + vectors

    def vector(self, dtype: DType) -> str:
        return "sn_vec"  # a macro naming the struct of the K in force

    def neuron_loop(
        self, body: list[str], begin: str = "0", end: str = "N", parallel: bool = True
    ) -> list[str]:
        omp = f"#pragma omp parallel for schedule(static) if ({end} >= {self.parallel_from})"
        head = f"for (long long i0 = {begin}; i0 < {end}; i0 += K) {{"
        return [*([omp] if parallel else []), head, *indent(body), "}"]

    def barrier(self) -> str:
        return ""

    def kernels(
        self,
        name: str,
        params: list[str],
        body: list[str],
        lanes: dict[int, str],
        one_lane: bool = False,
    ) -> str:
        joined = f",\n{INDENT}".join(params)
        return "\n".join(
            self._function(joined, body, 1 if one_lane else k, exported)
            for k, exported in lanes.items()
        )

    def row_kernels(
        self,
        name: str,
        params: list[str],
        body: list[str],
        lanes: dict[int, str],
        row_threads: str,
    ) -> str:
        """One thread runs a row's neurons in order at each step; rows run in parallel."""
        joined = f",\n{INDENT}".join(params)
        omp = f"#pragma omp parallel for schedule(static) if (N >= {self.parallel_from})"
        head = ["const int n_parts = 1, part = 0;  /* one thread: no helpers */"]
        loop = [omp, "for (long long row0 = 0; row0 < N; row0 += F) {", *indent(head + body), "}"]
        text = "\n".join(self._with_lanes(1, loop))  # one neuron per thread of a row
        return "#include <stdlib.h>\n" + "\n".join(
            f"void {exported}(\n{INDENT}{joined}) {{\n{text}\n}}\n" for exported in lanes.values()
        )

    def lane_arrays(self, arrays: list[tuple[str, str]]) -> list[str]:
        return [f"{ct}* {name}_row = ({ct}*)malloc(sizeof({ct}) * F);" for ct, name in arrays]

    def threads(
        self, arrays: list[tuple[str, str]], body: list[str], helpers: bool = False
    ) -> list[str]:
        views = [f"{ct}* {name} = {name}_row + c0;" for ct, name in arrays]
        head = ["const long long i0 = row0 + c0;", *views]
        return ["for (long long c0 = 0; c0 < F; c0 += K) {", *indent(head + body), "}"]

    def row_shared(self, nbytes: str) -> list[str]:
        return [f"unsigned char* sn_smem = (unsigned char*)malloc({nbytes});"]

    def release(self, names: list[str]) -> list[str]:
        return [f"free({name});" for name in names]

    def _with_lanes(self, count: int, loop: list[str]) -> list[str]:
        defines = [f"#define K {count}", f"#define sn_vec sn_vec{count}"]
        return [*defines, *indent(loop), "#undef sn_vec", "#undef K"]

    def _function(self, joined: str, body: list[str], k: int, exported: str) -> str:
        """C kernel ``exported`` with ``k`` lanes; the last N mod K neurons take the same
        body with one lane (vector loads and stores of K values never run past the end)
        and no parallel region."""
        if k == 1:
            lines = self._with_lanes(1, self.neuron_loop(body))
        else:
            wide = f"{INDENT}const long long n_wide = N - N % {k};"
            lines = [
                wide,
                *self._with_lanes(k, self.neuron_loop(body, "0", "n_wide")),
                *self._with_lanes(1, self.neuron_loop(body, "n_wide", "N", parallel=False)),
            ]
        text = "\n".join(lines)
        return f"void {exported}(\n{INDENT}{joined}) {{\n{text}\n}}\n"


_CUDA_PRELUDE = r"""
template <typename T, int K>
struct alignas(sizeof(T) * K) sn_vec {
    T v[K];
};

__device__ __forceinline__ float sn_h2f(unsigned short x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}
__device__ __forceinline__ unsigned short sn_f2h(float f) {
    unsigned short x;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x) : "f"(f));
    return x;
}
__device__ __forceinline__ float sn_b2f(unsigned short x) {
    return __uint_as_float(((unsigned int)x) << 16);
}
__device__ __forceinline__ unsigned short sn_f2b(float f) {
    unsigned short x;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(x) : "f"(f));
    return x;
}
"""


class CUDADialect(Dialect):
    """CUDA C++ for NVRTC: K lanes as a template parameter, one thread per K neurons."""

    name = "cuda"
    restrict = "__restrict__"
    votes = True
    grids = True
    lane_templates = True

    def prelude(self, dtype: DType, lanes: tuple[int, ...]) -> str:
        return _CUDA_PRELUDE

    def vector(self, dtype: DType) -> str:
        return f"sn_vec<{dtype.storage}, K>"

    def unroll(self, factor: str | None = None) -> list[str]:
        return ["#pragma unroll" + (f" {factor}" if factor else "")]

    def neuron_loop(
        self,
        body: list[str],
        begin: str = "0",
        end: str = "N",
        parallel: bool = True,
        early_exit: bool = True,
    ) -> list[str]:
        """One thread's K neurons. ``early_exit``: threads past ``end`` return at once;
        a kernel with barriers keeps them (no ``return`` before a barrier) and guards
        their work instead."""
        first = "const long long i0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * K"
        index = f"{first}{f' + {begin}' if begin != '0' else ''};"
        if early_exit:
            return [index, f"if (i0 >= {end}) return;", *body]
        return [index, f"if (i0 < {end}) {{", *indent(body), "}"]

    def barrier(self) -> str:
        return "__syncthreads();"

    def row_kernels(
        self,
        name: str,
        params: list[str],
        body: list[str],
        lanes: dict[int, str],
        row_threads: str,
    ) -> str:
        """One block per batch row, one thread per K neurons of it; threads past the row
        stay (no ``return`` before a barrier) and skip the per-neuron parts."""
        head = [
            "const long long row0 = (long long)blockIdx.x * F;",
            f"const int row_threads = (int)({row_threads});",
            "const int n_parts = blockDim.x / row_threads;  // threads per neuron",
            "const int part = threadIdx.x / row_threads;",
            "const long long c0 = (long long)(threadIdx.x % row_threads) * K;",
            "const long long i0 = row0 + c0;",
            "const bool active = part == 0 && c0 < F;",
        ]
        # a block may hold 1024 threads: registers capped so that it always launches
        return self._wrap(name, params, indent(head + body), lanes, "__launch_bounds__(1024) ")

    def grid_kernels(
        self, name: str, params: list[str], body: list[str], lanes: dict[int, str], threads: int
    ) -> str:
        """Block b owns neurons [cs0, cs0 + S) of the rows of its group (the blocks of a
        group cover a row's slices in order), S / K threads a row; the block's other
        threads help with the step's product."""
        # (32-bit indices within a row and a block: registers are the grid kernels' limit)
        head = [
            "const int B = (int)(N / F);",
            "const int n_slices = (int)((F + S - 1) / S);",
            "const int slice_threads = (int)(S / K);",
            "const int n_groups = gridDim.x / n_slices;",
            "const int group_rows = (B + n_groups - 1) / n_groups;",
            "const int cs0 = (int)((blockIdx.x % n_slices) * S);",
            "const int r0 = (blockIdx.x / n_slices) * group_rows;",
            "const int owners = group_rows * slice_threads;  // the threads that own neurons",
            "const int part = threadIdx.x / owners, own = threadIdx.x % owners;",
            "const int local_row = own / slice_threads;",
            "const int row = r0 + local_row;",
            "const int c0 = cs0 + (own % slice_threads) * K;",
            "const long long row0 = (long long)row * F;",
            "const long long i0 = row0 + c0;",
            "const bool active = part == 0 && row < B && c0 < F;",
        ]
        # registers: 65536 over the block's ``threads`` (the product's micro-tiles need
        # more than the 64 a thread of 1024 gets)
        bounds = f"__launch_bounds__({threads}) "
        return self._wrap(name, params, indent(head + body), lanes, bounds)

    def warp_lanes(self) -> list[str]:
        return [
            "const int sn_lane = threadIdx.x & 31;",
            "const int sn_warp = threadIdx.x >> 5, sn_warps = blockDim.x >> 5;",
        ]

    def warp_sum(self, var: str, width: str) -> list[str]:
        """Lanes l, l + width, l + 2·width, ... add their ``var`` into lane l's (every
        lane of the warp takes part; ``width`` a power of two)."""
        return [
            f"for (int off = 16; off >= {width}; off >>= 1) {{",
            f"    {var} += __shfl_down_sync(0xffffffffu, {var}, off);",
            "}",
        ]

    def grid_barrier(self, counter: str) -> list[str]:
        """A counter that only grows: barrier number g of the launch lets a block past
        once every block has added its 1 for it (g · blocks); thread 0 of each block
        waits on a volatile read (a loop of plain reads has no side effect, and C++
        lets the compiler assume it ends: it removed the wait), the fences publish the
        grid's writes both ways."""
        return [
            "__syncthreads();",
            "if (threadIdx.x == 0) {",
            "    ++sn_passed;",
            "    __threadfence();",
            f"    atomicAdd({counter}, 1u);",
            f"    while (*(volatile unsigned int*){counter} < sn_passed * gridDim.x) {{}}",
            "    __threadfence();",
            "}",
            "__syncthreads();",
        ]

    def shared_load(self, ref: str) -> str:
        return f"__ldcg(&{ref})"  # from L2: the SM's L1 may hold an older copy

    def set_bit(self, words: str, index: str) -> str:
        return f"atomicOr({words} + (({index}) >> 5), 1u << (({index}) & 31));"

    def each_set(self, words: str, count: str, storage: str, fetch: Fetch, use: Fetch) -> list[str]:
        return each_bit(words, count, "q * 32 + b", storage, fetch, use, self.unroll())

    def slice_cache(
        self, storage: str, source: str, base: str, columns: str | None, reserve: int
    ) -> list[str]:
        fit = f"((long long)sn_dyn - {base}) / ((long long)sizeof({storage}) * S) - {reserve}"
        if columns:  # [c][m], each column's stride sn_stride
            fill = [
                f"const int sn_stride = {columns};",
                "for (long long e = threadIdx.x; e < cached * S; e += blockDim.x) {",
                "    const long long c = e / cached, m = e % cached;",
                f"    sn_wslice[c * sn_stride + m] = cs0 + c < F ? {source}[m * F + cs0 + c]"
                f" : ({storage})0;",
                "}",
            ]
        else:
            fill = [
                "for (long long e = threadIdx.x; e < cached * S; e += blockDim.x) {",
                "    const long long c = cs0 + e % S;",
                f"    sn_wslice[e] = c < F ? {source}[(e / S) * F + c] : ({storage})0;",
                "}",
            ]
        return [
            "unsigned int sn_dyn;",
            'asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(sn_dyn));',
            f"const long long sn_fit = {fit};",
            "const int cached = (int)(sn_fit < 0 ? 0 : (sn_fit < F ? sn_fit : F));",
            f"{storage}* sn_wslice = ({storage}*)(sn_smem + {base});",
            *fill,
        ]

    def lane_arrays(self, arrays: list[tuple[str, str]]) -> list[str]:
        return [f"{ct} {name}[K];" for ct, name in arrays]

    def threads(
        self, arrays: list[tuple[str, str]], body: list[str], helpers: bool = False
    ) -> list[str]:
        return [f"if ({'c0 < F' if helpers else 'active'}) {{", *indent(body), "}"]

    def prefetch(self, declared: list[str], loads: list[str]) -> list[str]:
        return [*declared, "if (active) {", *indent(loads), "}"]

    def row_cache(self, storage: str, source: str, base: str, chunk: str) -> list[str]:
        """The rows that fit the launch's dynamic shared memory (read from the
        ``%dynamic_smem_size`` register) after its first ``base`` bytes."""
        fill = (
            "for (long long e = threadIdx.x; e < n_parts * cached * F; e += blockDim.x) {",
            "    const long long p = e / (cached * F), r = e - p * cached * F;",
            "    const long long m = p * chunk + r / F;",
            f"    if (m < F) sn_wcache[e] = {source}[m * F + r % F];",
            "}",
        )
        return [
            f"const long long chunk = {chunk};",
            "unsigned int sn_dyn;",
            'asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(sn_dyn));',
            f"const long long sn_base = {base};",
            "const long long sn_room = ((long long)sn_dyn - sn_base) / "
            f"((long long)sizeof({storage}) * F * n_parts);",
            "const long long cached = sn_room < 0 ? 0 : (sn_room < chunk ? sn_room : chunk);",
            f"{storage}* sn_wcache = ({storage}*)(sn_smem + sn_base);",
            *fill,
            f"const {storage}* wcache = sn_wcache;",
        ]

    def row_shared(self, nbytes: str) -> list[str]:
        """Dynamic shared memory (its bytes are the launch geometry's ``shared``)."""
        return ["extern __shared__ __align__(16) unsigned char sn_smem[];"]

    def vote(self, flags: str, words: str, slot: str, count: str) -> list[str]:
        """A warp's ballot per lane: bit b of word q is the flag of lane q mod K of
        thread 32·(q / K) + b."""
        return [
            "for (int j = 0; j < K; ++j) {",
            f"    const unsigned int bits = __ballot_sync(0xffffffffu, {flags}[j]);",
            f"    if ((threadIdx.x & 31) == 0) {words}[({slot}) * {count} + "
            "(threadIdx.x >> 5) * K + j] = bits;",
            "}",
        ]

    def each_voted(
        self, words: str, count: str, storage: str, fetch: Fetch, use: Fetch
    ) -> list[str]:
        index = "(long long)((q / K) * 32 + b) * K + q % K"
        return each_bit(words, count, index, storage, fetch, use, self.unroll())

    def kernels(
        self,
        name: str,
        params: list[str],
        body: list[str],
        lanes: dict[int, str],
        one_lane: bool = False,
    ) -> str:
        return self._wrap(name, params, indent(self.neuron_loop(body)), lanes)

    def _wrap(
        self,
        name: str,
        params: list[str],
        lines: list[str],
        lanes: dict[int, str],
        bounds: str = "",
    ) -> str:
        """A device function template over K and one exported kernel per lane count
        (``bounds``: its ``__launch_bounds__``, if any)."""
        joined = f",\n{INDENT}".join(params)
        text = "\n".join(lines)
        call = ", ".join(p.split()[-1] for p in params)
        out = [
            "template <int K>\n"
            f"__device__ __forceinline__ void {name}(\n{INDENT}{joined}) {{\n{text}\n}}\n"
        ]
        for k, exported in lanes.items():
            out.append(
                f'extern "C" __global__ void {bounds}{exported}(\n{INDENT}{joined}) {{\n'
                f"{INDENT}{name}<{k}>({call});\n}}\n"
            )
        return "\n".join(out)


C = CDialect()
CUDA = CUDADialect()

#: backend -> dialect
DIALECTS: dict[str, Dialect] = {"cpu": C, "cuda": CUDA}
