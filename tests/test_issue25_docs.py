"""What the README and the user guide promise holds (issue 25, items 12-14)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_testing_is_an_attribute_of_the_package() -> None:
    proc = _python("import symneuron as sn; print(sn.testing.assert_neuron_ok.__name__)")
    assert proc.stdout.strip() == "assert_neuron_ok", proc.stderr[-3000:]


def test_readme_states_the_torch_pyproject_requires() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    required = re.findall(r'^\s*"torch\s*([<>=!~][^";]*)', pyproject, flags=re.MULTILINE)
    assert len(required) == 1 and required[0].startswith(">="), required
    stated = re.findall(r"any torch >= ([\d.]+)", README.replace("\n", " "))
    assert stated == [required[0].removeprefix(">=").strip()], (stated, required)
