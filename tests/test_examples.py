"""The README's training snippet learns, and the demo trains on the digits and draws.

Run as a new user would: the snippet is the code block under the README heading
"## A custom neuron, trained", read from README.md and executed as it stands
(on three seeds); the demo is examples/demo.py with a one-epoch budget.
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


def load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("symneuron_demo", ROOT / "examples" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
