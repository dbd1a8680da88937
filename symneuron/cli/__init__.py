"""The ``symneuron`` command line: inspect, print, check and time a neuron.

    symneuron show MODEL [--latex]                  equations and derived partials
    symneuron source MODEL [--backend cuda|cpu] [--dtype fp32|fp64|fp16|bf16]
    symneuron check MODEL [--device cpu|cuda] [--dtype ...] [--backend ...] [--seed N]
    symneuron bench MODEL [--dtype ...] [--T 64] [--N 2^20]       (needs a CUDA GPU)
    symneuron cache info|clear

``MODEL`` is a zoo name (``symneuron.models.ZOO``), optionally with keyword
arguments in Python syntax, quoted for the shell: ``LIF``,
``'LIF(tau=3.0, v_reset=None)'``, ``'ALIF(learnable=["tau"])'``. Values must be
Python literals (numbers, strings, ``None``, ``True``/``False``, lists, dicts),
read with ``ast.literal_eval``, never evaluated. Your own neuron is
``path/to/file.py:name``: a ``Neuron`` (keyword arguments go to its ``replace``)
or a function returning one (called with them), e.g. ``'mine.py:make(tau=4.0)'``.

Exit status: 0 on success, 1 when ``check`` fails, 2 for a bad command line (an
unknown model, option or value; a GPU command without a GPU). ``python -m
symneuron`` is the same program.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import derivation, dtypes
from ..check import check
from ..neuron import Neuron
from .model import UsageError, describe, load_model, zoo

__all__ = [
    "main",
    "build_parser",
    "load_model",
    "zoo",
    "describe",
    "floor_bytes",
    "UsageError",
    "DTYPES",
]

#: The ``--dtype`` spellings and the dtype each names.
DTYPES = {"fp32": "float32", "fp64": "float64", "fp16": "float16", "bf16": "bfloat16"}
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _show(args: argparse.Namespace) -> int:
    neuron = load_model(args.model)
    print(f"{neuron.name}: H = f(V, X) with V = V[t-1], X = X[t]")
    for name, default in neuron.params.items():
        print(f"  param {name} = {default}" + (" (learnable)" if name in neuron.learnable else ""))
    for name, state in neuron.states.items():
        print(f"  state {name}, initial value {state.init}")
    reset = "soft reset" if neuron.v_reset is None else "hard reset"
    reset = "no reset" if getattr(neuron, "firing", "level") == "crossing" else reset
    print(f"  {reset}, surrogate {neuron.surrogate.name}, detach_reset={neuron.detach_reset}")
    for left, right in describe(neuron, latex=args.latex):
        print(f"{left} = {right}")
    return EXIT_OK


# -- source, check, bench, cache -----------------------------------------------------------


def _dtype(backend: str, short: str) -> str:
    """The dtype name of ``--dtype short`` if ``backend``'s kernels take it."""
    name = DTYPES[short]
    if name not in dtypes.supported(backend):
        takes = [k for k, v in DTYPES.items() if v in dtypes.supported(backend)]
        raise UsageError(
            f"the {backend} backend takes --dtype {'/'.join(takes)}, not {short}: float16 and "
            "bfloat16 kernels exist for CUDA only, so use --backend cuda (or --device cuda)"
        )
    return name


def _source(args: argparse.Namespace) -> int:
    neuron = load_model(args.model)
    print(neuron.source(args.backend, _dtype(args.backend, args.dtype)))
    return EXIT_OK


def _need_gpu(what: str) -> None:
    from ..runtime import cuda

    if not torch.cuda.is_available():
        raise UsageError(
            f"{what} needs a CUDA GPU, and torch sees none; `symneuron show`, `source` and "
            "`check --device cpu` work without one"
        )
    if not cuda.available():
        raise UsageError(f"{what} needs CuPy for the CUDA kernels: pip install symneuron[cuda]")


def _check(args: argparse.Namespace) -> int:
    neuron = load_model(args.model)
    if args.device == "cuda":
        _need_gpu("--device cuda")
    dtype = DTYPES[args.dtype]
    if dtype in ("float16", "bfloat16") and (args.device != "cuda" or args.backend == "torch"):
        raise UsageError(f"--dtype {args.dtype} is checked on the CUDA kernels: add --device cuda")
    report = check(
        neuron,
        backend=args.backend,
        dtype=getattr(torch, dtype),
        device=args.device,
        seed=args.seed,
    )
    print(report)
    return EXIT_OK if report.passed else EXIT_FAILED


def floor_bytes(neuron: Neuron, steps: int, n: int, itemsize: int) -> int:
    """The fewest bytes a training call (forward + backward) of ``neuron`` must move.

    The floor model of ``benchmarks/floor.py``: per element of the [T, N] tensors
    the forward reads X and writes S, H and the k states' W̃ (3 + k); the backward
    reads dL/dS, H and each W̃ and writes dL/dX (3 + k). k counts the states only when
    the backward reads their W̃ (``needs_wt``); else the forward saves none.
    """
    return (6 + 2 * derivation.derive(neuron).saved_states) * steps * n * itemsize


def _median_ms(run: Callable[[], Any], repeat: int) -> float:
    """Median time of ``run()`` on the GPU, measured with CUDA events, after warm-up."""
    for _ in range(3):
        run()
    events = [[torch.cuda.Event(enable_timing=True) for _ in "se"] for _ in range(repeat)]
    for start, end in events:
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def _bench(args: argparse.Namespace) -> int:
    from ..simulate import simulate

    neuron = load_model(args.model)
    _need_gpu("bench")
    dtype = getattr(torch, _dtype("cuda", args.dtype))
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (args.T, args.N)
    x_seq = (0.9 + torch.randn(shape, generator=gen, device="cuda")).to(dtype).requires_grad_()
    grad_spikes = torch.randn(shape, generator=gen, device="cuda").to(dtype)

    def train() -> None:
        spikes = simulate(neuron, x_seq, backend="cuda", store_v_seq=False)[0]
        torch.autograd.backward(spikes, grad_spikes)
        x_seq.grad = None

    source, target = torch.empty_like(x_seq), torch.empty_like(x_seq)
    train_ms = _median_ms(train, args.repeat)
    copy_ms = _median_ms(lambda: target.copy_(source), args.repeat)
    bandwidth = 2 * source.nbytes / (copy_ms * 1e-3)  # bytes read + written per second
    floor_ms = floor_bytes(neuron, args.T, args.N, source.element_size()) / bandwidth * 1e3
    print(f"{neuron.name}, {args.dtype}, T={args.T}, N={args.N} on {torch.cuda.get_device_name()}")
    print(f"  training call (forward + backward): {train_ms:.3f} ms (median of {args.repeat})")
    print(f"  copy bandwidth: {bandwidth / 1e9:.0f} GB/s (device-to-device, read + write)")
    print(f"  floor: {floor_ms:.3f} ms; fraction of the copy floor: {floor_ms / train_ms:.2f}")
    return EXIT_OK


def _cache(args: argparse.Namespace) -> int:
    from ..runtime import cache

    function = getattr(cache, args.action, None)
    if function is None:
        raise UsageError(f"this symneuron has no symneuron.runtime.cache.{args.action}()")
    result = function()
    print(f"removed {result} cache files" if args.action == "clear" else _tree(result))
    return EXIT_OK


def _tree(info: dict[str, Any], indent: str = "") -> str:
    """A nested dict as indented ``key: value`` lines."""
    return "\n".join(
        f"{indent}{k}:\n{_tree(v, indent + '  ')}" if isinstance(v, dict) else f"{indent}{k}: {v}"
        for k, v in info.items()
    )


# -- the parser ----------------------------------------------------------------------------


def _size(text: str) -> int:
    """``"1048576"`` or ``"2^20"`` -> 1048576."""
    base, _, power = text.partition("^")
    try:
        value = int(base) ** int(power) if power else int(base)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 4096 or 2^20") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``symneuron`` (each sub-command sets ``run``)."""
    parser = argparse.ArgumentParser(
        prog="symneuron",
        description="Inspect, print, check and time symneuron neurons.",
        epilog="MODEL: a zoo name, optionally with keyword arguments in Python syntax "
        "('LIF(tau=3.0, v_reset=None)'), or path/to/file.py:name for your own neuron.",
    )
    # the package's own version: the parent package is imported before this module
    version = f"symneuron {getattr(sys.modules['symneuron'], '__version__', 'unknown')}"
    parser.add_argument("--version", action="version", version=version)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    model = argparse.ArgumentParser(add_help=False)
    model.add_argument(
        "model", metavar="MODEL", help="a zoo name, 'NAME(key=value, ...)' or path/to/file.py:name"
    )

    def command(name: str, run: Callable[[argparse.Namespace], int], text: str) -> Any:
        sub = commands.add_parser(name, parents=[model] if name != "cache" else [], help=text)
        sub.set_defaults(run=run)
        return sub

    show = command("show", _show, "equations and derived partials")
    show.add_argument("--latex", action="store_true", help="print the equations as LaTeX")
    source = command("source", _source, "print the generated kernel source")
    source.add_argument("--backend", choices=["cuda", "cpu"], default="cuda")
    source.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    check_ = command("check", _check, "sn.check: partials and kernels against oracles")
    check_.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    check_.add_argument("--dtype", choices=list(DTYPES), default="fp64")
    check_.add_argument("--backend", choices=["auto", "cpu", "cuda", "torch"], default="auto")
    check_.add_argument("--seed", type=int, default=0, help="seed of the random inputs (0)")
    bench = command("bench", _bench, "GPU time of a training call against the copy floor")
    bench.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    bench.add_argument("--T", type=_size, default=64, help="time steps (64)")
    bench.add_argument("--N", type=_size, default=2**20, help="neurons (2^20)")
    bench.add_argument("--repeat", type=_size, default=20, help="timed calls (20)")
    cache = command("cache", _cache, "the kernel cache: info or clear")
    cache.add_argument("action", choices=["info", "clear"])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error argparse printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return int(args.run(args))
    except UsageError as exc:
        print(f"symneuron {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `symneuron source LIF | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
