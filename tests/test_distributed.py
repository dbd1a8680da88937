"""symneuron layers inside torch.distributed: DDP and FSDP2 over 2 gloo processes on CPU.

Each test spawns ``WORLD`` fresh Python processes running this file as a script (the
worker at the bottom), joined through a file store, and bounded by ``TIMEOUT_S`` so that
a hang fails instead of blocking CI. The workers save what they saw (gradients after
the all-reduce, parameters after each SGD step, every neuron layer's V and extra
states); the assertions run here, against the oracle: the same network trained in this
one process on the full batch (loss = mean over the global batch = mean of the ranks'
equal-sized shard means, so DDP's averaged gradient is the full-batch gradient).

float64 throughout: the distributed and single-process runs differ only in summation
order (conv/linear over 4 samples vs 8, the all-reduce of two halves), about 1e-16
relative per step, so 1e-12 after 3 steps leaves a wide margin and still catches any
real difference (a missed or doubled reduction is an O(1) error).

The network mixes every kind of learnable neuron parameter: a per-channel τ (LIF,
``[C, 1, 1]``), a scalar ``w`` (PLIF) and a per-neuron τ (Izhikevich, a neuron with an
extra state W). ``NeuronLayer.v`` and ``.states`` are plain attributes, neither
parameters nor buffers, so DDP neither broadcasts nor reduces them: each rank's state
must be the single-process state of its own shard of the batch.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_fires_sometimes, generator, rel_err, run_with_grads, seed_of
from torch import nn

import symneuron as sn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.networks import SeqToANN, SpikingNet, reset_states  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="cpu backend needs cc")

WORLD = 2
TIMEOUT_S = 150.0
T, GLOBAL_BATCH, STEPS, LR = 6, 8, 3, 0.5
IN_SHAPE, CLASSES = (2, 6, 6), 3
TOL = 1e-12


# -- the network and its training loop (run by the workers and by the oracle) ---------


def build_net(
    backend: str, scalar_shape: tuple[int, ...] = (), recurrent: bool = False
) -> SpikingNet:
    """conv -> LIF (per-channel τ) -> pool, linear -> PLIF (scalar w) -> linear ->
    Izhikevich (per-neuron τ, extra state W) -> linear readout; float64, seeded.

    ``scalar_shape=(1,)`` gives PLIF's w as a 1-element tensor: FSDP2 refuses 0-dim
    parameters. ``recurrent``: the PLIF layer is a RecurrentNeuronLayer (its fused
    kernels on the cpu backend), fed back by its spikes through a learnable weight."""
    torch.manual_seed(seed_of("dist-net"))
    gen = generator(seed_of("dist-neuron-params"))
    lif = sn.models.LIF(learnable=["tau"], v_reset=None)
    izhikevich = sn.models.Izhikevich(a=0.3, b=0.2, learnable=["tau"])
    per_channel_tau = 2 + torch.rand(4, 1, 1, generator=gen)
    per_neuron_tau = 2 + torch.rand(10, generator=gen)
    net = SpikingNet(
        SeqToANN(nn.Conv2d(IN_SHAPE[0], 4, 3, padding=1)),
        sn.NeuronLayer(lif, backend=backend, params={"tau": per_channel_tau}),
        SeqToANN(nn.MaxPool2d(2), nn.Flatten(), nn.Linear(36, 12)),
        sn.RecurrentNeuronLayer(
            sn.models.PLIF(), 12, backend=backend, params={"w": torch.full(scalar_shape, 0.2)}
        )
        if recurrent
        else sn.NeuronLayer(
            sn.models.PLIF(), backend=backend, params={"w": torch.full(scalar_shape, 0.2)}
        ),
        SeqToANN(nn.Linear(12, 10)),
        sn.NeuronLayer(izhikevich, backend=backend, params={"tau": per_neuron_tau}),
        SeqToANN(nn.Linear(10, CLASSES)),
    ).double()
    with torch.no_grad():  # strong enough weights that every layer fires sometimes
        for layer in net.modules():
            if isinstance(layer, (nn.Conv2d, nn.Linear)):
                layer.weight.mul_(2.5)
                layer.bias.add_(0.3)
    return net


def neuron_layers(net: nn.Module) -> list[sn.NeuronLayer]:
    return [m for m in net.modules() if isinstance(m, sn.NeuronLayer)]


def spiking_layers(net: nn.Module) -> list[nn.Module]:
    """The layers whose outputs are spike sequences (a recurrent layer, not its cell)."""
    cells = {id(m.cell) for m in net.modules() if isinstance(m, sn.RecurrentNeuronLayer)}
    kinds = (sn.NeuronLayer, sn.RecurrentNeuronLayer)
    return [m for m in net.modules() if isinstance(m, kinds) and id(m) not in cells]


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = generator(seed_of("dist-data", step))
    x_seq = 0.5 + torch.randn(T, GLOBAL_BATCH, *IN_SHAPE, generator=gen, dtype=torch.float64)
    return x_seq, torch.randint(CLASSES, (GLOBAL_BATCH,), generator=gen)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A plain copy of ``tensor``, gathered first when it is a (sharded) DTensor."""
    gather = getattr(tensor, "full_tensor", None)
    return (gather() if gather is not None else tensor).detach().clone()


def train(net: nn.Module, model: Callable[..., torch.Tensor], rank: int, world: int) -> dict:
    """``STEPS`` SGD steps of ``model`` (``net`` itself, or a DDP/compiled wrapper of it) on
    this rank's shard of each global batch; records grads, params, V and states."""
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    shard = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    record: dict[str, list] = {"grads": [], "params": [], "v": [], "states": [], "spikes": []}
    spikes: list[torch.Tensor] = []
    hooks = [
        layer.register_forward_hook(lambda m, i, out: spikes.append(out.detach()))
        for layer in spiking_layers(net)
    ]
    for step in range(STEPS):
        x_seq, labels = global_batch(step)
        reset_states(net)
        spikes.clear()
        loss = nn.functional.cross_entropy(model(x_seq[:, shard]), labels[shard])
        opt.zero_grad()
        loss.backward()
        record["grads"].append({n: full(p.grad) for n, p in net.named_parameters()})
        opt.step()
        record["params"].append({n: full(p) for n, p in net.named_parameters()})
        record["v"].append([layer.v.detach().clone() for layer in neuron_layers(net)])
        record["states"].append(
            [
                {k: w.detach().clone() for k, w in layer.states.items()}
                for layer in neuron_layers(net)
            ]
        )
        record["spikes"].append(list(spikes))
    for hook in hooks:
        hook.remove()
    return record


# -- launching the workers ----------------------------------------------------------


def launch(scenario: str, tmp_path: Path, **env: str) -> list[Any]:
    """Run ``scenario`` on ``WORLD`` worker processes; return each rank's saved result."""
    out = tmp_path / scenario
    out.mkdir()
    environ = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    args = [sys.executable, __file__, scenario, str(out)]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    procs = [subprocess.Popen([*args, str(rank)], env=environ, **pipes) for rank in range(WORLD)]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        pytest.fail(f"{scenario}: the workers did not finish in {TIMEOUT_S:.0f} s (a hang?)")
    for rank, (proc, log) in enumerate(zip(procs, logs, strict=True)):
        assert proc.returncode == 0, f"{scenario} rank {rank} failed:\n{log[-4000:]}"
    return [torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in range(WORLD)]


def shards(tensor: torch.Tensor, dim: int = 0) -> list[torch.Tensor]:
    """``tensor`` split along its batch dimension ``dim`` as the ranks split the batch."""
    return list(tensor.chunk(WORLD, dim=dim))


def assert_matches_single_process(ranks: list[dict], ref: dict) -> None:
    """Grads and params of every rank equal to the oracle's (and bitwise to each other);
    each rank's V, states and spikes equal to the oracle's on that rank's shard."""
    for step in range(STEPS):
        for kind in ("grads", "params"):
            want = ref[kind][step]
            for rank, got in enumerate(ranks):
                assert got[kind][step].keys() == want.keys()
                for name, value in want.items():
                    err = rel_err(got[kind][step][name], value)
                    assert err <= TOL, f"step {step} rank {rank} {kind} {name}: {err:.2e}"
            for name in want:
                assert torch.equal(ranks[0][kind][step][name], ranks[1][kind][step][name])
        for i, v_ref in enumerate(ref["v"][step]):
            states_ref = ref["states"][step][i]
            for rank, got in enumerate(ranks):
                close = {"rtol": 0, "atol": TOL}
                torch.testing.assert_close(got["v"][step][i], shards(v_ref)[rank], **close)
                assert got["states"][step][i].keys() == states_ref.keys()
                for name, last in states_ref.items():
                    torch.testing.assert_close(
                        got["states"][step][i][name], shards(last)[rank], **close
                    )
                spikes = shards(ref["spikes"][step][i], dim=1)[rank]
                assert torch.equal(got["spikes"][step][i], spikes)
            assert not torch.equal(ranks[0]["v"][step][i], ranks[1]["v"][step][i])


def assert_neuron_params_learn(ref: dict, scalar_shape: tuple[int, ...]) -> None:
    """The oracle itself is not vacuous: every layer fires sometimes, and each neuron
    param (per-channel, scalar, per-neuron) gets a nonzero gradient and moves."""
    for spikes in ref["spikes"][0]:
        assert_fires_sometimes(spikes)
    shapes = {"1.tau": (4, 1, 1), "3.w": scalar_shape, "5.tau": (10,)}
    for name, shape in shapes.items():
        assert ref["grads"][0][name].shape == shape
        assert float(ref["grads"][0][name].abs().min()) > 0, f"{name} has a zero gradient"
    assert set(ref["states"][0][2]) == {"W"}  # Izhikevich's extra state is recorded


@functools.cache
def oracle(backend: str, scalar_shape: tuple[int, ...] = (), recurrent: bool = False) -> dict:
    """The single-process run on the full batch (computed once per backend and shape)."""
    net = build_net(backend, scalar_shape, recurrent)
    return train(net, net, rank=0, world=1)


# -- the tests ------------------------------------------------------------------------


def test_neuron_state_is_neither_parameter_nor_buffer() -> None:
    """DDP broadcasts buffers and reduces parameters; V and extra states are neither."""
    net = build_net("cpu")
    x_seq, _ = global_batch(0)
    net(x_seq)
    names = {n for n, _ in net.named_parameters()} | {n for n, _ in net.named_buffers()}
    assert not any(n.endswith((".v", ".v_seq", ".W")) for n in names)
    assert all(layer.v is not None for layer in neuron_layers(net))
    assert "5.W" not in net.state_dict() and "5.v" not in net.state_dict()


@pytest.fixture(scope="module")
def ddp_and_fsdp(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """One launch (process start-up dominates): DDP with the cpu and torch backends, the
    DDP model under torch.compile (aot_eager), then FSDP2 (cpu backend)."""
    return launch("ddp", tmp_path_factory.mktemp("dist"))


@pytest.mark.slow  # their fixture launches two ranks: ~12 s
@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_ddp_matches_single_process(ddp_and_fsdp: list[dict], backend: str) -> None:
    ref = oracle(backend)
    assert_neuron_params_learn(ref, ())
    assert_matches_single_process([rank[f"ddp-{backend}"] for rank in ddp_and_fsdp], ref)


@pytest.mark.slow  # their fixture launches two ranks: ~12 s
def test_ddp_recurrent_layer_matches_single_process(ddp_and_fsdp: list[dict]) -> None:
    """A RecurrentNeuronLayer's fused cpu kernels under DDP: gradients (its weight's
    included), parameters, V and spikes as the single-process run on the full batch."""
    ref = oracle("cpu", (), True)
    for spikes in ref["spikes"][0]:
        assert_fires_sometimes(spikes)
    assert float(ref["grads"][0]["3.weight"].abs().max()) > 0
    assert_matches_single_process([rank["ddp-recurrent-cpu"] for rank in ddp_and_fsdp], ref)


@pytest.mark.slow  # their fixture launches two ranks: ~12 s
def test_fsdp2_matches_single_process(ddp_and_fsdp: list[dict]) -> None:
    ranks = [rank["fsdp-cpu"] for rank in ddp_and_fsdp]
    if isinstance(ranks[0], str):
        pytest.skip(ranks[0])
    ref = oracle("cpu", (1,))
    assert_neuron_params_learn(ref, (1,))
    assert_matches_single_process(ranks, ref)


@pytest.mark.slow  # their fixture launches two ranks: ~12 s
def test_compiled_ddp_matches_single_process(ddp_and_fsdp: list[dict]) -> None:
    """torch.compile of the DDP model (DDPOptimizer, aot_eager: graphs through the kernels'
    custom ops without inductor's C++ build)."""
    assert_matches_single_process(
        [rank["compiled-aot_eager"] for rank in ddp_and_fsdp], oracle("cpu")
    )


@pytest.mark.slow  # two processes, each building inductor's C++ for every graph: ~1 min
def test_inductor_compiled_ddp_matches_single_process(tmp_path: Path) -> None:
    assert_matches_single_process(launch("inductor", tmp_path), oracle("cpu"))


#: what a rank prints when a C++ thread of gloo is still joinable as the process exits (seen
#: once in a loaded full run, after training and the ranks' agreement: torch's teardown)
_TEARDOWN_ABORT = "terminate called without an active exception"


@pytest.mark.slow  # two torchrun launches of the example, ~15 s each on 2 cores
def test_train_ddp_example_runs_with_gloo(tmp_path: Path) -> None:
    """examples/train_ddp.py under torchrun on the CPU: DDP and FSDP2 both finish, the
    ranks agree, and both modes end at the same parameters (same data, same steps)."""
    sums = {}
    for mode in ("ddp", "fsdp"):
        out = tmp_path / f"{mode}.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
        command += [str(ROOT / "examples" / "train_ddp.py"), "--device", "cpu", "--mode", mode]
        command += ["--steps", "2", "--warmup", "1", "--batch", "8", "--no-baseline"]
        for _attempt in range(2):  # a gloo rank aborted once at teardown, after its work
            proc = subprocess.run(
                [*command, "--json", str(out)],
                env={**os.environ, "OMP_NUM_THREADS": "1"},
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
            if proc.returncode == 0 or _TEARDOWN_ABORT not in proc.stderr:
                break
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        result = json.loads(out.read_text())
        assert result["ranks_agree"] and result["world_size"] == WORLD
        sums[mode] = torch.tensor(result["checksum"], dtype=torch.float64)
    torch.testing.assert_close(sums["ddp"], sums["fsdp"], rtol=1e-6, atol=0)


def race_neuron() -> sn.Neuron:
    """A neuron no other test compiles (its own kernels in an empty cache)."""
    import sympy as sp

    k = sp.Symbol("k", positive=True)
    charge = sn.V + k * (sn.X - sn.V) + sp.Rational(1, 20) * sp.sin(sn.V)
    return sn.Neuron(charge, params={k: 0.4}, learnable=[k], name="CacheRace")


def race_inputs() -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], tuple]:
    gen = generator(seed_of("cache-race"))
    x_seq = 0.9 + torch.randn(10, 3, 7, generator=gen, dtype=torch.float64)
    v_init = 0.5 * torch.rand(3, 7, generator=gen, dtype=torch.float64)
    weights = tuple(torch.randn(10, 3, 7, generator=gen, dtype=torch.float64) for _ in range(2))
    return x_seq, v_init, {"k": torch.tensor(0.45, dtype=torch.float64)}, weights


@pytest.mark.slow  # two processes compiling: ~12 s
def test_two_ranks_compile_one_new_neuron_into_one_empty_cache(tmp_path: Path) -> None:
    cache = tmp_path / "shared-cache" / "not-yet-created"
    ranks = launch("cache", tmp_path, SYMNEURON_CACHE=str(cache))
    x_seq, v_init, params, weights = race_inputs()
    ref = run_with_grads(race_neuron(), x_seq, v_init, params, weights)
    assert_fires_sometimes(ref.spikes)
    for got in ranks:
        assert torch.equal(got["spikes"], ref.spikes)
        torch.testing.assert_close(got["v_seq"], ref.v_seq, rtol=0, atol=1e-12)
        assert got["grads"].keys() == ref.grads.keys()
        for name, grad in ref.grads.items():
            assert grad is not None and rel_err(got["grads"][name], grad) <= 1e-10, name
    libraries = sorted(p.name for p in cache.glob("cpu-*.so"))
    assert libraries, "no compiled library in the cache"
    assert sorted(p.name for p in cache.iterdir()) == [*libraries, "generated"]
    generated = sorted(p.suffix for p in (cache / "generated").iterdir())
    assert generated == [".c", ".c", ".txt"], f"unexpected cache entries: {generated}"


# -- the worker (this file run as a script) -------------------------------------------


def _init(out: Path, rank: int) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"file://{out / 'store'}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=TIMEOUT_S / 2),
    )


def _ddp(rank: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    result: dict[str, Any] = {}
    for backend in ("cpu", "torch"):
        net = build_net(backend)
        result[f"ddp-{backend}"] = train(net, DistributedDataParallel(net), rank, WORLD)
    net = build_net("cpu", recurrent=True)
    result["ddp-recurrent-cpu"] = train(net, DistributedDataParallel(net), rank, WORLD)
    result["compiled-aot_eager"] = _compiled(rank, "aot_eager")
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        result["fsdp-cpu"] = f"FSDP2 (fully_shard) needs torch >= 2.6, this is {torch.__version__}"
        return result
    from torch.distributed.device_mesh import init_device_mesh

    net = build_net("cpu", scalar_shape=(1,))
    fully_shard(net, mesh=init_device_mesh("cpu", (WORLD,)))
    result["fsdp-cpu"] = train(net, net, rank, WORLD)
    return result


def _compiled(rank: int, compile_backend: str) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    torch._dynamo.reset()
    net = build_net("cpu")
    model = torch.compile(DistributedDataParallel(net), backend=compile_backend)
    return train(net, model, rank, WORLD)


def _inductor(rank: int) -> dict[str, Any]:
    return _compiled(rank, "inductor")


def _cache(rank: int) -> Any:
    import torch.distributed as dist

    neuron = race_neuron()
    x_seq, v_init, params, weights = race_inputs()
    dist.barrier()  # both ranks generate and compile the same kernels at the same moment
    run = run_with_grads(neuron, x_seq, v_init, params, weights, backend="cpu")
    return {"spikes": run.spikes, "v_seq": run.v_seq, "grads": run.grads}


_SCENARIOS = {"ddp": _ddp, "inductor": _inductor, "cache": _cache}


def _worker(scenario: str, out: str, rank: str) -> None:
    import torch.distributed as dist

    _init(Path(out), int(rank))
    succeeded = False
    try:
        result = _SCENARIOS[scenario](int(rank))
        torch.save(result, Path(out) / f"rank{rank}.pt")
        succeeded = True
    finally:
        if succeeded:  # no rank tears the group down while a peer still uses it
            dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    _worker(*sys.argv[1:])
