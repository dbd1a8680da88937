"""A griffe extension: the docstrings' reStructuredText markup as Markdown for MkDocs.

symneuron's docstrings are NumPy-style with Sphinx roles (``:class:`~symneuron.Neuron```,
``:func:`simulate```) and ``.. math::`` blocks, which mkdocstrings would show as raw text.
This rewrites them when griffe loads each object, before mkdocstrings renders it:

* a role becomes inline code of its target (``~`` keeps only the last name, as Sphinx
  does; ``text <target>`` keeps the text); ``:math:`x``` becomes ``$x$``;
* a ``.. math::`` directive and its indented body become a ``$$ ... $$`` block, which
  ``pymdownx.arithmatex`` (mkdocs.yml) hands to MathJax; rows with ``&`` or ``\\`` go in
  an ``aligned`` environment, as Sphinx puts them in ``split``.

Roles are not turned into links: many name private or relative targets that the
reference does not document, and the build is strict (an unresolved link fails it).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|data|attr|obj|exc|const):`([^`]+)`")
_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_TITLED = re.compile(r"^(.*?)\s*<([^>]+)>$")


def _role(match: re.Match[str]) -> str:
    target = match.group(2).strip()
    titled = _TITLED.match(target)
    if titled:
        return f"`{titled.group(1)}`"
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def _math_blocks(text: str) -> str:
    """``.. math::`` and its indented body (blank lines inside kept) -> ``$$`` block."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        head = re.match(r"^(\s*)\.\. math::\s*(.*)$", line)
        if not head:
            out.append(line)
            i += 1
            continue
        indent, first = head.group(1), head.group(2)
        body = [first] if first else []
        i += 1
        while i < len(lines) and (not lines[i].strip() or _deeper(lines[i], indent)):
            body.append(lines[i].strip())
            i += 1
        while body and not body[-1]:
            body.pop()
        trailing_blank = bool(i < len(lines))
        body = [b for b in body if b]
        if any("&" in b or b.endswith("\\\\") for b in body):  # rows: Sphinx's split
            body = ["\\begin{aligned}", *body, "\\end{aligned}"]
        out += [f"{indent}$$", *(f"{indent}{b}" for b in body), f"{indent}$$"]
        if trailing_blank:
            out.append("")
    return "\n".join(out)


def _deeper(line: str, indent: str) -> bool:
    return len(line) - len(line.lstrip()) > len(indent)


def markdown(text: str) -> str:
    """One docstring's reStructuredText roles and math directives as Markdown."""
    text = _math_blocks(text)
    text = _MATH_ROLE.sub(lambda m: f"${m.group(1)}$", text)
    return _ROLE.sub(_role, text)


class RstToMarkdown(griffe.Extension):
    """Rewrite every loaded object's docstring with :func:`markdown`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
