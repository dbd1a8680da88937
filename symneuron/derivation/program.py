"""The step body as a short program: named lines after common-subexpression elimination.

A :class:`Block` is what the code generators print: temporaries and named intermediate
values (an integrator's stages, their adjoints), each after the lines it reads, then
one line per target. :func:`cse_block` makes one from targets alone, :func:`program`
from targets and named values that read each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property

import sympy as sp

__all__ = ["Assign", "Block", "cse_block", "program", "blocks"]


@dataclass(frozen=True)
class Assign:
    """``target = expr``: one line of a step body."""

    target: sp.Symbol
    expr: sp.Expr


@dataclass(frozen=True)
class Block:
    """The lines of one CSE'd block: temporaries first, then one line per target.

    Iterating gives the lines; :attr:`targets` names what the block computes and
    :attr:`reads` what it uses from outside itself.
    """

    lines: tuple[Assign, ...] = ()
    targets: tuple[sp.Symbol, ...] = ()

    def __iter__(self) -> Iterator[Assign]:
        return iter(self.lines)

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int) -> Assign:
        return self.lines[i]

    @cached_property
    def reads(self) -> frozenset[sp.Symbol]:
        """The symbols the block's expressions use that no line of it defines."""
        used = set().union(*(line.expr.free_symbols for line in self.lines))
        return frozenset(used - {line.target for line in self.lines})


#: (symbol, expression) pairs: the lines to compute, in order.
Pairs = list[tuple[sp.Symbol, sp.Expr]]


def cse_block(targets: Pairs, prefix: str) -> Block:
    """The targets after one CSE: temporaries ``<prefix><i>`` first, then one line each."""
    if not targets:
        return Block()
    symbols = sp.numbered_symbols(prefix, real=True)
    temps, reduced = sp.cse([e for _, e in targets], symbols=symbols, optimizations="basic")
    lines = [Assign(t, e) for t, e in temps]
    lines += [Assign(target, e) for (target, _), e in zip(targets, reduced, strict=True)]
    return Block(tuple(lines), tuple(target for target, _ in targets))


def program(
    named: Pairs,
    targets: Pairs,
    prefix: str,
    keep: bool = False,
) -> Block:
    """A CSE'd block that also computes ``named`` intermediate values (stages, adjoints),
    each reading earlier ones: one CSE over all expressions, then every line after the
    lines it reads. Named values no target needs are left out, unless ``keep`` (later
    blocks read them)."""
    exprs = [e for _, e in [*named, *targets]]
    temps, reduced = sp.cse(
        exprs, symbols=sp.numbered_symbols(prefix, real=True), optimizations="basic"
    )
    value = {**dict(temps), **{z: e for (z, _), e in zip(named, reduced, strict=False)}}
    rank = {z: i for i, z in enumerate([*(t for t, _ in temps), *(z for z, _ in named)])}
    lines: list[Assign] = []
    done: set[sp.Symbol] = set()

    def emit(expr: sp.Expr) -> None:
        """The lines ``expr`` reads, each after its own (depth first, in a fixed order)."""
        stack = [(z, False) for z in sorted(expr.free_symbols & value.keys(), key=rank.__getitem__)]
        stack.reverse()
        while stack:
            z, ready = stack.pop()
            if z in done:
                continue
            if ready:
                done.add(z)
                lines.append(Assign(z, value[z]))
                continue
            stack.append((z, True))
            deps = sorted(value[z].free_symbols & value.keys() - done, key=rank.__getitem__)
            stack.extend((d, False) for d in reversed(deps))

    for z in [z for z, _ in named] if keep else []:
        emit(z)
    for (target, _), e in zip(targets, reduced[len(named) :], strict=True):
        emit(e)
        lines.append(Assign(target, e))
    return Block(tuple(lines), tuple(target for target, _ in targets))


def blocks(
    stages: Pairs, charge: tuple[sp.Symbol, sp.Expr], targets: Pairs, adjoints: Iterable[Assign]
) -> tuple[Block, Block]:
    """The charge and backward blocks of a step map: without stages, one CSE each; with
    stages, the charge block computes all of them first (the updates block reads them
    too), and the backward recomputes those its partials read, then names each stage's
    adjoint (``adjoints``, in the order :func:`~symneuron.derivation.transpose` gives)."""
    if not stages:
        return cse_block([charge], "c"), cse_block(targets, "b")
    forward = program(stages, [charge], "c", keep=True)
    return forward, program([*stages, *((a.target, a.expr) for a in adjoints)], targets, "b")
