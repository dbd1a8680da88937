"""docs/architecture.md stays true: its stage table names every module of the package
with the rank the layering test gives it and nothing that does not exist, every file it
names exists, and its pipeline diagram is rendered as a Mermaid block by the docs'
own Markdown configuration."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from test_definition import PACKAGE, STAGES

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "architecture.md"
#: the stage table's header cells
HEADER = ("stage", "rank", "files", "in → out")
#: folders of the repository a page may name files in, beside the package's own
REPO_FOLDERS = ("tests/", "docs/", "benchmarks/", "examples/")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def stage_table(text: str) -> list[tuple[str, int, list[str]]]:
    """The rows of the page's stage table: (stage, rank, the files named in the row)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if tuple(_cells(line)) == HEADER]
    assert len(starts) == 1, f"expected one table headed {' | '.join(HEADER)}"
    rows = []
    for line in lines[starts[0] + 2 :]:  # (after the header and its --- row)
        if not line.startswith("|"):
            break
        stage, rank, files, _ = _cells(line)
        rows.append((stage, int(rank), re.findall(r"`([^`]+\.py)`", files)))
    return rows


def named_ranks(rows: list[tuple[str, int, list[str]]]) -> dict[str, int]:
    """file -> the rank its row gives it; a file named twice fails."""
    ranks: dict[str, int] = {}
    for stage, rank, files in rows:
        for name in files:
            assert name not in ranks, f"{name} is named twice (again in {stage!r})"
            ranks[name] = rank
    return ranks


def package_files() -> set[str]:
    """Every module of the package as the table names it (``folder/file.py``), but the
    package's own ``__init__.py`` (no stage: it re-exports the public API)."""
    files = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    return files - {"__init__.py"}


def stage_of(name: str) -> str:
    """``codegen/steps.py`` -> ``codegen``, ``layer.py`` -> ``layer`` (a key of STAGES)."""
    return name.split("/")[0].removesuffix(".py")


def table_problems(text: str) -> dict[str, object]:
    """What the stage table of page ``text`` gets wrong: the modules it leaves out, the
    files it names that do not exist, and file -> (its rank, STAGES' rank) where the
    two differ."""
    ranks = named_ranks(stage_table(text))
    files = package_files()
    misranked = {
        name: (rank, STAGES.get(stage_of(name)))
        for name, rank in ranks.items()
        if name in files and STAGES.get(stage_of(name)) != rank
    }
    return {
        "missing": sorted(files - set(ranks)),
        "stale": sorted(set(ranks) - files),
        "misranked": misranked,
    }


def test_the_stage_table_names_every_module_with_its_rank() -> None:
    assert table_problems(PAGE.read_text()) == {"missing": [], "stale": [], "misranked": {}}


def test_the_table_check_fails_on_a_missing_a_stale_or_a_misranked_module() -> None:
    text = PAGE.read_text()
    missing = table_problems(text.replace("`codegen/layout.py`, ", ""))
    assert missing["missing"] == ["codegen/layout.py"]
    stale = table_problems(text.replace("`definition.py`", "`definition.py`, `derivation.py`"))
    assert stale["stale"] == ["derivation.py"]
    misranked = table_problems(text.replace("| definition | 1 |", "| definition | 2 |"))
    assert misranked["misranked"] == {"definition.py": (2, 1)}


def test_every_file_the_page_names_exists() -> None:
    """A ``*.py`` name in backticks is a module of the package, or a file of the
    repository named from its root (``tests/...``, ``docs/...``)."""
    text = PAGE.read_text()
    names = set(re.findall(r"`([\w./]+\.py)`", text))
    missing = []
    for name in sorted(names):
        root = REPO if name.startswith(REPO_FOLDERS) else PACKAGE
        if not (root / name).is_file():
            missing.append(name)
    assert not missing, f"the page names files that do not exist: {missing}"


def test_the_page_is_self_contained() -> None:
    """No reference to text outside the repository (a design note, an issue)."""
    text = PAGE.read_text()
    assert not re.search(r"DESIGN|\bissues? #?\d+", text)


def _markdown_config():
    if not all(importlib.util.find_spec(m) for m in ("mkdocs", "pymdownx")):
        pytest.skip('needs the docs extra: pip install -e ".[docs]"')
    from mkdocs.config import load_config

    return load_config(str(REPO / "mkdocs.yml"))


def test_the_pipeline_diagram_renders_as_a_mermaid_block() -> None:
    """The page through the docs' own Markdown extensions (as ``mkdocs build`` renders
    it): the ```mermaid fence becomes a <div class="mermaid"> with the connection stage
    in it, and the site loads Mermaid and the script that starts it."""
    import markdown

    config = _markdown_config()
    html = markdown.Markdown(
        extensions=config["markdown_extensions"], extension_configs=config["mdx_configs"]
    ).convert(PAGE.read_text())
    blocks = re.findall(r'<div class="mermaid">(.*?)</div>', html, flags=re.S)
    assert len(blocks) == 1, "expected one Mermaid diagram"
    assert blocks[0].lstrip().startswith("flowchart")
    for box in ("connection stage", "codegen/", "binding_recurrent.py", "runtime/"):
        assert box in blocks[0]
    scripts = [str(s) for s in config["extra_javascript"]]
    assert any(re.search(r"/mermaid@\d+/dist/mermaid\.min\.js$", s) for s in scripts)
    assert "reference/mermaid.js" in scripts
    assert "mermaid.initialize" in (REPO / "docs" / "reference" / "mermaid.js").read_text()
