#!/usr/bin/env python3
"""symneuron's benchmark: the peer comparison, kernel-only sweeps and host-overhead parts.

Modes (``--dry-run`` runs any of them on the CPU with tiny sizes, as a smoke test):

* default, the **peer comparison**: each configuration (model, T, N, dtype, mode) of the
  matrix, every peer checked against symneuron's float64 reference, then timed (wall and
  GPU); JSON + PNG in ``--out-dir``, a short table on stdout (``report.py``: the docs).
  ``--quick``: a small matrix (``QUICK``); with ``--peers symneuron --skip-first-call
  --skip-derivation``, symneuron alone, for iteration.
* ``--sweep block,lanes,surrogate``: **kernel-only** times of the generated forward and
  backward kernels (T = 64, N = 2^20) with threads per block or the vector width varied
  through ``symneuron.runtime.settings``, or per surrogate form (``kernel_modes.py``).
* ``--overhead``: the **host-overhead parts** of a small training call (LIF, T = 4,
  N = 2^14; ``kernel_modes.py``).

Peers (``--peers``): ``symneuron`` (``sn.simulate(..., backend="cuda")``); ``sj014``
(SpikingJelly 0.0.0.0.14, ``backend="cupy"``); ``sj200`` (SpikingJelly 2.0.0, its default
Triton implementation); ``torch`` (``sn.simulate(..., backend="torch")``, eager) and
``compile`` (``simulate_reference`` under ``torch.compile``). Models: the single-state zoo
(the default), ``Izhikevich`` (a = 0.3, b = 0.2 everywhere), ``ALIF``, or ``--models zoo``
(all 20; those no peer implements run symneuron alone). The floor model is ``floor.py``.

Timing runs in long-lived workers (``core.Worker``), one at a time: ``main`` (symneuron,
torch, compile, the copy bandwidth), ``sj014`` and ``sj200`` (each with its own
SpikingJelly). A worker that dies or hangs is restarted and its configurations recorded as
errors. Fresh processes measure the derivation and the first calls (fresh and warm caches).

Examples::

    python3 benchmarks/bench_neurons.py --quick --sj014-path /tmp/sj014 --sj200-path /tmp/sj200
    python3 benchmarks/bench_neurons.py --models Izhikevich,ALIF --T 16,64 --N 2^20 \\
        --dtypes fp32,bf16 --peers symneuron,sj014,sj200
    python3 benchmarks/bench_neurons.py --sweep block,surrogate --models LIF,QIF,PLIF,EIF
    python3 benchmarks/bench_neurons.py --overhead
    python3 benchmarks/bench_neurons.py --dry-run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from core import csv_list, parse_n  # noqa: E402

SINGLE_MODELS = ["IF", "LIF", "PLIF", "QIF", "EIF"]
STATEFUL_MODELS = ["Izhikevich", "ALIF"]
#: paper models (symneuron only: no peer implements them); each counted with its own floor
PAPER_MODELS = ["Izhikevich2003", "HodgkinHuxley"]
#: the rest of the zoo (symneuron only), so that every model has a measured floor fraction
OTHER_MODELS = ["ThresholdLIF", "CuLIF", "AdEx", "AdEx2005", "FitzHughNagumo",
                "ResonateAndFire", "AdLIF", "IafCondExp", "IafPscExp", "ThetaNeuron",
                "RefractoryLIF"]  # fmt: skip
ALL_MODELS = SINGLE_MODELS + STATEFUL_MODELS + PAPER_MODELS + OTHER_MODELS
#: input scale of the models in their own units (mV/pA models need a current that fires):
#: the inputs are scale * U(-0.2, 2), scales chosen so that the float64 reference fires
#: (rates over 64 steps: CuLIF 0.10, AdEx2005 0.09, FitzHugh-Nagumo 0.02, resonate-and-fire
#: 0.19, AdLIF 0.24, iaf_cond_exp 0.17, iaf_psc_exp 0.08, theta 0.15; unlisted: scale 1)
INPUT_SCALE = {"Izhikevich2003": 10.0, "HodgkinHuxley": 25.0, "CuLIF": 0.25,
               "AdEx2005": 1e4, "ResonateAndFire": 16.0, "AdLIF": 16.0, "IafCondExp": 300.0,
               "IafPscExp": 3e3, "ThetaNeuron": 64.0}  # fmt: skip
#: constructor arguments of the benchmarked neuron (the same constants on every side)
MODEL_KWARGS: dict[str, dict[str, float]] = {"Izhikevich": {"a": 0.3, "b": 0.2}}
ALL_T, ALL_N = [4, 16, 64, 256], [2**20, 2**14]
ALL_DTYPES = ["fp32", "fp16", "bf16"]
ALL_MODES = ["inference", "training"]
ALL_PEERS = ["symneuron", "sj014", "sj200", "torch", "compile"]
QUICK = dict(models=["LIF", "PLIF", "QIF"], T=[4, 16, 64], N=ALL_N, dtypes=["fp32", "bf16"])
DRY = dict(models=["LIF", "PLIF"], T=[4, 8], N=[2**8, 2**10], dtypes=["fp32", "bf16"])
#: SpikingJelly's class of each model, and the constants it takes from the zoo's params
SJ_CLASSES = {"IF": "IFNode", "LIF": "LIFNode", "PLIF": "ParametricLIFNode", "QIF": "QIFNode",
              "EIF": "EIFNode", "Izhikevich": "IzhikevichNode"}  # fmt: skip
SJ_PARAMS = {"LIF": ("tau",), "QIF": ("tau", "v_c", "a0", "v_rest"),
             "EIF": ("tau", "delta_T", "theta_rh", "v_rest"),
             "Izhikevich": ("tau", "v_c", "a0", "v_rest", "tau_w", "a", "b")}  # fmt: skip
SURROGATE_ALPHA = 4.0  # sn.surrogate.Sigmoid() and SpikingJelly's Sigmoid() default
SWEEPS = ("block", "lanes", "surrogate")

# fmt: off
#: settings handed to the workers, one flag each: (flag, type, default, help)
SETTINGS = [
    ("target-ms", float, 50.0, "time per measurement (wall, GPU each)"),
    ("min-reps", int, 5, None),
    ("max-reps", int, 200, None),
    ("warmup", int, 2, "warm-up calls after the first (checked) call"),
    ("rotate-mb", float, 256.0, "rotate among input copies of about this many MiB (L2 defeat)"),
    ("max-bufs", int, 8, None),
    ("compile-max-T", int, 64, "skip torch.compile above this T"),
    ("compile-mode", str, "default", None),
    ("fp32-max-mismatch", float, 1e-5, "fp32 passes if at most this fraction of spikes differ "
     "from the float64 reference (threshold ties flip a few per 10^7; the count is recorded)"),
    ("half-min-match", float, 0.99, "16-bit passes if at least this fraction of spikes match"),
    ("grad-slice", int, 4096, "neurons whose dL/dX is compared with the reference (training)"),
    ("fc-T", int, 16, "T of the first-call measurement"),
    ("fc-N", parse_n, 2**16, "N of the first-call measurement"),
]


def build_parser() -> argparse.ArgumentParser:
    from core import DTYPE_ALIASES, parser

    p = parser(__doc__)
    g = p.add_argument_group("mode (default: the peer comparison)")
    m = g.add_mutually_exclusive_group()
    m.add_argument("--sweep", type=csv_list(str, SWEEPS), default=None, help="kernel-only: "
                   "any of block,lanes,surrogate (models default LIF,QIF,PLIF,EIF; fp32,bf16)")
    m.add_argument("--overhead", action="store_true", help="host-overhead parts (LIF, T=4, N=2^14)")
    g.add_argument("--dry-run", action="store_true", help="CPU smoke test: tiny sizes, C/torch "
                   "backends, perf_counter timing")
    g = p.add_argument_group("matrix")
    g.add_argument("--models", type=_models, default=None,
                   help=",".join(ALL_MODELS) + f", or zoo: all (default {','.join(SINGLE_MODELS)})")
    g.add_argument("--T", type=csv_list(int), default=None, help="e.g. 4,16,64,256")
    g.add_argument("--N", type=csv_list(parse_n), default=None, help="e.g. 2^20,2^14 (or 20,14)")
    g.add_argument("--dtypes", type=csv_list(str, ALL_DTYPES, DTYPE_ALIASES), default=None,
                   help="fp32,fp16,bf16 (float32, float16, bfloat16 accepted)")
    g.add_argument("--modes", type=csv_list(str, ALL_MODES), default=None, help=",".join(ALL_MODES))
    g.add_argument("--peers", type=csv_list(str, ALL_PEERS), default=None, help=",".join(ALL_PEERS))
    g.add_argument("--quick", action="store_true", help=f"{QUICK} (explicit filters win)")
    g = p.add_argument_group("paths")
    g.add_argument("--out-dir", default=None, help="default benchmarks/results (dry run: temp)")
    g.add_argument("--sj014-path", default=os.environ.get("SJ014_PATH", "/tmp/sj014"))
    g.add_argument("--sj200-path", default=os.environ.get("SJ200_PATH", "/tmp/sj200"))
    g.add_argument("--tag", default="", help="appended to the result file name")
    g = p.add_argument_group("timing and checks (handed to the workers)")
    for flag, kind, default, text in SETTINGS:
        g.add_argument(f"--{flag}", type=kind, default=default, help=text)
    g.add_argument("--no-compile-dynamic-n", dest="compile_dynamic_n", action="store_false",
                   help="compile each N separately (default: N marked dynamic)")
    g = p.add_argument_group("run")
    g.add_argument("--rounds", type=int, default=1, help="measure each configuration this many "
                   "times, peers taking turns in alternating order; median of the rounds")
    g.add_argument("--copy-gib", type=float, default=1.0)
    g.add_argument("--time-budget-s", type=float, default=450.0,
                   help="stop starting new configurations after this many seconds")
    g.add_argument("--compile-budget-s", type=float, default=180.0,
                   help="total torch.compile first-call time; after it the compile peer is skipped")
    g.add_argument("--request-timeout-s", type=float, default=300.0)
    g.add_argument("--skip-first-call", action="store_true")
    g.add_argument("--skip-derivation", action="store_true")
    g.add_argument("--no-plot", action="store_true")
    g = p.add_argument_group("internal")
    g.add_argument("--worker", choices=["main", "sj014", "sj200", "firstcall", "derive"],
                   default=None, help=argparse.SUPPRESS)
    for flag in ("--settings", "--impl", "--result-file"):
        g.add_argument(flag, default=None, help=argparse.SUPPRESS)
    return p
# fmt: on


def _models(text: str) -> list[str]:
    """``--models``: names from :data:`ALL_MODELS`, or ``zoo`` for all of them."""
    return list(ALL_MODELS) if text.strip() == "zoo" else csv_list(str, ALL_MODELS)(text)


def worker_settings(args: argparse.Namespace) -> dict[str, Any]:
    out = {"dry_run": args.dry_run, "compile_dynamic_n": args.compile_dynamic_n}
    for flag, *_ in SETTINGS:
        out[flag.replace("-", "_")] = getattr(args, flag.replace("-", "_"))
    if args.dry_run:
        out.update(rotate_mb=1.0, fc_N=256)
    return out


# --------------------------------------------------------------------------------------
# the models on every side
# --------------------------------------------------------------------------------------


def make_neuron(model: str, **kw: Any) -> Any:
    """The zoo model with the benchmark's constants (``MODEL_KWARGS``); the peers use
    SpikingJelly's default Sigmoid(alpha=4) surrogate, so the zoo's default must be it."""
    import symneuron as sn

    neuron = getattr(sn.models, model)(**MODEL_KWARGS.get(model, {}), **kw)
    expected = f"Sigmoid(alpha={SURROGATE_ALPHA})"
    if not kw and getattr(neuron.surrogate, "name", "") != expected:
        raise RuntimeError(f"{model}: default surrogate is {neuron.surrogate.name}, not {expected}")
    return neuron


def sj_kwargs(model: str, neuron: Any) -> dict[str, Any]:
    """SpikingJelly constructor arguments with the same constants as the symneuron zoo model."""
    if model not in SJ_CLASSES:
        raise NotImplementedError(f"SpikingJelly has no {model} neuron")
    p = {k: float(v) for k, v in neuron.params.items()}
    kw = {name: p[name] for name in SJ_PARAMS.get(model, ())}
    kw.update(v_threshold=float(neuron.v_threshold), v_reset=neuron.v_reset)
    kw.update(detach_reset=bool(neuron.detach_reset))
    if model in ("LIF", "PLIF"):
        kw["decay_input"] = True
    if model == "PLIF":
        kw["init_tau"] = 1.0 + math.exp(-p["w"])
    if model == "Izhikevich":
        kw["w_rest"] = float(neuron.states["W"].init)
    return kw


def sj_node(sj: Any, model: str, **kw: Any) -> Any:
    """SpikingJelly's multi-step node of ``model`` with the zoo's constants and surrogate."""
    kw.update(sj_kwargs(model, make_neuron(model)), step_mode="m")
    kw["surrogate_function"] = sj.surrogate.Sigmoid(alpha=SURROGATE_ALPHA)
    return getattr(sj.neuron, SJ_CLASSES[model])(**kw)


def bench_input(model: str, shape: tuple[int, ...], gen: Any, device: Any) -> Any:
    """The benchmark's input for ``model``: U(-0.2, 2) times its ``INPUT_SCALE`` (float32)."""
    import torch

    scale = INPUT_SCALE.get(model, 1.0)
    return scale * (2.2 * torch.rand(shape, generator=gen, device=device) - 0.2)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = json.loads(args.settings) if args.settings else {}
    if args.worker:
        import peers

        return peers.worker_main(args, settings)
    if args.sweep or args.overhead:
        import kernel_modes

        return kernel_modes.main(args)
    import compare

    return compare.main(args)


if __name__ == "__main__":
    sys.exit(main())
