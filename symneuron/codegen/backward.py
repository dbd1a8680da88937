"""The backward pass's printer: one neuron's time loop t = T−1..0, printed from its spec.

Each step recomputes V[t−1] (and W[t−1]) from the stored H[t−1] and W̃[t−1] when its
partials need them, runs the transposed step map once per lane and stores dL/dX[t];
dL/dV (and dL/dW) are carried from step to step, each learnable parameter's gradient
summed in registers. A connection's stage (:mod:`.connection`) adds its lines around
the lanes' step: the transposed product into dL/dS's register before, dL/dX_eff
exchanged after.
"""

from __future__ import annotations

from ..derivation import grad_symbol
from ..signature import Variant
from . import noise
from .dialects import INDENT, indent
from .steps import NO_STAGE, Stage, StepIO, StepPrinter, Stream

__all__ = ["BackwardPrinter"]


class BackwardPrinter(StepPrinter):
    """Prints the backward kernels' bodies of one spec for one dtype and dialect."""

    def recompute_v(self) -> list[str]:
        """V[t-1] (and each W[t-1]) of this lane: the resets of step t-1, or the initial
        values at t = 0. Step t-1 is recomputed from H[t-1] and W̃[t-1] alone."""
        ct, states = self.dt.compute, range(self.kw)  # W[t-1] only when W̃ is saved
        inner = [
            self.read_lane(self.streams("h_prev")[0]),
            *[self.read_lane(s) for s in self.streams("wt_prev")],
            *([self.v_th_line()] if self.spec.threshold_per_step else []),
            # crossing firing has no reset: V[t-1] = H[t-1] needs no spike (nor V[t-2])
            *(self.fire("h_prev") if not self.spec.crossing else []),
        ]
        inner += self.block(self.spec.reset, h="h_prev", declare=False)
        inner += self.positive_zero()
        if self.kw:
            inner += self.block(self.spec.state_resets, mutable=True, h="h_prev")
        return [
            f"{ct} V;",
            *[f"{ct} w{i};" for i in states],
            "if (t > 0) {",
            *indent(inner),
            "} else {",
            f"{INDENT}V = V_l[j];",
            *[f"{INDENT}w{i} = w{i}_l[j];" for i in states],
            "}",
        ]

    def grad_in(self, stream: Stream, carry: str, mode: str) -> str:
        """A gradient carried from step t+1 plus, by ``mode``, this step's from the loss
        (``seq``: its vector lane, ``last``: read at t = T − 1 only)."""
        state = "" if stream.state is None else f"(long long){stream.state} * N + "
        extra = {
            "none": "",
            "seq": f" + {self.load(f'{stream.register}.v[j]')}",
            "last": f" + (t == T - 1 ? {self.load(f'{stream.array}[{state}i0 + j]')} : 0)",
        }[mode]
        return f"const {self.dt.compute} {stream.value} = {carry}[j]{extra};"

    def carries(self) -> bool:
        """Whether H (and W̃) of step t-1 are loaded each step and carried to the next."""
        return self.spec.needs_v or self.kw > 0

    def loads(self, io: StepIO) -> list[str]:
        out, previous = [], {*self.streams("h_prev"), *self.streams("wt_prev")}
        for s in io.reads:
            if s in previous:  # step t-1's values, carried to the next iteration
                out += [
                    f"{self.vec} {s.register};",
                    f"if (t > 0) {s.register} = *(const {self.vec}*)({self.array(s)} + k - N);",
                ]
            elif s.array == "grad_spike":
                out += [f"{self.vec} gs_v;", "if (grad_spike_scalar) {"]
                out += indent(self.dialect.lane_loop(["gs_v.v[j] = gs_scalar;"]))
                out += ["} else {", f"{INDENT}gs_v = *(const {self.vec}*)(grad_spike + k);", "}"]
            else:
                out.append(self.read_vector(s))
        return out

    def lane(self, io: StepIO, grad_v_mode: str) -> list[str]:
        at, spec = self.dt.accum, self.spec
        # H and W̃ of step t from their registers (loaded, or carried from step t+1)
        plain = [*self.streams("h"), *self.streams("wt")]
        plain += self.streams("x") if spec.needs_x else []
        (grad_v, *grad_w), carries = self.streams("grad_v") + self.streams("grad_w"), io.carries
        return [
            *self.lane_params(),
            *(self.recompute_v() if spec.needs_v or spec.needs_w else []),
            *[self.read_lane(s) for s in plain],
            *noise.normals(noise.read_by(spec, spec.backward.reads), self.dt.compute),
            *([self.v_th_line()] if spec.threshold_per_step else []),
            *self.fire("h"),
            *self.block(spec.surrogate),
            self.read_lane(self.streams("grad_spike")[0]),
            *[
                self.grad_in(s, c, grad_v_mode)
                for s, (c, _) in zip([grad_v, *grad_w], carries, strict=True)
            ],
            *self.block(spec.backward),
            *[self.write_lane(s) for s in io.writes],
            *[f"acc_{c}[j] += ({at})grad_{c};" for c in self.learnable()],
            *[f"{carry}[j] = {value};" for carry, value in carries],
        ]

    def learnable(self) -> list[str]:
        return [self.pnames[n] for n in self.spec.learnable]

    def io(self, variant: Variant, mutable: frozenset[str] = frozenset()) -> StepIO:
        """H (of step t−1 where carried), W̃, X where read, and the loss's gradients
        read; dL/dX written; dL/dV and dL/dW carried to step t−1."""
        carried = self.carries()
        reads = [*self.streams("h_prev" if carried else "h"), *self.streams("wt_prev")]
        reads += [*(self.streams("x") if self.spec.needs_x else []), *self.streams("grad_spike")]
        if variant.option("grad_v_mode") == "seq":
            reads += [*self.streams("grad_v"), *self.streams("grad_w")]
        grads = [("carry_l", "V"), *((f"carry_w{i}_l", f"W{i}") for i in range(self.k))]
        carries = tuple((carry, str(grad_symbol(name))) for carry, name in grads)
        return StepIO(tuple(reads), tuple(self.streams("grad_x")), carries, mutable)

    def lanes_step(self, variant: Variant, io: StepIO) -> list[str]:
        """The step's part after its loads: the lanes' step and the stores."""
        return [
            f"{self.vec} {', '.join(s.register for s in io.writes)};",
            *noise.backward_draws(self),
            *self.dialect.lane_loop(self.lane(io, variant.option("grad_v_mode"))),
            *[self.write_vector(s) for s in io.writes],
        ]

    def step(self, variant: Variant, io: StepIO, stage: Stage = NO_STAGE) -> list[str]:
        carried = ["h_v = hp_v;", *[f"wt{i}_v = wtp{i}_v;" for i in range(self.kw)]]
        return [
            "const long long k = (long long)t * N + i0;",
            *self.loads(io),
            *stage.before,
            *self.lanes_step(variant, io),
            *stage.after,
            *(carried if self.carries() else []),
        ]

    def setup(self, io: StepIO) -> list[str]:
        """Each lane's carried gradients and parameter-gradient sums set to 0."""
        init = [f"{carry}[j] = 0;" for carry, _ in io.carries]
        return init + [f"acc_{c}[j] = 0;" for c in self.learnable()]

    def final(self) -> list[str]:
        """One lane's stores after the loop: dL/dV[0], dL/dW[0], each learnable
        parameter's gradient row."""
        final = [f"if (grad_v_init) grad_v_init[i0 + j] = {self.store('carry_l[j]')};"]
        final += [
            f"if (grad_w_init) grad_w_init[(long long){i} * N + i0 + j] = "
            f"{self.store(f'carry_w{i}_l[j]')};"
            for i in range(self.k)
        ]
        return final + [f"grad_{c}_ptr[i0 + j] = acc_{c}[j];" for c in self.learnable()]

    def body(self, variant: Variant) -> list[str]:
        ct, at = self.dt.compute, self.dt.accum
        io, learn, vec = self.io(variant), self.learnable(), self.vec
        last_row = "(long long)(T - 1) * N + i0"
        first = [self.streams("h")[0], *self.streams("wt")]
        first_h = [
            f"{vec} {s.register} = *(const {vec}*)({self.array(s)} + {last_row});" for s in first
        ]
        return [
            *noise.state(self.spec),
            *self.lane_state(),
            *[f"{ct} {carry}[K];" for carry, _ in io.carries],
            *[f"{at} acc_{c}[K];" for c in learn],
            *self.dialect.lane_loop(self.setup(io)),
            f"const {self.dt.storage} gs_scalar = grad_spike_scalar ? grad_spike[0] : 0;",
            *(first_h if self.carries() else []),
            *self.time_loop("for (int t = T - 1; t >= 0; --t) {", self.step(variant, io)),
            *self.dialect.lane_loop(self.final()),
        ]

    def row_loads(self, io: StepIO) -> tuple[list[str], list[str]]:
        """This step's vectors, declared and loaded, where no register carries them from
        step to step (a C thread runs a row's neurons in turn): H and W̃ of steps t and
        t−1, X, and the gradients of the spikes, V (and W) from the loss."""
        vec = self.vec
        now = [*self.streams("h"), *self.streams("wt"), *self.streams("grad_spike")]
        now += [s for s in io.reads if s.array not in ("grad_spike", "h_seq", "wt_seq")]
        before = [s for s in io.reads if s.register == "hp_v" or s.register.startswith("wtp")]
        loads = [f"{s.register} = *(const {vec}*)({self.array(s)} + k);" for s in now]
        loads += [
            f"if (t > 0) {s.register} = *(const {vec}*)({self.array(s)} + k - N);" for s in before
        ]
        return [f"{vec} {s.register};" for s in (*now, *before)], loads
