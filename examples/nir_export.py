"""Train a small network with a learnable-τ LIF, export it to NIR, reload it, compare.

Run: python examples/nir_export.py   (needs `pip install symneuron[nir]`; a few seconds)
"""

import tempfile
from pathlib import Path

import nir
import torch
from torch import nn

import symneuron as sn
import symneuron.nir  # noqa: F401  (makes sn.nir available)

DT = 1e-3  # one step = 1 ms of NIR's time
gen = torch.Generator().manual_seed(0)
torch.manual_seed(0)

# A synthetic task: which of 4 input groups fires most.
x_seq = (torch.rand(20, 256, 16, generator=gen) < 0.2).float()
x_seq[:, torch.arange(256), (torch.arange(256) % 4) * 4] += 1.0
labels = torch.arange(256) % 4

lif = sn.models.LIF(tau=2.0, learnable=["tau"])  # hard reset: NIR's reset
net = nn.Sequential(
    nn.Linear(16, 32),
    sn.NeuronLayer(lif, params={"tau": torch.full((32,), 2.0)}),
    nn.Linear(32, 4),
    sn.nir.Readout(sn.models.LIF(tau=4.0)),
)
opt = torch.optim.Adam(net.parameters(), lr=2e-2)
for _ in range(40):
    net[1].reset(), net[3].reset()
    loss = nn.functional.cross_entropy(net(x_seq).mean(0), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
tau = net[1].tau.detach()
print(f"loss {loss.item():.3f}; trained tau per neuron {tau.min():.2f}..{tau.max():.2f} steps")

graph = sn.nir.export(net, x_seq, dt=DT)
print({name: type(node).__name__ for name, node in graph.nodes.items()})
with tempfile.TemporaryDirectory() as tmp:
    nir.write(Path(tmp) / "net.nir", graph)
    loaded = sn.nir.load(nir.read(Path(tmp) / "net.nir"), dt=DT)

hidden = []  # the hidden layer's spikes, original then reloaded
net[1].register_forward_hook(lambda m, i, out: hidden.append(out))
loaded.node("1").register_forward_hook(lambda m, i, out: hidden.append(out))
with torch.no_grad():
    net[1].reset(), net[3].reset()
    ours, theirs = net(x_seq), loaded(x_seq)
print(f"hidden spikes identical: {torch.equal(*hidden)} ({int(hidden[0].sum())} spikes)")
accuracy = (theirs.mean(0).argmax(1) == labels).float().mean()
print(f"reloaded readout max |diff| {(ours - theirs).abs().max():.2e}, accuracy {accuracy:.2f}")
