"""Train the CIFAR-10-sized spiking CNN on several devices with DDP or FSDP2.

The network is ``benchmarks.networks.cifar_cnn`` (input [T=4, B, 3, 32, 32], three
conv-BN-neuron blocks, a linear readout) with symneuron neuron layers (PLIF with a
per-channel learnable w by default) on synthetic CIFAR-shaped data. Each rank trains on
its own ``--batch`` samples per step (weak scaling). The script

1. times the same training on one device alone first (rank 0, the others wait), unless
   ``--no-baseline`` or there is only one rank,
2. trains with ``DistributedDataParallel`` (``--mode ddp``) or FSDP2
   (``torch.distributed.fsdp.fully_shard``, ``--mode fsdp``, torch >= 2.6),
3. checks that the ranks agree: a float64 checksum of every (gathered) parameter,
   all-gathered, identical on every rank,
4. prints the median step time (CUDA events on GPUs, a wall clock on the CPU) on one and
   on all devices and the scaling efficiency t(1 device) / t(N devices) (1.0 is perfect
   weak scaling).

Run (from the repository root)::

    torchrun --nproc_per_node=2 examples/train_ddp.py --mode ddp
    torchrun --nproc_per_node=2 examples/train_ddp.py --mode fsdp
    # CPU smoke test with gloo (no GPU): a few steps of a smaller network
    torchrun --nproc_per_node=2 examples/train_ddp.py --device cpu --steps 3

Neuron state (``NeuronLayer.v``) stays on its rank: each replica resets and carries its
own; learnable neuron params are all-reduced (DDP) or sharded (FSDP2) like any other.
A noisy neuron (``--neuron NoisyLIF``) is built with ``seed=None``, which mixes the rank
into its seed; a layer given an int seed must take ``seed=sn.rank_seed(seed)`` so that
each rank draws its own stream (one int seed on every rank draws the same numbers).
FSDP2 refuses 0-dim parameters, hence the per-channel ``w`` (``--param-shape``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.networks import (  # noqa: E402
    cifar_cnn,
    relu,
    reset_states,
    symneuron_neurons,
    synthetic_batch,
)

CPU_CHANNELS = "8,16,32"  # the default network for --device cpu (the full one is slow there)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["ddp", "fsdp"], default="ddp")
    parser.add_argument(
        "--device", choices=["cuda", "cpu"], default=None, help="default: cuda if available"
    )
    parser.add_argument("--steps", type=int, default=30, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation)")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    parser.add_argument(
        "--neuron", default="PLIF", help="a symneuron.models name, or relu (no neuron)"
    )
    parser.add_argument("--param-shape", choices=["channel", "neuron", "scalar"], default="channel")
    parser.add_argument("--backend", default="auto", help="symneuron backend of the neuron layers")
    parser.add_argument(
        "--channels", default=None, help="conv widths (default 64,128,256; cpu 8,16,32)"
    )
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sync-bn", action="store_true", help="SyncBatchNorm (ddp on cuda only)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the wrapped model")
    parser.add_argument("--no-baseline", action="store_true", help="skip the one-device timing")
    parser.add_argument("--json", type=Path, default=None, help="write the results here (rank 0)")
    parser.add_argument(
        "--dist-backend",
        choices=["nccl", "gloo"],
        default=None,
        help="default: nccl on GPUs, gloo on the CPU (gloo lets ranks share one GPU, for tests)",
    )
    args = parser.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU; use --device cpu")
    if args.mode == "fsdp" and args.param_shape == "scalar" and args.neuron != "relu":
        parser.error("FSDP2 refuses 0-dim parameters: use --param-shape channel or neuron")
    if args.sync_bn and (args.device != "cuda" or args.mode != "ddp"):
        parser.error("--sync-bn needs --device cuda and --mode ddp (SyncBatchNorm is GPU-only)")
    args.channels = tuple(int(c) for c in (args.channels or _default_channels(args)).split(","))
    return args


def _default_channels(args: argparse.Namespace) -> str:
    return CPU_CHANNELS if args.device == "cpu" else "64,128,256"


def init_distributed(args: argparse.Namespace) -> tuple[int, int, torch.device]:
    """Join the process group torchrun describes (or a group of one when run directly).
    Rank r uses GPU ``LOCAL_RANK % device_count`` (ranks share GPUs only under gloo)."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(args.dist_backend or ("nccl" if args.device == "cuda" else "gloo"))
    return dist.get_rank(), dist.get_world_size(), device


def build_net(args: argparse.Namespace, device: torch.device) -> nn.Module:
    """The CNN, initialised identically on every rank (same seed)."""
    torch.manual_seed(args.seed)
    if args.neuron == "relu":
        factory = relu
    else:
        factory = symneuron_neurons(args.neuron, backend=args.backend, param_shape=args.param_shape)
    return cifar_cnn(factory, channels=args.channels).to(device)


def wrap(net: nn.Module, args: argparse.Namespace, device: torch.device) -> nn.Module:
    """DDP or FSDP2 around ``net`` (FSDP2 shards it in place and returns it)."""
    if args.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        if args.sync_bn:
            net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(net, device_ids=ids)
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        raise SystemExit(
            f"--mode fsdp needs FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.6); "
            f"this is torch {torch.__version__}. Upgrade torch or use --mode ddp."
        ) from None
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard(net, mesh=init_device_mesh(device.type, (dist.get_world_size(),)))
    return net


def batches(
    args: argparse.Namespace, rank: int, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Four distinct batches of this rank, made on the device before any timing."""
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    return [synthetic_batch("cnn", args.batch, gen, device=device) for _ in range(4)]


class StepTimer:
    """Per-step times in ms: CUDA events on a GPU, a wall clock (after the step) on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.pairs: list[tuple] = []

    def time(self, step: Callable[[], None]) -> None:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            self.pairs.append((start, end))
        else:
            start_s = time.perf_counter()
            step()
            self.pairs.append((start_s, time.perf_counter()))

    def median_ms(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return statistics.median(a.elapsed_time(b) for a, b in self.pairs)
        return statistics.median(1e3 * (b - a) for a, b in self.pairs)


def train(
    net: nn.Module, model: nn.Module, data: list, args: argparse.Namespace, device: torch.device
) -> tuple[float, list[float]]:
    """``warmup + steps`` SGD steps; returns the median step time (ms) and the losses."""
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    losses: list[torch.Tensor] = []

    def step(i: int) -> None:
        x_seq, labels = data[i % len(data)]
        reset_states(net)  # each replica forgets its own neuron state
        loss = nn.functional.cross_entropy(model(x_seq), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())

    for i in range(args.warmup):
        step(i)
    timer = StepTimer(device)
    for i in range(args.warmup, args.warmup + args.steps):
        timer.time(lambda i=i: step(i))
    return timer.median_ms(), [float(x) for x in losses]


def checksums(net: nn.Module, device: torch.device) -> torch.Tensor:
    """[world, 3]: each rank's (sum, sum of squares, weighted sum) of all its (gathered)
    parameters in float64."""
    flat = []
    for param in net.parameters():
        gather = getattr(param, "full_tensor", None)  # FSDP2's sharded DTensor
        flat.append((gather() if gather is not None else param).detach().double().flatten())
    vector = torch.cat(flat)
    weights = torch.linspace(1.0, 2.0, vector.numel(), dtype=torch.float64, device=vector.device)
    mine = torch.stack([vector.sum(), vector.square().sum(), (vector * weights).sum()]).to(device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return torch.stack(every).cpu()


def baseline(args: argparse.Namespace, rank: int, device: torch.device) -> float | None:
    """Median step time of plain (unwrapped) training on one device, measured by rank 0."""
    if args.no_baseline or dist.get_world_size() == 1:
        return None
    result = None
    if rank == 0:
        net = build_net(args, device)
        model = torch.compile(net) if args.compile else net
        result, _ = train(net, model, batches(args, rank, device), args, device)
    dist.barrier()
    return result


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    rank, world, device = init_distributed(args)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    succeeded = False
    try:
        result = run(args, rank, world, device)
        succeeded = True
    finally:
        # Everything the run built (the DDP/FSDP wrapper, its reducer and buckets) is freed by
        # now; wait for every rank before tearing the group down. Destroying it while a peer
        # still uses it, or freeing DDP's reducer after it, can hang gloo at exit. After a
        # failure, skip the barrier: a peer may never reach it.
        if succeeded:
            dist.barrier()
        dist.destroy_process_group()
    return result


def run(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> dict:
    """Baseline, wrapped training, and the ranks' agreement check; rank 0 writes the JSON."""
    one_device_ms = baseline(args, rank, device)
    net = build_net(args, device)
    model = wrap(net, args, device)
    model = torch.compile(model) if args.compile else model
    step_ms, losses = train(net, model, batches(args, rank, device), args, device)
    every_ms = torch.tensor([step_ms], device=device)
    dist.all_reduce(every_ms, op=dist.ReduceOp.MAX)  # a step is as slow as its slowest rank
    sums = checksums(net, device)
    agree = bool((sums == sums[0]).all())
    result = report(args, world, one_device_ms, float(every_ms), sums, agree, losses)
    if rank == 0 and args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    if not agree:
        raise SystemExit(f"rank {rank}: the ranks' parameters differ:\n{sums}")
    return result


def report(
    args: argparse.Namespace,
    world: int,
    one_device_ms: float | None,
    step_ms: float,
    sums: torch.Tensor,
    agree: bool,
    losses: list[float],
) -> dict:
    """Print the summary (rank 0) and return it as a dict."""
    samples = args.batch * world
    result = {
        "mode": args.mode,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "world_size": world,
        "neuron": args.neuron,
        "param_shape": args.param_shape,
        "channels": list(args.channels),
        "batch_per_rank": args.batch,
        "steps": args.steps,
        "step_ms": step_ms,
        "samples_per_s": 1e3 * samples / step_ms,
        "one_device_step_ms": one_device_ms,
        "scaling_efficiency": None if one_device_ms is None else one_device_ms / step_ms,
        "ranks_agree": agree,
        "checksum": sums[0].tolist(),
        "loss_first_last": [losses[0], losses[-1]],
        "torch": torch.__version__,
    }
    if dist.get_rank() != 0:
        return result
    clock = "CUDA events" if args.device == "cuda" else "wall clock"
    print(
        f"{args.mode} on {world} x {result['device']}, {args.neuron} neurons, "
        f"channels {list(args.channels)}, batch {args.batch}/rank, T=4"
    )
    if one_device_ms is not None:
        rate = 1e3 * args.batch / one_device_ms
        print(f"  1 device : {one_device_ms:8.2f} ms/step  {rate:9.0f} samples/s")
    devices = f"{world} device{'s' if world > 1 else ''}"
    print(f"  {devices:9s}: {step_ms:8.2f} ms/step  {result['samples_per_s']:9.0f} samples/s")
    print(f"  (step times: median of {args.steps} steps, {clock}; slowest rank)")
    if one_device_ms is not None:
        print(
            f"  scaling efficiency t1/t{world} (weak scaling): {result['scaling_efficiency']:.2f}"
        )
    elif world == 1:
        print("  (one rank: launch with torchrun --nproc_per_node=2 for the scaling figures)")
    status = "identical" if agree else "DIFFERENT"
    print(f"  parameter checksum on {world} ranks: {status} (sum {sums[0, 0].item():.12g})")
    print(f"  loss {losses[0]:.4f} -> {losses[-1]:.4f} (rank 0)")
    return result


if __name__ == "__main__":
    main()
