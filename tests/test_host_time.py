"""Behaviour of the host-time fast paths (their speed is measured by a benchmark, not here).

* The eager binding takes the params as given and records no autograd node per param:
  each param's gradient reaches it through autograd's own reduction to the param's
  shape and dtype; checked against the float64 torch reference for every param shape.
* ``NeuronLayer.param_values`` returns the registered tensors themselves (also after one
  is replaced), and the layer's memory stays plain attributes.
* A dict of param names and one of symbols give the same run; unknown names still fail.
* A pass's generated allocator and packer follow its named arguments (every pass, the
  recurrent ones too; neurons with and without extra states and random draws): each
  output exists exactly where :meth:`~symneuron.signature.Arg.exists` says, with the
  shape and dtype its ``shape`` and ``role`` name; the packed values are those of a
  plain loop over the arguments.
* On a SIMT backend the wide variant runs only on 16-byte-aligned tensors (a stride-0
  broadcast is read as one value): checked on the CPU, its backend marked SIMT.
* The training binding, applied below ``Function.apply``'s Python layer, still takes a
  tensor left by an exited ``torch.func`` transform (a dead wrapper) as its value.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import symneuron as sn
from symneuron import dtypes
from symneuron.binding import EagerBinding, program
from symneuron.params import launch_param
from symneuron.runtime import kernels, settings
from symneuron.signature import PASSES, Pass
from tests.conftest import assert_fires_sometimes, generator, rel_err, seed_of

SHAPE = (3, 4)


def _grads(backend: str, w: torch.Tensor, x: torch.Tensor, r: torch.Tensor) -> tuple:
    w = w.detach().clone().requires_grad_()
    x = x.detach().clone().requires_grad_()
    spikes, v = sn.simulate(sn.models.PLIF(v_reset=None), x, params={"w": w}, backend=backend)
    ((spikes + v) * r).sum().backward()
    return spikes.detach(), w.grad, x.grad


@pytest.mark.parametrize(
    "w_shape", [(), (1,), (1, 1), (3, 1), (4,), SHAPE], ids=lambda s: str(list(s))
)
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.float64])
def test_param_gradients_of_every_shape_match_reference(w_shape, w_dtype) -> None:
    gen = generator(seed_of("host-param-shapes", w_shape))
    x = torch.randn(6, *SHAPE, generator=gen, dtype=torch.float64) * 1.5
    r = torch.randn(6, *SHAPE, generator=gen, dtype=torch.float64)
    w = torch.randn(w_shape, generator=gen, dtype=torch.float64).to(w_dtype)
    spikes, w_grad, x_grad = _grads("cpu", w, x, r)
    want_spikes, want_w, want_x = _grads("torch", w.double(), x, r)
    assert_fires_sometimes(spikes)
    assert torch.equal(spikes, want_spikes)
    assert w_grad.shape == w.shape and w_grad.dtype == w_dtype
    assert float(want_w.abs().max()) > 0
    assert rel_err(w_grad.double(), want_w) <= (1e-5 if w_dtype == torch.float32 else 1e-9)
    assert rel_err(x_grad, want_x) <= 1e-9


def test_no_autograd_node_per_param() -> None:
    w = torch.zeros(12, requires_grad=True)
    x = torch.rand(2, 12, requires_grad=True)  # [T, N]: no view of the outputs either
    spikes, _ = sn.simulate(sn.models.PLIF(), x, params={"w": w}, backend="cpu")
    node = spikes.grad_fn
    assert type(node).__name__ == "EagerBindingBackward"
    nexts = [fn for fn, _ in node.next_functions if fn is not None]
    # straight to the leaves' AccumulateGrad
    assert {id(fn.variable) for fn in nexts} == {id(x), id(w)}


def test_float_param_of_learnable_gets_no_gradient() -> None:
    x = torch.rand(3, 5, requires_grad=True)
    spikes, v = sn.simulate(sn.models.PLIF(), x, params={"w": 0.3}, backend="cpu")
    (spikes + v).sum().backward()
    assert x.grad is not None and float(x.grad.abs().max()) > 0


def test_layer_param_values_are_the_registered_tensors() -> None:
    layer = sn.NeuronLayer(sn.models.PLIF(), backend="cpu")
    assert layer.param_values()["w"] is layer.w
    layer.w = nn.Parameter(torch.full((5,), 0.5))
    assert layer.param_values()["w"] is layer.w
    lif = sn.NeuronLayer(sn.models.LIF(), backend="cpu")
    assert lif.param_values()["tau"] is lif.tau  # a buffer


def test_layer_memory_stays_plain_attributes() -> None:
    layer = sn.NeuronLayer(sn.models.Izhikevich(a=0.1, b=0.2), backend="cpu")
    keys = set(layer.state_dict())
    layer(torch.rand(3, 2, 5))
    assert layer.v is not None and layer.v.shape == (2, 5)
    assert set(layer.states) == {"W"} and layer.states["W"].shape == (2, 5)
    assert set(layer.state_dict()) == keys
    assert "v" not in layer._buffers and "v" not in layer._parameters
    layer.reset()
    assert layer.v is None and layer.v_seq is None and layer.states == {}


def test_names_and_symbols_give_the_same_run() -> None:
    neuron = sn.models.ThresholdLIF(learnable=["tau", "theta"])
    gen = generator(seed_of("host-names"))
    x = torch.randn(4, 6, generator=gen) * 2
    by_name = sn.simulate(neuron, x, params={"tau": 3.0, "theta": 0.7}, backend="cpu")
    symbols = {str(s): s for s in neuron.charge.free_symbols} | {"theta": neuron.v_threshold}
    by_symbol = sn.simulate(
        neuron, x, params={symbols["tau"]: 3.0, symbols["theta"]: 0.7}, backend="cpu"
    )
    assert_fires_sometimes(by_name[0])
    for a, b in zip(by_name, by_symbol, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="Unknown parameter 'tauu'"):
        sn.simulate(neuron, x, params={"tauu": 3.0}, backend="cpu")


def test_wrong_number_of_kernel_params_is_an_error() -> None:
    neuron = sn.models.PLIF()
    x = torch.rand(2, 4, requires_grad=True)
    with pytest.raises(ValueError, match="takes 1 params, got 0"):
        EagerBinding.apply(program(neuron, "cpu"), x, None, None, "last", (4,), None)


def _conditions(pass_: Pass) -> list[dict[str, bool]]:
    """Every combination of the conditions a pass's arguments name."""
    names = sorted({"states"} | {a.when for a in pass_.args if a.when})
    flags = itertools.product((False, True), repeat=len(names))
    return [dict(zip(names, values, strict=True)) for values in flags]


@pytest.mark.parametrize("pass_", PASSES.values(), ids=lambda p: p.name)
def test_allocator_follows_the_named_outputs(pass_: Pass) -> None:
    like = torch.zeros(5, 7, dtype=torch.float64)
    dims = {"T": 5, "N": 7, "rows": 1, "k": 2, "P": 3}
    for present in _conditions(pass_):
        allocate = pass_.allocator(present)
        assert pass_.allocator(present) is allocate  # made once per set of outputs
        out = allocate(like, dims, torch.float32)
        assert type(out) is pass_.returns
        for arg, got in zip(pass_.outputs, out, strict=True):
            if not arg.exists(present):
                assert got is None, (arg.name, present)
                continue
            want_dtype = torch.float32 if arg.role == "accum" else like.dtype
            assert got.shape == tuple(dims[d] for d in arg.shape), (arg.name, present)
            assert got.dtype == want_dtype and got.is_contiguous()
        again = pass_.allocate(like, dims, present, torch.float32)
        assert [None if t is None else t.shape for t in again] == [
            None if t is None else t.shape for t in out
        ]


def _expected_pack(
    pass_: Pass, states: bool, draws: bool, out: Any, values: dict[str, Any]
) -> list[int]:
    """The packed values by a plain loop over the named arguments (the oracle)."""
    given = dict(zip(pass_.returns._fields, out, strict=True)) | values
    packed: list[int] = []
    for arg in pass_.of(states, draws):
        value = given.get(arg.name, arg.default)
        if arg.each and arg.output:  # one address per row of an [rows, N] output
            row = value.shape[1] * value.element_size()
            packed += [value.data_ptr() + j * row for j in range(value.shape[0])]
        elif arg.each:
            packed += [p.data_ptr() for p in value] if arg.pointer else list(value)
        elif arg.pointer:
            packed.append(0 if value is None else value.data_ptr())
        else:
            packed.append(value)
    return packed


@pytest.mark.parametrize("model", ["LIF", "Izhikevich", "NoisyLIF"])
@pytest.mark.parametrize("pass_", PASSES.values(), ids=lambda p: p.name)
def test_packer_packs_in_the_arguments_order(pass_: Pass, model: str) -> None:
    neuron = getattr(sn.models, model)()
    states, draws, n_params = len(neuron.states) > 0, neuron.draws, len(neuron.params)
    gen = generator(seed_of("packer", pass_.name, model))
    values: dict[str, Any] = {
        "params": [torch.rand(7, generator=gen) for _ in range(n_params)],
        "param_strides": [1] * n_params,
        "T": 5,
        "N": 7,
        "F": 7,
        "D": 2,
        "grad_spike_scalar": 1,
        "S": 4,  # (a grid pass's)
        "TK": 8,
        "scratch": torch.zeros(16, dtype=torch.uint8),
    }
    tensors = [a.name for a in pass_.inputs if a.pointer and not a.each]
    for i, name in enumerate(tensors):  # every other one after the first None: NULL
        values[name] = None if i % 2 else torch.rand(5, 7, generator=gen)
    out = pass_.returns(  # the second output absent, the others [2, 7] (2 rows)
        *[None if i == 1 else torch.rand(2, 7, generator=gen) for i in range(len(pass_.outputs))]
    )
    got = kernels._packer(pass_, states, draws)(out, values)
    assert got == _expected_pack(pass_, states, draws, out, values)
    counts = {"param": n_params, "learnable": 2}
    assert len(got) == len(kernels._kinds(pass_.of(states, draws), counts))


def _misaligned(n: int) -> torch.Tensor:
    """A contiguous [4, n] float32 tensor 4 bytes past a 16-byte boundary."""
    out = torch.zeros(4 * n + 1)[1:].view(4, n)
    assert out.data_ptr() % 16
    return out


def test_wide_variant_only_on_aligned_tensors_of_a_simt_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prog = kernels.Program(sn.models.LIF(), "cpu")  # its own launchers, marked SIMT
    monkeypatch.setattr(prog, "impl", prog.impl._replace(simt=True))
    monkeypatch.setattr(settings, "min_vector_threads", 1)
    wide = dtypes.lookup("cpu", torch.float32).lanes
    n = 2 * wide
    aligned = torch.randn(4, n, generator=generator(seed_of("simt-lanes"))) * 2
    misaligned = _misaligned(n).copy_(aligned)
    params = [launch_param(2.0, torch.float32, torch.device("cpu"), (n,), n)]

    def launched(call: Any) -> tuple[Any, set[int]]:
        """What ``call`` returns, and the lane counts of the kernels it launched."""
        prog._launchers.clear()
        return call(), {key[4] for key in prog._launchers}

    runs = {
        name: launched(lambda x=x: prog.forward(x, None, None, params, True, "seq"))
        for name, x in [("aligned", aligned), ("misaligned", misaligned)]
    }
    assert runs["aligned"][1] == {wide} and runs["misaligned"][1] == {1}
    assert_fires_sometimes(runs["aligned"][0].spike_seq)
    for a, b in zip(runs["aligned"][0], runs["misaligned"][0], strict=True):
        assert (a is None and b is None) or torch.equal(a, b)  # the same values either way
    h_seq, x_kept = runs["aligned"][0].h_seq, (aligned if prog.needs_x else None)
    broadcast = torch.ones(()).expand(4, n)  # all strides 0: read as one value
    for grad, want in [(broadcast, wide), (_misaligned(n).fill_(1.0), 1)]:
        _, used = launched(
            lambda g=grad: prog.backward(
                g, None, None, h_seq, None, x_kept, None, None, params, "none"
            )
        )
        assert used == {want}


def test_a_dead_functorch_wrapper_runs_as_the_tensor_it_wraps() -> None:
    leaked: list[torch.Tensor] = []

    def loss(x: torch.Tensor) -> torch.Tensor:
        leaked.append(x)  # escapes the transform: a wrapper without storage once it exits
        return (x * 2).sum()

    x = torch.randn(4, 16, generator=generator(seed_of("dead-wrapper"))) * 2
    torch.func.grad(loss)(x)
    dead = leaked[0]
    assert dead.requires_grad  # so the call takes the training binding
    with pytest.raises(RuntimeError, match="storage"):
        dead.data_ptr()
    got = sn.simulate(sn.models.LIF(), dead, backend="cpu")
    want = sn.simulate(sn.models.LIF(), x, backend="cpu")
    assert_fires_sometimes(want[0])
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_a_named_backend_is_checked_again_for_another_dtype_or_device() -> None:
    neuron = sn.models.LIF(tau=1e39)  # beyond float32: a warning when it computes in it
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float64 holds 1e39: no warning
        sn.simulate(neuron, torch.rand(3, 5, dtype=torch.float64), backend="cpu")
    with pytest.warns(RuntimeWarning, match=r"tau=1e\+39.*beyond the range of float32"):
        with pytest.raises(RuntimeError, match="overflow"):  # (then torch refuses 1e39)
            sn.simulate(neuron, torch.rand(3, 5), backend="cpu")
    with pytest.raises(TypeError, match="backend='cpu' supports"):
        sn.simulate(neuron, torch.rand(3, 5).half(), backend="cpu")
    with pytest.raises(ValueError, match="backend='cpu' needs CPU tensors"):
        sn.simulate(neuron, torch.empty(3, 5, device="meta"), backend="cpu")
