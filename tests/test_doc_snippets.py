"""Every Python snippet of README.md and docs/*.md runs, and prints what the text says.

The blocks of one page run in order in one namespace, as a reader would paste them.
Conventions (an HTML comment on the line right before the opening fence):

* ``<!-- snippet: needs X -->`` skips the block, and the page's later ones, where ``X``
  is missing: ``cuda`` (a CUDA device), ``torchrun`` (several processes launched by
  ``torchrun``), or the name of an importable module (an optional extra, e.g. ``nir``);
* ``<!-- snippet: skip REASON -->`` never runs the block.

A ``print(...)`` line whose comment ends in ``=> TEXT`` (``# the exact step => X``) must
print exactly ``TEXT``.
docs/architecture.md is left out: it shows the pipeline's stages, not user code.
"""

from __future__ import annotations

import builtins
import importlib.util
import io
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PAGES = [p for p in PAGES if p.name != "architecture.md"]
FENCE = re.compile(
    r"(?:<!-- snippet: (?P<kind>needs|skip) ?(?P<what>[^>]*?) -->\n)?"
    r"```python\n(?P<code>.*?)```",
    re.S,
)
EXPECT = re.compile(r"^\s*print\(.*#[^#]*?=>\s*(?P<text>.*?)\s*$")


def _missing(what: str) -> bool:
    if what == "cuda":
        return not torch.cuda.is_available()
    if what == "torchrun":
        return True
    return importlib.util.find_spec(what) is None


def blocks(page: Path) -> list[tuple[int, str, str, str]]:
    """(first line, kind, what, code) of each Python block of ``page``."""
    text = page.read_text()
    out = []
    for match in FENCE.finditer(text):
        line = text[: match.start("code")].count("\n") + 1
        out.append((line, match["kind"] or "", (match["what"] or "").strip(), match["code"]))
    return out


def test_blocks_are_found() -> None:
    found = {page.name: len(blocks(page)) for page in PAGES}
    assert found["README.md"] == 4 and found["user_guide.md"] >= 10, found


def _run(code: str, name: str, line: int, namespace: dict[str, Any]) -> list[tuple[int, str]]:
    """Run ``code`` (starting at ``line`` of ``name``) in ``namespace``; each print's
    (line, text)."""
    printed: list[tuple[int, str]] = []

    def recording_print(*args: Any, **kw: Any) -> None:
        buffer = io.StringIO()
        builtins.print(*args, **{**kw, "file": buffer})
        frame = sys._getframe(1)
        printed.append((frame.f_lineno, buffer.getvalue().rstrip("\n")))

    namespace["print"] = recording_print
    compiled = compile("\n" * (line - 1) + code, name, "exec")
    exec(compiled, namespace)
    return printed


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_snippets_run_and_print_what_the_text_says(page: Path, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace: dict[str, Any] = {"__name__": "__snippet__"}
    ran = 0
    for line, kind, what, code in blocks(page):
        if kind == "skip" or (kind == "needs" and _missing(what)):
            if kind == "needs":
                break  # the later blocks may read what this one made
            continue
        printed = dict(_run(code, str(page), line, namespace))
        ran += 1
        for offset, source in enumerate(code.splitlines()):
            expected = EXPECT.match(source)
            if expected:
                where = line + offset
                assert where in printed, f"{page.name}:{where} printed nothing"
                assert printed[where] == expected["text"], f"{page.name}:{where}"
    if not blocks(page):
        pytest.skip(f"{page.name} has no Python block")
    assert ran or any(kind for _, kind, _, _ in blocks(page))
