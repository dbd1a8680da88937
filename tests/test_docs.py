"""The documentation builds in strict mode (no broken link or reference, no docstring
griffe cannot parse), and its zoo page is generated from every model of the zoo."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sympy as sp

import symneuron as sn

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    if not all(importlib.util.find_spec(m) for m in ("mkdocs", "mkdocstrings")):
        if os.environ.get("CI"):
            pytest.fail('CI must build the API reference: install ".[docs]" (.ci/run)')
        pytest.skip('needs the docs extra: pip install -e ".[docs]"')
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    zoo = html.unescape((site / "reference" / "zoo" / "index.html").read_text())
    for name in sn.models.ZOO:
        assert f'id="{name.lower()}"' in zoo, f"no section for {name}"
    assert sp.latex(sn.models.LIF().charge) in zoo
    assert sp.latex(sn.models.QIF().derivatives()["dH/dV"]) in zoo
    assert (site / "reference" / "testing" / "index.html").is_file()
    assert "assert_neuron_ok" in (site / "reference" / "testing" / "index.html").read_text()
    for page in (site / "reference").glob("*/index.html"):  # no raw reStructuredText left
        text = page.read_text()
        assert not re.search(r":(class|func|meth|mod|data|attr):", text), page
        assert ".. math::" not in text, page
    assert 'class="arithmatex"' in (site / "reference" / "models" / "index.html").read_text()


def _griffe_rst():
    if importlib.util.find_spec("griffe") is None:
        pytest.skip('needs the docs extra: pip install -e ".[docs]"')
    spec = importlib.util.spec_from_file_location("griffe_rst", REPO / "docs" / "griffe_rst.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docstring_roles_and_math_become_markdown() -> None:
    markdown = _griffe_rst().markdown
    text = (
        "See :class:`~symneuron.Neuron`, :func:`simulate`, :meth:`the call <Layer.forward>`"
        " and :math:`\\tau`.\n\n.. math::\n    a = b\n\n    c = d\n\nAfter."
    )
    assert markdown(text) == (
        "See `Neuron`, `simulate`, `the call` and $\\tau$.\n\n$$\na = b\nc = d\n$$\n\nAfter."
    )
    rows = markdown(".. math::\n    a &= b \\\\\n    c &= d")
    assert rows == "$$\n\\begin{aligned}\na &= b \\\\\nc &= d\n\\end{aligned}\n$$"


@pytest.mark.parametrize("obj", [sn, sn.Neuron], ids=["package", "Neuron"])
def test_docstrings_parse_into_described_parameters_and_examples(obj: object) -> None:
    """Every listed parameter has a description (a paragraph after the list was read as
    a parameter ``A``), and the example is an Examples section (a code block on the API
    page, not one paragraph)."""
    griffe = pytest.importorskip("griffe")
    sections = griffe.Docstring(obj.__doc__ or "", parser="numpy").parse()
    kinds = [section.kind.value for section in sections]
    assert "examples" in kinds, kinds
    for section in sections:
        if section.kind.value == "parameters":
            assert all(p.description for p in section.value), [p.name for p in section.value]


def test_the_docs_home_shows_every_readme_figure() -> None:
    """Each picture of the README is on the docs home, from a file under docs/ (issue 34
    item 10: the site's home showed none)."""
    readme = re.findall(r"!\[[^\]]*\]\(docs/([^)]+)\)", (REPO / "README.md").read_text())
    home = set(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (REPO / "docs" / "index.md").read_text()))
    assert readme
    for figure in readme:
        assert figure in home, figure
        assert (REPO / "docs" / figure).is_file(), figure
