"""The README's training snippet learns, the demo trains on the digits and draws, and
the recurrent example remembers a cue that its feed-forward twin cannot.

Run as a new user would: the snippet is the code block under the README heading
"## A custom neuron, trained", read from README.md and executed as it stands
(on three seeds); the demo is examples/demo.py with a one-epoch budget; the
recurrent example is examples/recurrent.py with a short budget and delay.
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
HEADING = "## A custom neuron, trained"


def snippet(markdown: str, heading: str = HEADING) -> str:
    """The first ```python block after ``heading`` (a line of its own)."""
    lines = markdown.splitlines()
    if heading not in lines:
        raise AssertionError(f"README.md has no heading {heading!r}")
    rest = lines[lines.index(heading) + 1 :]
    start = next(i for i, line in enumerate(rest) if line.strip() == "```python") + 1
    end = next(i for i in range(start, len(rest)) if rest[i].strip() == "```")
    return "\n".join(rest[start:end]) + "\n"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_readme_snippet_visibly_learns(seed: int, capsys: pytest.CaptureFixture[str]) -> None:
    code = snippet((ROOT / "README.md").read_text())
    torch.manual_seed(seed)  # the snippet draws its data and weights from torch's global RNG
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_snippet"})
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", capsys.readouterr().out)]
    assert len(losses) == 20, f"the snippet should print its loss at each of 20 steps: {losses}"
    assert losses[0] == pytest.approx(math.log(2), abs=0.05)  # two classes, untrained
    assert losses[-1] < 0.5 * losses[0], f"the README snippet does not learn: {losses}"


def load_example(name: str) -> ModuleType:
    """examples/<name>.py as a module (its ``main`` not run)."""
    path = ROOT / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"symneuron_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_demo() -> ModuleType:
    return load_example("demo")


@pytest.mark.slow  # trains the demo for an epoch: ~8 s
def test_demo_learns_the_digits_in_one_epoch_and_saves_its_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for extra in ("sklearn", "tqdm", "matplotlib"):
        pytest.importorskip(extra)
    demo = load_demo()
    accuracy = demo.main(["--epochs", "1", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert accuracy > 0.5, f"one epoch on the digits should reach well above chance (0.1): {out}"
    assert f"held-out test accuracy {accuracy:.3f}" in out
    assert "dH/dtau  = V/tau**2" in out  # the derived partials, printed
    assert "check(TanhLIF, backend=cpu" in out and "PASS" in out
    assert "__device__ __forceinline__ void TanhLIF_forward_h" in out  # the CUDA source
    for name in ("raster.png", "traces.png", "rates.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, name


def test_demo_rate_code_fires_with_the_pixel_intensity() -> None:
    demo = load_demo()
    pixels = torch.tensor([[0.0, 0.25, 1.0]]).expand(4000, 3)
    spikes = demo.rate_encode(pixels, torch.Generator().manual_seed(0))
    assert spikes.shape == (demo.T, 4000, 3)
    assert set(spikes.unique().tolist()) <= {0.0, 1.0}
    rates = spikes.mean((0, 1))
    assert rates[0] == 0 and rates[2] == 1
    assert abs(float(rates[1]) - 0.25) < 0.01  # binomial sd: sqrt(.25*.75/48000) = 0.002


def test_demo_rejects_a_zero_budget() -> None:
    with pytest.raises(SystemExit):
        load_demo().main(["--epochs", "0"])


@pytest.mark.slow  # trains the example: ~12 s
def test_recurrent_example_remembers_what_feedforward_cannot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for extra in ("tqdm", "matplotlib"):
        pytest.importorskip(extra)
    example = load_example("recurrent")
    final = example.main(["--steps", "200", "--delay", "6", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert final["recurrent"] > 0.9, f"the recurrent network should recall the cue: {out}"
    assert final["feedforward"] < 0.4, f"without recurrence it should be near chance: {out}"
    line = f"recurrent {final['recurrent']:.3f}, feedforward {final['feedforward']:.3f}"
    assert f"held-out accuracy at delay 6: {line} (chance 0.25)" in out
    for name in ("recurrent_learning.png", "recurrent_raster.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, name


def test_recurrent_example_trials_hold_the_cue_only_at_the_start() -> None:
    example = load_example("recurrent")
    x_seq, cues = example.trials(4000, 3, torch.Generator().manual_seed(0))
    assert x_seq.shape == (4 + 3 + 4, 4000, 25) and set(x_seq.unique().tolist()) <= {0.0, 1.0}
    cue_channels = x_seq[:, :, :20].unflatten(2, (4, 5)).mean(3)  # [T, n, cue]
    shown = cue_channels[:4].gather(2, cues.view(1, -1, 1).expand(4, -1, 1))
    assert abs(float(shown.mean()) - 0.6) < 0.01  # sd: sqrt(.24 / 80000) = 0.002
    assert abs(float(cue_channels[:4].sum(2).mean() - shown.squeeze(2).mean()) - 3 * 0.02) < 0.01
    assert abs(float(x_seq[4:7].mean()) - 0.02) < 0.005  # the delay: noise only
    go = x_seq[:, :, 20:]
    assert abs(float(go[7:].mean()) - 0.6) < 0.01 and abs(float(go[:7].mean()) - 0.02) < 0.005
    curriculum = [example.delay_at(step, 800, 15) for step in (0, 26, 27, 399, 400, 799)]
    assert curriculum == [1, 1, 2, 15, 15, 15]


def test_recurrent_example_rejects_a_zero_budget() -> None:
    with pytest.raises(SystemExit):
        load_example("recurrent").main(["--steps", "0"])


def load_yinyang() -> ModuleType:
    return load_example("yinyang_eventprop")


def test_yinyang_loss_leaves_out_samples_whose_label_output_is_silent() -> None:
    """The first-spike cross-entropy with W&P's α term, and nothing (no gradient either)
    from a sample whose label output did not spike."""
    example = load_yinyang()
    inf = math.inf
    output = torch.tensor(
        [[[5.0, inf], [7.0, 9.0], [inf, inf]], [[4.0, inf], [inf, inf], [6.0, inf]]],
        dtype=torch.float64,
        requires_grad=True,
    )
    labels = torch.tensor([0, 1])  # the second sample's label output is silent
    loss = example.loss_of(output, labels)
    first = torch.tensor([5.0, 7.0, example.T_END], dtype=torch.float64)
    want = -torch.log_softmax(-first / example.TAU0, 0)[0]
    want = want + example.ALPHA * (math.exp(5.0 / example.TAU1) - 1)
    assert loss.item() == pytest.approx(want.item() / 2, rel=1e-12)
    loss.backward()
    assert output.grad is not None
    assert output.grad[1].eq(0).all() and output.grad[0, :2, 0].ne(0).all()


@pytest.mark.slow  # two short epochs, the kernels compiled and the figures drawn: ~10 s
def test_yinyang_example_learns_and_draws(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for extra in ("tqdm", "matplotlib"):
        pytest.importorskip(extra)
    example = load_yinyang()
    argv = ["--epochs", "2", "--train", "800", "--test", "300", "--hidden", "60"]
    accuracy = example.main([*argv, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert accuracy > 0.45, f"two short epochs should beat chance (1/3) clearly: {out}"
    assert f"test accuracy {accuracy:.3f} after 2 epochs" in out
    for name in ("yinyang_decision_map.png", "yinyang_raster.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, name
