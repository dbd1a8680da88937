"""The recurrent kernels' bodies: the neuron's own step with the recurrence around it.

A recurrent layer (DESIGN §3b) feeds each batch row's spikes back through a weight
``R`` [F, F]: ``X_eff[t] = x[t] + R·s[t−1]``. One kernel runs the whole sequence each
way; a block of threads (one thread per K neurons) owns one batch row, so the
cross-neuron parts of a step need only the block's barrier:

* forward, step t: each thread adds to its lanes' ``x[t]`` the recurrent input, the
  sum of ``R[c, m]`` over the previous step's spiking neurons ``m`` (spikes are 0/1,
  read from the row's shared buffer), into the register the neuron's step reads X
  from; then the unchanged step body (:meth:`StepPrinter.forward_lane`) runs and the
  lanes' spikes go to the shared buffer for step t+1. ``X_eff`` is stored for a
  backward that reads X.
* backward, step t (descending): the spikes' total gradient adds ``Σ_m R[m, c] ·
  dL/dX_eff[t+1][m]`` (the transposed product, dense) to ``dL/dS[t]`` in the register
  the step's backward reads it from; then the unchanged backward body runs and
  ``dL/dX_eff[t]`` goes to the shared buffer for step t−1.

Both buffers are double: step t reads one half and writes the other, so one barrier a
step suffices. The printing of loads, stores, lane bodies and a noisy neuron's draws is
:class:`~symneuron.codegen.steps.StepPrinter`'s (:mod:`.noise`: the generator's state
read once per row, each draw keyed by step t and the flat neuron index i0 + j, as in the
feedforward kernels); the dialect supplies the row, the threads, the shared buffer and
the barrier.
"""

from __future__ import annotations

from . import noise
from .steps import StepIO, StepPrinter

__all__ = ["RecurrentPrinter"]

#: unroll factor of the sums over a row's neurons (their loads come from L2)
UNROLL = 8


class RecurrentPrinter(StepPrinter):
    """The bodies of one spec's recurrent kernels for one dtype and dialect."""

    def _recurrent_sum(
        self, weights: str, factor: str, condition: str | None, span: str = "m = 0; m < F"
    ) -> list[str]:
        """``rec[j] = Σ_m factor(m) · weights[m · F + c0 + j]`` over the row's neurons m
        (only those where ``condition`` holds, factor 1 then)."""
        ct = self.dt.compute
        loop = self._sum_loop(f"{weights} + m * F + c0", factor, condition, span)
        return [f"{ct} rec[K];", *self.dialect.lane_loop(["rec[j] = 0;"]), *loop]

    def _sum_loop(self, row: str, factor: str, condition: str | None, span: str) -> list[str]:
        """``rec[j] += factor(m) · row(m)[j]`` for m in ``span``, ``row`` the pointer to
        row m's value of column c0."""
        add = (
            f"rec[j] += {self.load('w_m[j]')};"
            if condition
            else f"rec[j] += g_m * {self.load('w_m[j]')};"
        )
        inner = [f"const {self.dt.storage}* w_m = {row};"]
        inner += [] if condition else [f"const {self.dt.compute} g_m = {factor};"]
        inner += self.dialect.lane_loop([add])
        # unrolled: a thread keeps several rows' loads in flight (they come from L2)
        loop = [*self.dialect.unroll(str(UNROLL)), f"for (long long {span}; ++m) {{"]
        if condition:
            loop += [f"    if ({condition}) {{", *["        " + line for line in inner], "    }"]
        else:
            loop += ["    " + line for line in inner]
        return [*loop, "}"]

    def _add_to(self, register: str) -> list[str]:
        """The vector register's lanes plus ``rec``, rounded to storage (as the torch
        loop's ``x + s @ R.T`` is)."""
        value = f"{self.load(f'{register}.v[j]')} + rec[j]"
        return self.dialect.lane_loop([f"{register}.v[j] = {self.store(value)};"])

    def _buffers(self) -> list[str]:
        """This step's halves of the row's shared double buffer."""
        ct = self.dt.compute
        return [
            f"const {ct}* before = sn_shared + ((t + 1) & 1) * F;",
            f"{ct}* now = sn_shared + (t & 1) * F;",
        ]

    # -- the forward --------------------------------------------------------
    def forward(self, store_h: bool, v_mode: str) -> list[str]:
        io = self.forward_io(store_h, v_mode)  # X: read from x_v, which the sum fills
        arrays, vec, d = self.lane_arrays(), self.vec, self.dialect
        votes = d.name == "cuda"  # the spikes as warp-vote words: a sum over the spiking
        if votes:
            gather, publish = self._spiking_sum(), [f"flag[j] = s_v.v[j] != {self.store('0')};"]
        else:
            gather = self._recurrent_sum("weight_t", "", "before[m] != 0")
            publish = [f"now[c0 + j] = {self.load('s_v.v[j]')};"]
        step = [
            "const long long k = (long long)t * N + i0;",
            f"{vec} x_v = *(const {vec}*)(x_seq + k);",
            *gather,
            *self._add_to("x_v"),
            f"if (xeff_seq) *({vec}*)(xeff_seq + k) = x_v;",
            f"{vec} {', '.join(s.register for s in io.writes)};",
            *noise.step_draws(self, self.spec.noise_streams),
            *d.lane_loop(self.forward_lane(io)),
            *[self.write_vector(s) for s in io.writes],
            *d.lane_loop(publish),
        ]
        first = f"(s_init ? {self.load('s_init[i0 + j]')} : 0)"
        start = f"flag[j] = {first} != 0;" if votes else f"sn_shared[F + c0 + j] = {first};"
        init = [*d.lane_loop(self.lane_init()), *d.lane_loop([start])]
        last = [f"v_seq[i0 + j] = {self.store('V_l[j]')};"]
        last += [
            f"w_out[(long long){i} * N + i0 + j] = {self.store(f'w{i}_l[j]')};"
            for i in range(self.k)
        ]
        last = d.lane_loop(last) if v_mode == "last" else []
        return self._row(arrays, init, step, last, votes=votes)

    def _spiking_sum(self) -> list[str]:
        """CUDA: ``rec[j] = Σ weight_t[m · F + c0 + j]`` over the neurons m that spiked at
        step t−1, read from the vote words (bit b of word q: the neuron of lane q mod K
        of thread 32·(q / K) + b), in a fixed order: the result does not depend on timing."""
        ct, st = self.dt.compute, self.dt.storage
        add = self.dialect.lane_loop([f"rec[j] += {self.load('w_m[j]')};"])
        return [
            f"{ct} rec[K];",
            *self.dialect.lane_loop(["rec[j] = 0;"]),
            "const unsigned int* voted = sn_words + ((t + 1) & 1) * n_words;",
            "for (int q = 0; q < n_words; ++q) {",
            "    unsigned int bits = voted[q];",
            "    while (bits) {",
            "        const int b = __ffs(bits) - 1;",
            "        bits &= bits - 1;",
            "        const long long m = (long long)((q / K) * 32 + b) * K + q % K;",
            f"        const {st}* w_m = weight_t + m * F + c0;",
            *["        " + line for line in add],
            "    }",
            "}",
        ]

    def _votes(self, half: str) -> list[str]:
        """Every thread (active or not) votes its lanes' flags into the words of ``half``."""
        return [
            "for (int j = 0; j < K; ++j) {",
            "    const unsigned int bits = __ballot_sync(0xffffffffu, flag[j]);",
            f"    if ((threadIdx.x & 31) == 0) sn_words[{half} * n_words + "
            "(threadIdx.x >> 5) * K + j] = bits;",
            "}",
        ]

    def _row(
        self, arrays: list[tuple[str, str]], init: list[str], step: list[str], last: list[str],
        reverse: bool = False, votes: bool = False, helpers: list[str] | None = None,
        prefetch: list[str] | None = None,
    ) -> list[str]:  # fmt: skip
        """A row's kernel: the generator's state (a neuron that draws), its arrays, each
        thread's set-up, the time loop (``helpers``, a phase every thread of a neuron
        runs, after the step's ``prefetch``ed loads, and a barrier; then a step of the
        neurons' own threads, and the barrier), each thread's final stores, and the
        release.
        With ``helpers`` the rows of ``weight`` that fit on chip are loaded first
        (:meth:`~symneuron.codegen.dialects.Dialect.row_cache`)."""
        d = self.dialect
        # the cache's first byte: after the exchanged values and the parts, 16-aligned
        base = f"((2 + n_parts) * F * (long long)sizeof({self.dt.compute}) + 15) / 16 * 16"
        cache = d.row_cache(self.dt.storage, "weight", base) if helpers else []
        head = "for (int t = T - 1; t >= 0; --t) {" if reverse else "for (int t = 0; t < T; ++t) {"
        words = [
            "const int n_words = (int)(blockDim.x >> 5) * K;",
            "unsigned int* sn_words = (unsigned int*)(sn_shared + 2 * F);",
            "unsigned int flag[K];",
            *d.lane_loop(["flag[j] = 0;"]),
        ]
        return [
            *noise.state(self.spec),  # (the row's: C threads are scopes of a loop)
            *d.row_shared(
                self.dt.compute, "sn_shared", f"{'(2 + n_parts)' if helpers else '2'} * F"
            ),
            *([f"{self.dt.compute}* parts = sn_shared + 2 * F;"] if helpers else []),
            *(words if votes else []),
            *d.lane_arrays(arrays),
            *cache,
            *d.threads(arrays, init),
            *(self._votes("1") if votes else []),
            *([d.barrier()] if d.barrier() else []),
            head,
            *["    " + line for line in self._buffers()],
            *["    " + line for line in prefetch or []],
            *(
                ["    " + line for line in d.threads(arrays, helpers, helpers=True)]
                if helpers
                else []
            ),
            *(["    " + d.barrier()] if helpers and d.barrier() else []),
            *["    " + line for line in d.threads(arrays, step)],
            *(["    " + line for line in self._votes("(t & 1)")] if votes else []),
            *(["    " + d.barrier()] if d.barrier() else []),
            "}",
            *(d.threads(arrays, last) if last else []),
            *d.release(["sn_shared", *[f"{name}_row" for _, name in arrays]]),
        ]

    # -- the backward -------------------------------------------------------
    def backward(self, grad_v_mode: str) -> list[str]:
        at, d, vec = self.dt.accum, self.dialect, self.vec
        io = self.backward_io(grad_v_mode)
        arrays = self.lane_arrays() + [(self.dt.compute, carry) for carry, _ in io.carries]
        arrays += [(at, f"acc_{c}") for c in self.learnable()]
        # each of the n_parts threads of a neuron sums its part of the m range (CUDA:
        # up to 4 threads a neuron keep more loads in flight); the neuron's own thread
        # adds the parts in order
        # (CUDA: the first ``cached`` rows of each part's range from shared memory, the
        # rest from L2, in the same order)
        cached_row = "wcache + (part * cached + m - m0) * F + c0"
        partial = [
            "const long long m0 = part * chunk;",
            "const long long m1 = (part + 1) * chunk < F ? (part + 1) * chunk : F;",
            "const long long mc = m0 + cached < m1 ? m0 + cached : m1;",
            f"{self.dt.compute} rec[K];",
            *d.lane_loop(["rec[j] = 0;"]),
            *self._sum_loop(cached_row, "before[m]", None, "m = m0; m < mc"),
            *self._sum_loop("weight + m * F + c0", "before[m]", None, "m = mc; m < m1"),
            *d.lane_loop(["parts[part * F + c0 + j] = rec[j];"]),
        ]
        total = [f"{self.dt.compute} rec[K];", *d.lane_loop(["rec[j] = 0;"])]
        total += ["for (int p = 0; p < n_parts; ++p) {"]
        total += ["    " + line for line in d.lane_loop(["rec[j] += parts[p * F + c0 + j];"])]
        # CUDA: the step's loads are issued before the transposed product, whose time
        # hides their latency; C loads them in the step
        declared, loads = self._loads(io)
        index = "const long long k = (long long)t * N + i0;"
        prefetch = d.prefetch([index, *declared], loads)
        step = [
            *([] if prefetch else [index, *declared, *loads]),
            *total,
            "}",
            *self._add_to("gs_v"),
            f"{vec} {', '.join(s.register for s in io.writes)};",
            *noise.backward_draws(self),
            *d.lane_loop(self.backward_lane(io, grad_v_mode)),
            *[self.write_vector(s) for s in io.writes],
            *d.lane_loop([f"now[c0 + j] = {self.load('gx_v.v[j]')};"]),
        ]
        init = [f"{carry}[j] = 0;" for carry, _ in io.carries]
        init += [f"acc_{c}[j] = 0;" for c in self.learnable()]
        final = [f"if (grad_v_init) grad_v_init[i0 + j] = {self.store('carry_l[j]')};"]
        final += [
            f"if (grad_w_init) grad_w_init[(long long){i} * N + i0 + j] = "
            f"{self.store(f'carry_w{i}_l[j]')};"
            for i in range(self.k)
        ]
        final += [f"grad_{c}_ptr[i0 + j] = acc_{c}[j];" for c in self.learnable()]
        init += ["sn_shared[(T & 1) * F + c0 + j] = 0;"]  # what "step T" passes back: 0
        return self._row(
            arrays, d.lane_loop(self.lane_init() + init), step, d.lane_loop(final),
            reverse=True, helpers=partial, prefetch=prefetch,
        )  # fmt: skip

    def _loads(self, io: StepIO) -> tuple[list[str], list[str]]:
        """This step's vectors, declared and loaded: H and W̃ of steps t and t−1 (no
        register carries them from step to step: a C thread runs the row's neurons in
        turn), X_eff, and the gradients of the spikes, V (and W) from the loss."""
        vec = self.vec
        now = [*self.streams("h"), *self.streams("wt"), *self.streams("grad_spike")]
        now += [s for s in io.reads if s.array not in ("grad_spike", "h_seq", "wt_seq")]
        before = [s for s in io.reads if s.register == "hp_v" or s.register.startswith("wtp")]
        loads = [f"{s.register} = *(const {vec}*)({self.array(s)} + k);" for s in now]
        loads += [
            f"if (t > 0) {s.register} = *(const {vec}*)({self.array(s)} + k - N);" for s in before
        ]
        return [f"{vec} {s.register};" for s in (*now, *before)], loads
