"""``benchmarks/`` imports without circles: shared tables live in ``core.py``, and no
program imports another that imports it back (at module level or inside a function)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
MODULES = sorted(p.stem for p in BENCH.glob("*.py"))


def sibling_imports(name: str) -> set[str]:
    """The benchmarks modules ``name`` imports anywhere in its text."""
    tree = ast.parse((BENCH / f"{name}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return (found & set(MODULES)) - {name}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (``[a, b, a]``), or None."""
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return path[path.index(name) :] + [name]
        if name in done:
            return None
        for dep in sorted(graph[name]):
            circle = visit(dep, [*path, name])
            if circle:
                return circle
        done.add(name)
        return None

    for name in sorted(graph):
        circle = visit(name, [])
        if circle:
            return circle
    return None


def test_find_circle_finds_one() -> None:
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) is None


def test_benchmarks_import_no_circle() -> None:
    graph = {name: sibling_imports(name) for name in MODULES}
    assert find_circle(graph) is None, f"import circle: {' -> '.join(find_circle(graph) or [])}"


@pytest.mark.parametrize("name", ["core", "peers", "report", "profile_ncu", "bench_neurons"])
def test_each_module_imports_first(name: str) -> None:
    """Imported first in a fresh interpreter (where a circle breaks), each module loads."""
    code = f"import {name}; print({name}.__name__)"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCH, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == name
