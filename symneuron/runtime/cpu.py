"""The cpu runtime: the system C compiler -> shared library -> ctypes.

The compiler is ``$CC`` when set (it may carry arguments: ``CC="ccache gcc"``), else
the first of cc, gcc and clang on ``PATH``; it is tried once per process on a small
library (:func:`problem`). Compiled libraries are cached sealed on disk
(:mod:`~symneuron.runtime.cache`) and loaded from a private copy of bytes whose seal
was checked: a damaged cached library is rebuilt, never loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

from ..memo import BoundedTable, constant_result
from ..signature import Geometry
from . import cache

__all__ = ["compiler", "available", "problem", "load", "launcher"]

# -fno-trapping-math: no FP exception flag is ever read, so compares and selects may be
# if-converted and the lane loops vectorised (10x on LIF); values stay IEEE (no
# reassociation, signed zeros and NaN kept: fast-math stays off). -O2: the kernels ran
# as fast as with -O3 (LIF, EIF, Izhikevich, both passes) and compile in half the time.
# -fno-math-errno: errno is never read, so sqrt is one instruction and a lane loop of
# random draws vectorises (a noisy LIF's backward that reads its draws: 6.8x -> 2.9x the
# noiseless LIF's time, T = 8, N = 4096); sqrt is correctly rounded either way.
_BASE_FLAGS = (
    "-O2",
    "-std=c99",
    "-shared",
    "-fPIC",
    "-fno-fast-math",
    "-fno-trapping-math",
    "-fno-math-errno",
)
_CTYPES = {"P": ctypes.c_void_p, "q": ctypes.c_longlong, "i": ctypes.c_int, "d": ctypes.c_double}
#: source hash -> loaded library (loaded libraries stay mapped; the table is bounded)
_LIBRARIES: BoundedTable[str, ctypes.CDLL] = BoundedTable(256, "runtime.cpu.libraries")
_LOADS = itertools.count()
_FIX = (
    "Install gcc or clang (e.g. `apt install gcc`), or set CC to a working C compiler, "
    "or use backend='torch'."
)


@lru_cache(maxsize=1)
def _command() -> tuple[str, ...] | None:
    """The compiler command: ``$CC`` split into words when set, else cc, gcc or clang."""
    given = os.environ.get("CC", "").strip()
    if given:
        words = shlex.split(given)
        path = shutil.which(words[0])
        return None if path is None else (path, *words[1:])
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return (path,)
    return None


def compiler() -> str | None:
    """Path of the C compiler (``$CC`` if set, else cc, gcc or clang), or None."""
    command = _command()
    return None if command is None else command[0]


def _run(command: list[str]) -> str | None:
    """Run a compiler command: None when it succeeds, else what went wrong."""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if proc.returncode == 0:
        return None
    output = (proc.stderr or proc.stdout).strip()
    said = f"output:\n{output[-4000:]}" if output else "no output"
    return f"exit status {proc.returncode}, {said}"


@lru_cache(maxsize=1)
def _probe() -> tuple[tuple[str, ...] | None, str]:
    """(compiler flags, "") when the compiler builds a small library (with OpenMP if it
    can), else (None, the error message naming the fix)."""
    command = _command()
    if command is None:
        given = os.environ.get("CC", "").strip()
        where = (
            f"CC={given!r} is not found on PATH"
            if given
            else "CC is unset and no cc, gcc or clang is on PATH"
        )
        return None, f"The cpu backend needs a C compiler and found none ({where}). {_FIX}"
    error = "not run"
    with tempfile.TemporaryDirectory(dir=cache.cache_dir(), prefix="build-") as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text("int sn_probe(void) { return 0; }\n")
        for extra in (("-fopenmp",), ()):
            flags = _BASE_FLAGS + extra
            error = _run([*command, *flags, str(src), "-o", str(Path(tmp) / "probe.so")]) or ""
            if not error:
                return flags, ""
    shown = " ".join(command)
    return None, (
        f"The C compiler {shown!r} does not work: building a test library failed ({error}). {_FIX}"
    )


def problem() -> str | None:
    """Why the cpu backend cannot compile here (the error message), or None if it can."""
    flags, error = _probe()
    return None if flags is not None else error


@constant_result
def available() -> bool:
    """Whether a working C compiler was found (see :func:`problem`)."""
    return problem() is None


def _build(source: str) -> bytes:
    """Compile ``source`` into a shared library; its bytes."""
    flags, error = _probe()
    command = _command()
    if flags is None or command is None:
        raise RuntimeError(error)
    with tempfile.TemporaryDirectory(dir=cache.cache_dir(), prefix="build-") as tmp:
        src = Path(tmp) / "kernel.c"
        src.write_text(source)
        out = Path(tmp) / "kernel.so"
        failed = _run([*command, *flags, str(src), "-o", str(out), "-lm"])
        if failed is not None:
            raise RuntimeError(
                f"C compilation of generated kernels failed with {command[0]!r} ({failed}). "
                "If that compiler works otherwise, please report this as a symneuron bug; "
                "backend='torch' runs without a compiler."
            )
        return out.read_bytes()


def _open(payload: bytes, target: Path) -> ctypes.CDLL:
    """Load ``payload`` from a private file of its own (a name never used before in this
    process, so the loader cannot hand back an earlier library), then unlink it."""
    path = target.with_name(f"{target.stem}.{os.getpid()}.{next(_LOADS)}.load")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
        return ctypes.CDLL(str(path))
    finally:
        path.unlink(missing_ok=True)


def _load(source: str, target: Path) -> ctypes.CDLL:
    """The library of ``source``: the cached ``target`` if its seal checks and it loads,
    else built (once), stored and loaded."""
    payload = cache.fetch(target)
    if payload is not None:
        try:
            return _open(payload, target)
        except OSError as exc:
            cache.damaged(target, f"it does not load: {exc}")
    payload = _build(source)
    cache.store(target, payload)
    try:
        return _open(payload, target)
    except OSError as exc:
        raise RuntimeError(
            f"symneuron: a freshly compiled kernel library does not load ({exc}). Check that "
            f"{target.parent} is on a file system that allows executable mappings (set "
            "SYMNEURON_CACHE elsewhere), or use backend='torch'."
        ) from exc


def load(source: str, device: int = -1) -> ctypes.CDLL:
    """Compile ``source`` (cached in memory and on disk by its hash) and load it.
    ``device`` is unused (the signature is shared with the cuda runtime)."""
    key = hashlib.sha256(source.encode()).hexdigest()[:32]
    library = _LIBRARIES.get(key)
    if library is None:
        library = _LIBRARIES.put(key, _load(source, cache.cache_dir() / f"cpu-{key}.so"))
    return library


Launch = Callable[[str, Sequence[float], Geometry | None], None]


def launcher(library: ctypes.CDLL, name: str, device: int = -1) -> Launch:
    """``launch(kinds, values, geometry)`` for kernel ``name``: ``kinds`` are the values'
    :data:`~symneuron.runtime.Kinds` characters; one call runs every neuron (the
    geometry is the GPU's concern; the neuron count is among the values)."""
    fn = getattr(library, name)
    fn.restype = None

    def launch(kinds: str, values: Sequence[float], geometry: Geometry | None) -> None:
        if fn.argtypes is None:  # a kernel's argument kinds never change: set them once
            fn.argtypes = tuple(_CTYPES[kind] for kind in kinds)
        fn(*values)

    return launch
