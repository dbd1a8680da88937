"""The one kind of process-wide cache: a bounded table.

Every table symneuron keeps for the life of a process (derived specs, programs,
loaded libraries and modules, dtype rows, parameter scalars, the warnings already
given) is a :class:`BoundedTable`, so each has a bound, forgets its oldest entries
beyond it, and can be listed and cleared in one place (:data:`TABLES`, :func:`clear`).
A function whose results are kept is decorated with :func:`memoized`; one whose result
``torch.compile`` keeps as a constant, with :func:`constant_result`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from functools import wraps
from typing import Any, Generic, TypeVar

import torch

__all__ = ["BoundedTable", "TABLES", "clear", "memoized", "constant_result", "CONSTANT_MARK"]

K = TypeVar("K")
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])

#: name -> every table made in this process (for :func:`clear` and inspection)
TABLES: dict[str, BoundedTable[Any, Any]] = {}


class BoundedTable(Generic[K, T]):
    """A dict of at most ``bound`` entries that forgets the oldest stored one.

    Reads are a plain dict look-up (host time: some tables are read several times per
    kernel call), so they do not reorder: the entry stored first goes first. Every
    entry can be rebuilt, so forgetting one costs time, never a result. Writes take a
    lock.

    Parameters
    ----------
    bound : int
        Most entries kept.
    name : str, optional
        Registers the table in :data:`TABLES` under this name.
    """

    def __init__(self, bound: int, name: str | None = None) -> None:
        self.bound = bound
        self._items: dict[K, T] = {}
        self._lock = threading.Lock()
        if name is not None:
            TABLES[name] = self

    def get(self, key: K) -> T | None:
        """The value of ``key``, or None."""
        return self._items.get(key)

    def put(self, key: K, value: T) -> T:
        """Store ``value`` under ``key`` (now the newest), forgetting the oldest entries
        beyond the bound; returns ``value``. Inside ``torch.compile`` tracing nothing is
        stored (Dynamo cannot enter the lock; the next eager call stores it)."""
        if torch.compiler.is_compiling():
            return value
        with self._lock:
            self._items.pop(key, None)
            self._items[key] = value
            while len(self._items) > self.bound:
                del self._items[next(iter(self._items))]
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._items.clear()


def clear() -> None:
    """Empty every registered table (the next use rebuilds what it needs)."""
    for table in TABLES.values():
        table.clear()


def memoized(bound: int, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Keep a function's results in a :class:`BoundedTable` keyed by its (hashable)
    positional arguments; the table is the wrapper's ``table`` attribute."""

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        table: BoundedTable[tuple[Hashable, ...], T] = BoundedTable(bound, name)

        @wraps(fn)
        def wrapper(*args: Hashable) -> T:
            found = table.get(args)
            if found is None:
                found = table.put(args, fn(*args))
            return found

        wrapper.table = table  # type: ignore[attr-defined]
        return wrapper

    return decorate


#: the attribute ``torch._dynamo.assume_constant_result`` sets (tests/test_import_time.py
#: checks that torch still marks a function with it and nothing else)
CONSTANT_MARK = "_dynamo_marked_constant"


def constant_result(fn: F) -> F:
    """Mark ``fn`` as ``torch.compiler.assume_constant_result`` does, without importing
    ``torch._dynamo`` (which loads AOTAutograd, FX passes and inductor's config: most of
    what ``import symneuron`` would cost beyond ``import torch, sympy``): compilation
    calls it eagerly while tracing and keeps its result as a constant (host-side probes,
    such as "is a C compiler installed"; work SymPy does, which Dynamo cannot trace).

    Examples
    --------
    >>> from symneuron.memo import constant_result
    >>> @constant_result
    ... def probe() -> bool:
    ...     return True
    >>> probe._dynamo_marked_constant
    True
    """
    setattr(fn, CONSTANT_MARK, True)
    return fn
