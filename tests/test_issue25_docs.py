"""What the README and the user guide promise holds (issue 25, items 12-14)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import symneuron as sn

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter that imports this checkout's symneuron."""
    env = {**os.environ, "PYTHONPATH": str(Path(sn.__file__).parents[1])}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow  # a fresh Python process checking LIF on the backends here
def test_readme_testing_snippet_runs_after_import_symneuron_as_sn() -> None:
    snippets = re.findall(r"`(sn\.testing\.[^`]*)`", README)
    assert snippets == ["sn.testing.assert_neuron_ok(neuron)"], snippets
    code = f"import symneuron as sn\nneuron = sn.models.LIF()\n{snippets[0]}\nprint('ran')"
    proc = _python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ran", proc.stderr[-3000:]


@pytest.mark.slow  # a fresh interpreter imports symneuron: ~6 s
def test_testing_is_an_attribute_of_the_package() -> None:
    proc = _python("import symneuron as sn; print(sn.testing.assert_neuron_ok.__name__)")
    assert proc.stdout.strip() == "assert_neuron_ok", proc.stderr[-3000:]


def test_readme_states_the_torch_pyproject_requires() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    required = re.findall(r'^\s*"torch\s*([<>=!~][^";]*)', pyproject, flags=re.MULTILINE)
    assert len(required) == 1 and required[0].startswith(">="), required
    stated = re.findall(r"any torch >= ([\d.]+)", README.replace("\n", " "))
    assert stated == [required[0].removeprefix(">=").strip()], (stated, required)


def _sample_outputs(markdown: str) -> list[tuple[str, str]]:
    """Each ```python block followed directly by a ```text block: (code, printed text)."""
    block = r"```{}\n((?:(?!```).)*?)\n```"
    pairs = re.findall(block.format("python") + r"\s*" + block.format("text"), markdown, re.S)
    return [(code, text) for code, text in pairs]


def _masked(text: str) -> str:
    """``text`` with the measured errors of a check table replaced (they vary by machine)."""
    return re.sub(r"error (\S+)", "error <e>", text.rstrip())


def test_user_guide_samples_print_what_the_guide_shows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    samples = _sample_outputs((REPO / "docs" / "user_guide.md").read_text())
    assert len(samples) >= 1 and any("sn.check" in code for code, _ in samples)
    for code, shown in samples:
        exec(compile(code, "user_guide.md", "exec"), {"__name__": "guide_sample"})
        assert _masked(capsys.readouterr().out) == _masked(shown)


def test_readme_training_snippet_is_seeded_and_prints_the_stated_losses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_examples import snippet

    code = snippet(README)
    stated = re.search(r"# (\d\.\d{4}) at step 0, (\d\.\d{4}) at 19\n", code)
    assert "torch.manual_seed(" in code and stated, code
    with torch.random.fork_rng():  # the snippet seeds torch's global RNG
        exec(compile(code, "README.md", "exec"), {"__name__": "readme_snippet"})
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", capsys.readouterr().out)]
    assert len(losses) == 20
    assert losses[0] == pytest.approx(float(stated[1]), abs=1e-4)
    assert losses[-1] == pytest.approx(float(stated[2]), abs=0.02)  # other CPUs, other sums


def test_nvrtc_advice_names_the_extra_that_holds_nvrtc() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    extras = dict(re.findall(r"^(\w+) = \[(.*?)\]", pyproject, flags=re.MULTILINE | re.S))
    assert "nvrtc" in extras["cuda"]
    files = [*REPO.glob("symneuron/**/*.py"), *REPO.glob("tests/*.py"), REPO / "README.md"]
    advice = [
        (path.name, extra)
        for path in files
        for extra in re.findall(r"symneuron\[(\w+)\]'?\)? ?\(NVRTC", path.read_text())
    ]
    assert advice and all("nvrtc" in extras[extra] for _, extra in advice), advice
