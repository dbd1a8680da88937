"""The forward pass's printer: one neuron's time loop t = 0..T−1, printed from its spec.

Each step loads X, runs the neuron's step once per lane (charge, updates, spike,
resets) and stores S (and H, W̃ for the backward, V every step or the last). A
connection's stage (:mod:`.connection`) adds its lines around the lanes' step: the
recurrent input into X's register before, the spikes it exchanges after.
"""

from __future__ import annotations

from ..signature import Variant
from . import noise
from .steps import NO_STAGE, Stage, StepIO, StepPrinter

__all__ = ["ForwardPrinter"]


class ForwardPrinter(StepPrinter):
    """Prints the forward kernels' bodies of one spec for one dtype and dialect."""

    def io(self, variant: Variant, mutable: frozenset[str] = frozenset()) -> StepIO:
        """X read; S, and by option H, V, W̃ and W written; V and W carried.
        ``mutable``: registers a stage changes (a connection adds to X's)."""
        store_h, seq = variant.option("store_h"), variant.option("v_mode") == "seq"
        writes = [*self.streams("spike"), *(self.streams("h") if store_h else [])]
        writes += [*(self.streams("v") if seq else []), *(self.streams("wt") if store_h else [])]
        writes += self.streams("w_out") if seq else []
        carries = (("V_l", "V"), *[(f"w{i}_l", f"w{i}") for i in range(self.k)])
        return StepIO(tuple(self.streams("x")), tuple(writes), carries, mutable)

    def lane(self, io: StepIO) -> list[str]:
        """One lane's step: charge, updates, spike, resets; each written value stored
        into its vector register right after it is computed."""
        ct, spec = self.dt.compute, self.spec
        written = {s.value: s for s in io.writes}

        def put(*values: str) -> list[str]:
            return [self.write_lane(written[v]) for v in values if v in written]

        charge = self.block(spec.charge)
        charge[-1] = f"const {ct} h = {self.dt.rounded(self.expr(spec.charge[-1].expr))};"
        return [
            *self.lane_params(),
            *[f"{ct} {value} = {carry}[j];" for carry, value in io.carries],
            *[self.read_lane(s) for s in io.reads],
            *noise.normals(spec.noise_streams, ct),
            *charge,
            *put("h"),
            *self.block(spec.updates, rounded=True),
            *put(*[f"wt{i}" for i in range(self.k)]),
            *([self.v_th_line()] if spec.threshold_per_step else []),
            *self.fire("h"),
            *put("s"),
            *self.after_fire(io),
            *self.block(spec.reset, declare=False),
            *self.positive_zero(),
            *self.block(spec.state_resets, mutable=True),
            *put("V", *[f"w{i}" for i in range(self.k)]),
            *[f"{carry}[j] = {value};" for carry, value in io.carries],
        ]

    def after_fire(self, io: StepIO) -> list[str]:
        """Lines a lane runs once its spike is decided, before the resets (none here: a
        pass that stores more of the step, e.g. the surrogate's derivative, adds them)."""
        return []

    def step(self, variant: Variant, io: StepIO, stage: Stage = NO_STAGE) -> list[str]:
        return [
            "const long long k = (long long)t * N + i0;",
            *[self.read_vector(s, mutable=s.register in io.mutable) for s in io.reads],
            *stage.before,
            f"{self.vec} {', '.join(s.register for s in io.writes)};",
            *noise.step_draws(self, self.spec.noise_streams),
            *self.dialect.lane_loop(self.lane(io)),
            *[self.write_vector(s) for s in io.writes],
            *stage.after,
        ]

    def last(self, variant: Variant) -> list[str]:
        """The stores after the time loop: V (and W) of the last step, unless stored at
        every step."""
        if variant.option("v_mode") == "seq":
            return []
        return self.dialect.lane_loop(self.final_state())

    def body(self, variant: Variant) -> list[str]:
        step = self.step(variant, self.io(variant))
        return [
            *noise.state(self.spec),
            *self.lane_state(),
            *self.time_loop("for (int t = 0; t < T; ++t) {", step),
            *self.last(variant),
        ]
