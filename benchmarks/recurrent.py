#!/usr/bin/env python3
"""One SGD training step of a recurrent spiking network, built several ways (:data:`ROWS`),
eager and graphed, after a float64 check of each row's loss and gradients against
``torch``'s; the network, the rows and the timing: ``docs/performance_recurrent.md``.
``floor`` rows run no neuron: only the products a recurrent layer cannot avoid, one
cuBLAS call each (:class:`FloorProducts`), in float32, TF32 and under ``--amp bf16``.

    python3 benchmarks/recurrent.py                          # on a GPU: the four configs
    python3 benchmarks/recurrent.py --sweep --amp fp32,bf16  # every size, batch and T
    python3 benchmarks/recurrent.py --device cpu --quick     # CPU smoke test, tiny sizes
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import core  # noqa: E402
import recurrent_results as results  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import symneuron as sn  # noqa: E402
from symneuron.runtime import rows as rows_runtime  # noqa: E402

ROWS = [
    "feedforward",
    "symneuron",
    "symneuron-fused",
    "symneuron-steps",
    "symneuron-rows",
    "symneuron-loop",
    "torch",
    "spikingjelly",
    "torch.compile",
    "floor",
    "floor-tf32",
]
#: rows that run no neuron (no firing rate, no gradient check against the loop's)
FLOORS = ("floor", "floor-tf32")
#: ``--sweep``: every size, batch and sequence length of the grid
SIZES, BATCHES, LENGTHS = (128, 256, 512, 1024, 2048, 4096), (16, 64, 256), (100, 500)
CONFIGS = [(64, 256, 100), (64, 256, 500), (64, 256, 1000), (256, 1024, 100)]  # (B, H, T)
QUICK = [(4, 16, 20), (8, 32, 30)]
CHECK = (4, 24, 30)  # the gradient check's configuration
TAU, ALPHA, INPUTS, CLASSES, P_IN, TARGET_RATE = 10.0, 4.0, 700, 20, 0.05, 0.06
RATE_RANGE = (0.02, 0.20)


class Spike(torch.autograd.Function):
    """Θ(u) (Θ(0) = 1) forward; the zoo's Sigmoid surrogate α·σ(αu)(1 − σ(αu)) backward."""

    @staticmethod
    def forward(ctx: Any, u: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(u)
        return (u >= 0).to(u.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        sig = torch.sigmoid(ALPHA * ctx.saved_tensors[0])
        return grad * ALPHA * sig * (1 - sig)


def torch_step(
    x: torch.Tensor, s: torch.Tensor, v: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sn.models.LIF(tau=10)`` by hand, its input x + W s: H = V + (X − V)/τ,
    S = Θ(H − 1), V = H(1 − S) (the hard reset to 0, its gradient through S as the zoo's)."""
    h = v + (x + F.linear(s, weight) - v) / TAU
    s = Spike.apply(h - 1.0)
    return s, h * (1 - s)


class TorchLoop(nn.Module):
    """:func:`torch_step` over t (V[−1] = 0, s[−1] = 0), optionally under torch.compile."""

    def __init__(self, size: int, compiled: bool) -> None:
        super().__init__()
        self.w = nn.Linear(size, size, bias=False)
        self.step = torch.compile(torch_step) if compiled else torch_step

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        out, s = [], torch.zeros_like(x_seq[0])
        v = s
        for x in x_seq:
            s, v = self.step(x, s, v, self.w.weight)
            out.append(s)
        return torch.stack(out)

    def reset(self) -> None:
        pass


class Loop(nn.Module):
    """s[t] = cell(x[t] + W s[t−1]), s[−1] = 0: a single-step ``cell`` in a Python loop."""

    def __init__(self, size: int, cell: nn.Module) -> None:
        super().__init__()
        self.w, self.cell = nn.Linear(size, size, bias=False), cell

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        out, s = [], torch.zeros_like(x_seq[0])
        for x in x_seq:
            s = self.cell(x + self.w(s))
            out.append(s)
        return torch.stack(out)

    def reset(self) -> None:
        self.cell.reset()


class FloorProducts(torch.autograd.Function):
    """No neuron, only a recurrent layer's unavoidable products, one cuBLAS call each:
    forward ``x[t] + s[t−1]·Wᵀ`` for every t (s a fixed spike train: the products do not
    depend on the values); backward ``g[t]·W`` for every t, then ∂L/∂W over all steps in
    one product. Autocast applies to them as to ``nn.Linear``."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx: Any, x_seq: torch.Tensor, weight: torch.Tensor, s_seq: torch.Tensor) -> Any:
        out, prev = [], torch.zeros_like(s_seq[0], dtype=x_seq.dtype)
        w_t, spikes = weight.t().to(x_seq.dtype), s_seq.to(x_seq.dtype)  # (cast once)
        for t in range(x_seq.shape[0]):
            out.append(torch.addmm(x_seq[t], prev, w_t))
            prev = spikes[t]
        ctx.save_for_backward(weight, s_seq)
        return torch.stack(out)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        weight, s_seq = ctx.saved_tensors
        w, into = weight.to(grad.dtype), torch.empty_like(grad)
        for t in range(grad.shape[0] - 1, -1, -1):
            torch.mm(grad[t], w, out=into[t])  # dL/ds[t−1] (the loop's product, kept)
        before = torch.cat([torch.zeros_like(s_seq[:1]), s_seq[:-1]]).to(grad.dtype)
        grad_w = grad.flatten(0, 1).t() @ before.flatten(0, 1)
        return grad, grad_w.to(weight.dtype), None


class Floor(nn.Module):
    """:class:`FloorProducts` over a spike train firing on TARGET_RATE of neuron-steps."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.w = nn.Linear(size, size, bias=False)
        self.s_seq: torch.Tensor | None = None

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        if self.s_seq is None or self.s_seq.shape != x_seq.shape:
            gen = torch.Generator(device=x_seq.device).manual_seed(5)
            drawn = torch.rand(x_seq.shape, generator=gen, device=x_seq.device)
            self.s_seq = (drawn < TARGET_RATE).to(self.w.weight.dtype)
        return FloorProducts.apply(x_seq, self.w.weight, self.s_seq)

    def reset(self) -> None:
        pass


def recurrent_layer(row: str, size: int) -> nn.Module:
    """The row's layer [T, B, H] -> spikes [T, B, H] (raises ImportError for SpikingJelly)."""
    lif = sn.models.LIF(tau=TAU)
    if row in FLOORS:
        return Floor(size)
    if row == "feedforward":
        return sn.NeuronLayer(lif)
    if row in ("symneuron", "symneuron-rows"):
        return sn.RecurrentNeuronLayer(lif, size)
    if row == "symneuron-fused":  # the fused kernels inside a CUDA graph too
        return sn.RecurrentNeuronLayer(lif, size, fused=True)
    if row == "symneuron-steps":  # the layer's loop over steps, eager too
        return sn.RecurrentNeuronLayer(lif, size, fused=False)
    if row == "symneuron-loop":
        return Loop(size, sn.NeuronLayer(lif, step_mode="s"))
    if row == "spikingjelly":
        from spikingjelly.activation_based import neuron, surrogate

        node = neuron.LIFNode(
            tau=TAU,
            decay_input=True,
            v_threshold=1.0,
            v_reset=0.0,
            surrogate_function=surrogate.Sigmoid(alpha=ALPHA),
            detach_reset=False,
            step_mode="s",
        )
        return Loop(size, node)
    return TorchLoop(size, compiled=row == "torch.compile")


class Net(nn.Module):
    """Linear(700, H) -> the row's layer -> Linear(H, 20), averaged over t."""

    def __init__(self, row: str, size: int, w_rec: torch.Tensor, seed: int) -> None:
        super().__init__()
        self.rec = recurrent_layer(row, size)
        torch.manual_seed(seed)  # the same input and readout weights in every row
        self.inp, self.out = nn.Linear(INPUTS, size), nn.Linear(size, CLASSES)
        # RecurrentNeuronLayer's W, or the loop's
        weight = getattr(getattr(self.rec, "w", self.rec), "weight", None)
        if weight is not None:
            with torch.no_grad():
                weight.copy_(w_rec)

    def spikes(self, x_seq: torch.Tensor) -> torch.Tensor:
        self.rec.reset()
        return self.rec(self.inp(x_seq))

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        return self.out(self.spikes(x_seq)).mean(0)


class Case:
    """One configuration's inputs: x, labels and the recurrent weight, on ``device``."""

    def __init__(
        self,
        batch: int,
        size: int,
        steps: int,
        device: str,
        dtype: torch.dtype,
        amp: str = "fp32",
    ) -> None:
        gen = torch.Generator().manual_seed(batch * 7919 + size * 31 + steps)
        self.size, self.seed, self.device, self.dtype = size, int(gen.initial_seed()), device, dtype
        self.amp = amp  # "bf16": forward under torch.autocast (bfloat16)
        self.spikes = (torch.rand(steps, batch, INPUTS, generator=gen) < P_IN).to(device, dtype)
        self.y = torch.randint(CLASSES, (batch,), generator=gen).to(device)
        bound = 1 / size**0.5  # nn.Linear's (and RecurrentNeuronLayer's) initial range
        self.w_rec = ((torch.rand(size, size, generator=gen) * 2 - 1) * bound).to(device, dtype)
        self.x = self.spikes * self.gain()

    def net(self, row: str) -> Net:
        return Net(row, self.size, self.w_rec, self.seed).to(self.device, self.dtype)

    def gain(self) -> float:
        """The input gain at which the ``torch`` row fires on TARGET_RATE of neuron-steps
        (bisection on the log of the gain; the rate grows with it)."""
        net, lo, hi = self.net("torch"), 0.1, 100.0
        with torch.no_grad():
            for _ in range(20):
                mid = (lo * hi) ** 0.5
                below = rate(net, self.spikes * mid, self.amp) < TARGET_RATE
                lo, hi = (mid, hi) if below else (lo, mid)
        return (lo * hi) ** 0.5


def autocast(amp: str, device: str) -> Any:
    """``torch.autocast`` to bfloat16 for ``amp == "bf16"``, else nothing."""
    return torch.autocast(device, dtype=torch.bfloat16, enabled=amp == "bf16")


def rate(net: Net, x: torch.Tensor, amp: str = "fp32") -> float:
    """The recurrent layer's firing rate: spikes per neuron-step."""
    with torch.no_grad(), autocast(amp, x.device.type):
        return float(net.spikes(x).float().mean())


def training_step(net: Net, case: Case) -> Callable[[], torch.Tensor]:
    """``step()``: reset, forward, cross-entropy, backward, SGD step (grads overwritten)."""
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with autocast(case.amp, case.device):
            loss = F.cross_entropy(net(case.x), case.y)
        loss.backward()
        opt.step()
        return loss

    step.opt = opt  # type: ignore[attr-defined]
    return step


def check_gradients(device: str, rows: list[str]) -> dict[str, str]:
    """Row -> why it is refused: its float64 loss or gradients differ from the ``torch``
    row's (same weights, same input) on the configuration :data:`CHECK`, on ``device``; a
    row that cannot run float64 there (an error, not a difference) is checked on the CPU."""
    cases = {d: Case(*CHECK, d, torch.float64) for d in dict.fromkeys([device, "cpu"])}
    fired = rate(cases[device].net("torch"), cases[device].x)
    if not RATE_RANGE[0] <= fired <= RATE_RANGE[1]:
        raise RuntimeError(f"the gradient check's input fires {fired:.3f} of neuron-steps")

    def loss_and_grads(row: str, case: Case) -> list[torch.Tensor]:
        net = case.net(row)
        loss = F.cross_entropy(net(case.x), case.y)
        loss.backward()
        return [loss.detach(), *(p.grad for _, p in sorted(net.named_parameters(), key=_param))]

    refused: dict[str, str] = {}
    for row in [r for r in rows if r not in ("feedforward", "torch", *FLOORS)]:
        where = device
        try:
            try:
                got = loss_and_grads(row, cases[device])
            except Exception as exc:  # noqa: BLE001  (e.g. no float64 kernel there)
                if device == "cpu":
                    raise
                where = f"cpu ({device}: {type(exc).__name__}: {str(exc)[:120]})"
                got = loss_and_grads(row, cases["cpu"])
            want = loss_and_grads("torch", cases[device if where == device else "cpu"])
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
            same = f"loss and {len(got) - 1} gradients equal torch's"
            print(f"# gradient check {row} on {where}: {same}")
        except Exception as exc:  # noqa: BLE001
            refused[row] = f"gradient check failed: {core.short_error(exc)[:300]}"
            print(f"# gradient check {row}: {refused[row]}", file=sys.stderr)
    return refused


def _param(item: tuple[str, nn.Parameter]) -> str:
    """A parameter's role whatever the row calls it: inp/out weights and biases, recurrent W."""
    name = item[0]
    return name if name.startswith(("inp.", "out.")) else "rec.weight"


@contextlib.contextmanager
def kernels_of(row: str) -> Iterator[None]:
    """``symneuron-rows``: the fused layer with one block per batch row at every size
    (the kernels the grid kernels replace from ``rows.GRID_FROM`` neurons);
    ``floor-tf32``: TF32 products (every other row: float32's)."""
    saved, tf32 = rows_runtime.GRID_FROM, torch.backends.cuda.matmul.allow_tf32
    if row == "symneuron-rows":
        rows_runtime.GRID_FROM = {"forward": 2**62, "backward": 2**62}
    torch.backends.cuda.matmul.allow_tf32 = row == "floor-tf32"
    try:
        yield
    finally:
        rows_runtime.GRID_FROM = saved
        torch.backends.cuda.matmul.allow_tf32 = tf32


def time_row(case: Case, row: str, timer: core.Timer, args: argparse.Namespace) -> list[core.Rec]:
    """The row's eager and graphed records (each refused when its firing rate is outside)."""
    with kernels_of(row):
        return _time_row(case, row, timer, args)


def _time_row(case: Case, row: str, timer: core.Timer, args: argparse.Namespace) -> list[core.Rec]:
    base = dict(B=case.x.shape[1], H=case.size, T=case.x.shape[0], amp=case.amp, row=row)
    net = case.net(row)
    base["rate"] = fired = None if row in FLOORS else rate(net, case.x, case.amp)
    shown = "—" if fired is None else f"{fired:.3f}"
    print(f"# {results.config_name(base)} {row}: firing rate {shown}", flush=True)
    modes = ["eager", "graphed"] if timer.cuda else ["eager"]
    if fired is not None and not RATE_RANGE[0] <= fired <= RATE_RANGE[1]:
        why = f"firing rate {fired:.3f} outside {RATE_RANGE[0]:.0%}–{RATE_RANGE[1]:.0%}"
        return [dict(base, mode=m, status="error", error=why) for m in modes]
    step, out = training_step(net, case), []
    for mode in modes:
        rec = dict(base, mode=mode, status="ok")
        try:
            call = step if mode == "eager" else core.cuda_graph(step, step.opt, args.warmup)  # type: ignore[attr-defined]
            for _ in range(args.warmup):
                call()
            rec["step_ms"] = (
                statistics.median(timer.events(lambda i, c=call: c(), args.steps)) * 1e3
            )
        except Exception as exc:  # noqa: BLE001
            rec.update(status="error", error=core.short_error(exc)[:600])
        out.append(rec)
    return out


def copy_floor(case: Case, timer: core.Timer) -> core.Rec:
    """A device-to-device copy of the input, the least a step can cost."""
    dst = torch.empty_like(case.x)
    times = timer.events(lambda i: dst.copy_(case.x), 23)[3:]  # the first three warm up
    shape = dict(B=case.x.shape[1], H=case.size, T=case.x.shape[0], amp=case.amp)
    ms = statistics.median(times) * 1e3
    return dict(shape, row="input copy", mode="eager", status="ok", rate=None, step_ms=ms)


def configurations(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    """(B, H, T) of the run: ``--configs``, the ``--sweep`` grid, QUICK or CONFIGS."""
    if args.configs:
        return [tuple(int(v) for v in c.split(",")) for c in args.configs.split(";")]  # type: ignore[misc]
    if args.sweep:
        return [(b, h, t) for t in LENGTHS for b in BATCHES for h in SIZES]
    return QUICK if args.quick else CONFIGS


def jobs(args: argparse.Namespace) -> list[results.Job]:
    """(amp, B, H, T) of this run: every configuration in every precision, or the
    ``--shard`` K/N of them."""
    every = [(amp, *config) for amp in args.amp for config in configurations(args)]
    if args.shard is None:
        return every
    index, count = (int(v) for v in args.shard.split("/"))
    return results.shard(every, index, count)


def arguments(argv: list[str] | None) -> argparse.Namespace:
    p = core.parser(__doc__)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help=f"configurations {QUICK}, fewer steps")
    p.add_argument("--rows", type=core.csv_list(str, ROWS), default=ROWS, help=",".join(ROWS))
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20; quick 3)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--configs", default=None, help="B,H,T;B,H,T;... (default: the four of CONFIGS)")
    p.add_argument("--out", type=Path, default=None, help="default results/recurrent_<gpu>.json")
    p.add_argument("--sweep", action="store_true", help="sizes x batches x T of SIZES etc.")
    amps = core.csv_list(str, ["fp32", "bf16"])
    p.add_argument("--amp", type=amps, default=["fp32"], help="fp32,bf16 (bf16: autocast)")
    p.add_argument("--shard", default=None, help="K/N: the K-th of N parts (one a GPU), by cost")
    p.add_argument("--merge", type=Path, nargs="+", default=None, help="result files: one")
    args = p.parse_args(argv)
    args.steps = args.steps or (3 if args.quick else 20)
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if args.merge:
        out = args.out or args.merge[0].with_name("recurrent-merged.json")
        report(out, results.merge(args.merge))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: use --device cpu --quick")
    info = core.device_info(torch.device(args.device))
    out = args.out or core.result_path(core.HERE / "results", info["gpu"], "recurrent_")
    rows = [r for r in args.rows if r != "spikingjelly" or _has_spikingjelly()]
    for name in ("recompile_limit", "cache_size_limit"):  # torch.compile: a graph per config
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    refused = check_gradients(args.device, rows)
    timer, records = core.Timer(torch.device(args.device)), []
    meta = dict(date=core.now_iso(), argv=sys.argv[1:], **info, versions=core.versions())
    result = dict(meta=meta, settings={**vars(args), "out": str(out)}, refused=refused)
    for amp, b, h, t in jobs(args):
        case = Case(b, h, t, args.device, torch.float32, amp)
        records.append(copy_floor(case, timer))
        for row in rows:
            why = refused.get(row)
            shape = dict(B=b, H=h, T=t, amp=amp, row=row, mode="eager")
            records += (
                time_row(case, row, timer, args)
                if why is None
                else [dict(shape, status="error", error=why)]
            )
        results.write(out, dict(result, records=records), plots=False)  # kept if cut short
    report(out, dict(result, records=records))
    return 0


def report(out: Path, result: dict[str, Any]) -> None:
    """The result's file and plots written, its tables printed."""
    found = results.write(out, result)
    print(f"# wrote {out} and its plots", file=sys.stderr)
    print(results.table(result["records"]), flush=True)
    print(results.speedup_table(found), flush=True)


def _has_spikingjelly() -> bool:
    try:
        import spikingjelly.activation_based.neuron  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        print(f"# SpikingJelly row left out: {type(exc).__name__}: {exc}", file=sys.stderr)
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
