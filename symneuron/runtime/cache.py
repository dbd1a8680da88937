"""Where symneuron stores what it generates and compiles, how each entry is keyed, and
how a damaged entry is noticed and rebuilt.

Everything lives under one root, :func:`cache_dir`: ``$SYMNEURON_CACHE`` if set,
else ``~/.cache/symneuron``.

========================  ==========================================================
``generated/<h>.c|.cu``   generated kernel source of one kernel; ``<h>`` hashes the
                          neuron's key (:meth:`~symneuron.definition.Definition.key`),
                          the backend, the dtype, the kernel name and
                          :func:`generator_version`. A process that finds it never
                          runs SymPy (no derivation, no printing).
``generated/<h>.txt``     small derived facts (whether the backward reads X), keyed
                          the same way.
``cpu-<h>.so``            a compiled C library; ``<h>`` hashes the source.
``cuda-<h>.cubin``        a CUDA binary (cubin, or PTX where NVRTC does not know the
                          GPU); ``<h>`` hashes the source, the architecture, the
                          NVRTC options and NVRTC's version.
========================  ==========================================================

**Integrity.** Every file ends in a seal: a line holding the SHA-256 of the file's
name and content (:func:`seal`). A file is used only after its seal checks
(:func:`fetch`), so a truncated, emptied, overwritten or edited file, or two files
swapped, is never used: it is rebuilt once, with a warning. A compiled library is
loaded from a private copy of the checked bytes, never from the shared file.
Every file is written under a temporary name and renamed into place
(:func:`store`), so concurrent processes never see half a file.

**Hostile entries.** An entry is read up to its kind's limit (:data:`_LIMITS`), from a
regular file or a link within the root only: a longer file, a FIFO, a device or a link
leading out is damage, rebuilt with one warning. An empty directory in an entry's place
is removed; a non-empty one is named in one warning.

**An unwritable root** (read-only, a file, below a file, under ``/proc``): new entries
go to a private temporary directory, with one warning naming ``SYMNEURON_CACHE``; a
read-only root that is a directory is still read (a filled shared cache is used).

:func:`info` and :func:`clear` show and empty the cache (``symneuron cache info`` and
``symneuron cache clear`` on the command line).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import sympy as sp

from ..memo import BoundedTable

__all__ = [
    "BoundedTable",
    "cache_dir",
    "clear",
    "fetch",
    "generated",
    "generator_version",
    "info",
    "seal",
    "store",
    "unseal",
]

_SEAL = b"\n// symneuron sha256 "
_SEAL_LEN = len(_SEAL) + 64 + 1  # the marker, the hex digest, a newline
#: file name pattern (glob, relative to the root) -> kind reported by :func:`info`
_KINDS = {
    "generated/*.c": "generated source",
    "generated/*.cu": "generated source",
    "generated/*.txt": "generated facts",
    "cpu-*.so": "cpu library",
    "cuda-*.cubin": "cuda binary",
    "**/*.tmp": "partial write",
    "*.load": "partial write",
}
#: suffix -> the most bytes an entry of that kind may hold (read no further): generated
#: sources are at most a few hundred kB, libraries and CUDA binaries a few MB
_LIMITS = {".so": 64 << 20, ".cubin": 64 << 20, ".c": 16 << 20, ".cu": 16 << 20, ".txt": 1 << 20}
#: configured root -> the directory used for it in this process
_ROOTS: dict[str, Path] = {}
#: private directory -> the read-only root it stands in for (read where it lacks an entry)
_READ_ONLY: dict[Path, Path] = {}
#: (path, why) of each warning given (each is given once per process)
_WARNED: set[tuple[Path, str]] = set()


def seal(name: str, payload: bytes) -> bytes:
    """``payload`` followed by a line with the SHA-256 of ``name`` and ``payload``.

    Binding the name in makes a file copied or swapped onto another entry's name fail
    :func:`unseal`. A library stays loadable with the seal appended (loaders ignore bytes
    past the ELF image), though it is never loaded from the cache file itself.
    """
    digest = hashlib.sha256(name.encode() + b"\0" + payload).hexdigest().encode()
    return payload + _SEAL + digest + b"\n"


def unseal(name: str, data: bytes) -> bytes | None:
    """The payload of a sealed file named ``name``, or None if its seal does not check."""
    if len(data) < _SEAL_LEN or not data.endswith(b"\n"):
        return None
    payload, trailer = data[:-_SEAL_LEN], data[-_SEAL_LEN:]
    return payload if seal(name, payload)[-_SEAL_LEN:] == trailer else None


def _usable(root: Path) -> str | None:
    """Why ``root`` cannot hold the cache (None if it can): created, then written to."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=root, prefix=".probe-", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _private() -> Path:
    """A temporary directory of this process only, removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="symneuron-cache-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _configured() -> str:
    root = os.environ.get("SYMNEURON_CACHE")
    if root:
        return root
    try:
        return str(Path.home() / ".cache" / "symneuron")
    except RuntimeError:  # no home directory
        return ""


def _stand_in(configured: str, problem: str) -> Path:
    """A private directory standing in for the unwritable root ``configured`` (warned)."""
    found = _private()
    root = Path(configured)
    readable = bool(configured) and root.is_dir() and os.access(root, os.R_OK | os.X_OK)
    if readable:
        _READ_ONLY[found] = root
    reads = "reads the entries it holds, " if readable else ""
    warnings.warn(
        f"symneuron: the kernel cache {configured!r} cannot be written ({problem}); this "
        f"process {reads}caches new kernels in {found} and compiles them again next time. "
        "Set SYMNEURON_CACHE to a writable directory.",
        RuntimeWarning,
        stacklevel=3,
    )
    return found


def cache_dir() -> Path:
    """The cache root in use: ``$SYMNEURON_CACHE`` or ``~/.cache/symneuron``, created if
    missing; a private temporary directory (:func:`_stand_in`) when it is unwritable."""
    configured = _configured()
    found = _ROOTS.get(configured)
    if found is None:
        problem = _usable(Path(configured)) if configured else "no home directory"
        found = Path(configured) if problem is None else _stand_in(configured, problem)
        _ROOTS[configured] = found
    return found


@functools.lru_cache(maxsize=1)
def generator_version() -> str:
    """Hash of symneuron's own sources and SymPy's version.

    Either can change the generated code of an unchanged neuron definition, so the
    generated text is keyed by it as well.
    """
    digest = hashlib.sha256(sp.__version__.encode())
    root = Path(__file__).parents[1]
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file of its own and a rename."""
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the file from a shared cache's users
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def store(path: Path, payload: bytes) -> bool:
    """Seal ``payload`` and write it to ``path`` atomically; False (and no error) when
    the file cannot be written: the cache only saves time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, seal(path.name, payload))
    except OSError:
        return False
    return True


def damaged(path: Path, why: str) -> None:
    """Warn (once per process) that the cached ``path`` is not used (``why``), rebuilt."""
    if (path, why) not in _WARNED:
        _WARNED.add((path, why))
        warnings.warn(
            f"symneuron: the cached file {path} is damaged ({why}); rebuilding it.",
            RuntimeWarning,
            stacklevel=3,
        )


def _check_kind(path: Path, mode: int) -> None:
    """ValueError unless ``mode`` is a regular file's; an empty directory is removed."""
    if stat.S_ISDIR(mode):
        try:
            path.rmdir()
        except OSError:
            why = f"a directory: remove it (rm -r {path}) or every process builds it"
            raise ValueError(why) from None
        raise ValueError("an empty directory, now removed")
    if not stat.S_ISREG(mode):
        raise ValueError("not a regular file")


def _read(path: Path, root: Path) -> bytes:
    """The bytes of the entry ``path`` under ``root``: at most its kind's limit, from a
    regular file that is ``path`` or a link within ``root`` (else ValueError saying why)."""
    limit = _LIMITS.get(path.suffix, 16 << 20)
    target = os.path.realpath(path)
    if not Path(target).is_relative_to(os.path.realpath(root)):
        raise ValueError(f"a link to {target}, outside the cache")
    _check_kind(path, os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block
    with os.fdopen(fd, "rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"longer than any entry of its kind ({limit} bytes)")
    return data


def fetch(path: Path) -> bytes | None:
    """The checked payload of the cached ``path``; None when it is absent, and None with a
    warning when it is unreadable or fails its seal (the caller rebuilds it). An entry
    the private stand-in of a read-only root lacks is read from that root."""
    root = next((r for r in (path.parent, path.parent.parent) if r in _READ_ONLY), None)
    if root is not None and not os.path.lexists(path):
        path, root = _READ_ONLY[root] / path.relative_to(root), _READ_ONLY[root]
    try:
        data = _read(path, root or cache_dir())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        damaged(path, str(exc) if isinstance(exc, ValueError) else f"unreadable: {exc}")
        return None
    payload = unseal(path.name, data)
    if payload is None:
        damaged(path, "its content does not match its seal")
    return payload


def generated(
    parts: tuple[str, ...],
    suffix: str,
    make: Callable[[], str],
    valid: Callable[[str], bool] | None = None,
) -> str:
    """Text generated from a neuron, cached under ``cache_dir()/generated``.

    ``parts`` identify it (with :func:`generator_version`); ``make`` produces it on a
    miss, or when the cached file fails its seal or ``valid``.
    """
    name = hashlib.sha256("\0".join((generator_version(), *parts)).encode()).hexdigest()[:32]
    path = cache_dir() / "generated" / f"{name}{suffix}"
    payload = fetch(path)
    if payload is not None:
        text = payload.decode(errors="replace")
        if valid is None or valid(text):
            return text
        damaged(path, "its content is not valid")
    text = make()
    store(path, text.encode())
    return text


def _files() -> dict[Path, str]:
    """Each file of the cache root in use -> its kind."""
    root = cache_dir()
    found: dict[Path, str] = {}
    for pattern, kind in _KINDS.items():
        for path in root.glob(pattern):
            if path.is_file() and not path.is_symlink():
                found.setdefault(path, kind)
    return found


def info() -> dict[str, object]:
    """What the cache holds.

    Returns
    -------
    dict
        ``path`` (the root in use, str), ``files`` (count), ``bytes`` (total size) and
        ``kinds``: kind name (generated source, generated facts, cpu library, cuda
        binary, partial write) -> ``{"files": n, "bytes": b}`` for the kinds present.

    Examples
    --------
    >>> from symneuron.runtime import cache
    >>> sorted(cache.info())
    ['bytes', 'files', 'kinds', 'path']
    """
    kinds: dict[str, dict[str, int]] = {}  # kind -> {"files": n, "bytes": b}
    for path, kind in _files().items():
        try:
            size = path.stat().st_size
        except OSError:
            continue
        entry = kinds.setdefault(kind, {"files": 0, "bytes": 0})
        entry["files"] += 1
        entry["bytes"] += size
    return {
        "path": str(cache_dir()),
        "files": sum(e["files"] for e in kinds.values()),
        "bytes": sum(e["bytes"] for e in kinds.values()),
        "kinds": kinds,
    }


def clear() -> int:
    """Remove every file symneuron wrote to the cache root in use; returns how many.

    Only symneuron's own files are removed (the patterns listed in this module's
    table), never anything else under the root. Kernels loaded in running processes
    stay loaded; later processes generate and compile afresh.

    Examples
    --------
    >>> from symneuron.runtime import cache
    >>> removed = cache.clear()
    """
    removed = 0
    for path in _files():
        with contextlib.suppress(OSError):
            path.unlink()
            removed += 1
    return removed
