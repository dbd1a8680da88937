"""The on-disk cache of generated text: a warm process runs without SymPy derivation."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import symneuron as sn
from symneuron.runtime import cache, cpu

pytestmark = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")

# Runs LIF with a learnable tau and PLIF (whose backward reads X) on the cpu backend and
# prints their outputs and gradients; with WARM=1, Neuron.spec raises, so everything must
# come from the disk cache the first run left.
SCRIPT = textwrap.dedent(
    """
    import os, torch, symneuron as sn
    if os.environ.get("WARM") == "1":
        import symneuron.derivation
        def no_derivation(neuron):
            raise AssertionError("derived although the cache was warm")
        symneuron.derivation.derive = no_derivation
    torch.manual_seed(3)
    x = (torch.rand(6, 4, 5, dtype=torch.float64) * 1.5).requires_grad_()
    tau = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    w = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    s1, v1 = sn.simulate(sn.models.LIF(learnable=["tau"]), x, params={"tau": tau}, backend="cpu")
    s2, v2 = sn.simulate(sn.models.PLIF(), x, params={"w": w}, backend="cpu")
    ((s1 * 1.3).sum() + v1.sum() + (s2 * 0.7).sum() + v2.pow(2).sum()).backward()
    torch.save([s1, v1, s2, v2, x.grad, tau.grad, w.grad], os.environ["OUT"])
    """
)


def _run(tmp_path: Path, warm: bool) -> list[torch.Tensor]:
    out = tmp_path / f"out{int(warm)}.pt"
    env = {
        **os.environ,
        "SYMNEURON_CACHE": str(tmp_path / "cache"),
        "WARM": str(int(warm)),
        "OUT": str(out),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(sn.__file__).parents[1])])),
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out)


@pytest.mark.slow  # two fresh Python processes, each compiling or loading four kernels
def test_warm_cache_skips_derivation_and_gives_the_same_results(tmp_path: Path) -> None:
    cold = _run(tmp_path, warm=False)
    generated = sorted(p.suffix for p in (tmp_path / "cache" / "generated").iterdir())
    assert generated.count(".c") == 4  # LIF and PLIF: forward and backward kernels
    assert generated.count(".txt") == 2  # needs_x per neuron
    warm = _run(tmp_path, warm=True)
    assert all(a.dtype == torch.float64 for a in cold)
    assert cold[4].abs().sum() > 0 and cold[5] != 0 and cold[6] != 0  # gradients flowed
    for a, b in zip(cold, warm, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_generated_text_is_keyed_by_definition_and_generator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []

    def make(text: str):  # noqa: ANN202
        return lambda: made.append(text) or text

    monkeypatch.setenv("SYMNEURON_CACHE", str(tmp_path))
    assert cache.generated(("a", "b"), ".c", make("one")) == "one"
    assert cache.generated(("a", "b"), ".c", make("two")) == "one"  # cached
    assert cache.generated(("a", "c"), ".c", make("three")) == "three"  # other key
    assert made == ["one", "three"]
    cache.generator_version.cache_clear()
    version = cache.generator_version()
    assert len(version) == 16 and version == cache.generator_version()


def test_unwritable_cache_is_bypassed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("SYMNEURON_CACHE", str(blocker / "cache"))
    assert cache.generated(("x",), ".c", lambda: "made") == "made"
