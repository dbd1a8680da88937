"""Hostile cache entries (issue 25, item 10): endless files, links leading out of the
cache, directories in an entry's place; and a filled read-only cache, which is read."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import symneuron as sn
import symneuron.derivation
from symneuron.runtime import cache, cpu, cuda, kernels

pytestmark = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")

#: LIF on three steps of 1.5: H = 0.75, 1.125 (fires), 0.75
X = torch.full((3, 2), 1.5, dtype=torch.float64)
SPIKES = [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]


def _forget() -> None:
    """Empty the process's tables, so that the next run reads the disk cache again."""
    kernels._PROGRAMS.clear()
    cpu._LIBRARIES.clear()
    cuda._MODULES.clear()


def _spikes() -> list[list[float]]:
    return sn.simulate(sn.models.LIF(), X, backend="cpu")[0].tolist()


@pytest.fixture
def filled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache root (SYMNEURON_CACHE) filled by one cpu run of LIF; the tables emptied."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SYMNEURON_CACHE", str(root))
    _forget()
    assert _spikes() == SPIKES
    _forget()
    assert len(list(root.glob("cpu-*.so"))) == 1 and len(list(root.glob("generated/*.c"))) == 1
    yield root
    _forget()


def _entries(root: Path) -> list[Path]:
    return [*root.glob("cpu-*.so"), *root.glob("generated/*.c")]


# Runs LIF on the cpu backend in a fresh process whose memory is capped at 3 GiB: reading
# an endless entry whole (4 GiB of /dev/zero) fails it rather than the machine.
FRESH = textwrap.dedent(
    """
    import torch, symneuron as sn
    x = torch.full((3, 2), 1.5, dtype=torch.float64)
    print(sn.simulate(sn.models.LIF(), x, backend="cpu")[0].tolist())
    """
)


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


@pytest.mark.slow  # a fresh Python process
def test_endless_and_blocking_entries_are_rebuilt_without_reading_them(filled: Path) -> None:
    library, source = _entries(filled)
    library.unlink()
    library.symlink_to("/dev/zero")  # endless, and outside the cache
    source.unlink()
    os.mkfifo(source)  # opening it for reading would wait for a writer
    env = {**os.environ, "PYTHONPATH": str(Path(sn.__file__).parents[1])}
    proc = subprocess.run(
        [sys.executable, "-c", FRESH],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_capped,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(SPIKES)
    assert f"{library} is damaged (a link to /dev/zero, outside the cache)" in proc.stderr
    assert f"{source} is damaged (not a regular file)" in proc.stderr
    assert proc.stderr.count("damaged") == 2, proc.stderr
    for path in (library, source):  # healed: a sealed regular file in the link's place
        assert path.is_file() and not path.is_symlink()
        assert cache.unseal(path.name, path.read_bytes()) is not None


def test_link_leading_out_of_the_cache_is_not_followed(filled: Path, tmp_path: Path) -> None:
    for entry in _entries(filled):
        outside = tmp_path / f"outside-{entry.name}"
        outside.write_bytes(entry.read_bytes())  # a valid, sealed copy: still not used
        entry.unlink()
        entry.symlink_to(outside)
    with pytest.warns(RuntimeWarning, match="outside the cache") as caught:
        assert _spikes() == SPIKES
    assert len([w for w in caught if "outside the cache" in str(w.message)]) == 2
    assert all(not entry.is_symlink() for entry in _entries(filled))


def test_link_within_the_cache_is_followed(filled: Path) -> None:
    library = _entries(filled)[0]
    moved = filled / "kept" / library.name
    moved.parent.mkdir()
    library.rename(moved)
    library.symlink_to(moved)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _spikes() == SPIKES
    assert library.is_symlink()


def test_entry_longer_than_its_kind_allows_is_damage(filled: Path) -> None:
    source = _entries(filled)[1]
    source.write_bytes(b" " * (cache._LIMITS[".c"] + 1))
    with pytest.warns(RuntimeWarning, match=r"longer than any entry of its kind \(16777216 bytes"):
        assert _spikes() == SPIKES
    assert cache.unseal(source.name, source.read_bytes()) is not None


def test_directory_in_an_entry_place_is_removed_or_named_once(filled: Path) -> None:
    library, source = _entries(filled)
    library.unlink()
    library.mkdir()  # empty: removed, and the library rebuilt in its place
    source.unlink()
    source.mkdir()
    (source / "notes").write_text("someone's file")  # not empty: left alone, named
    with pytest.warns(RuntimeWarning) as caught:
        assert _spikes() == SPIKES
    messages = [str(w.message) for w in caught]
    assert any("an empty directory, now removed" in m for m in messages), messages
    assert any(f"rm -r {source}" in m for m in messages), messages
    assert library.is_file() and (source / "notes").is_file()
    _forget()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the directory was named once in this process
        assert _spikes() == SPIKES


def _lock(root: Path) -> bool:
    """Make ``root`` and its subdirectories unwritable; False if this machine cannot."""
    folders = [root, *[p for p in root.rglob("*") if p.is_dir()]]
    for folder in folders:
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
            if os.geteuid() == 0:
                return False  # root ignores modes
            folder.chmod(0o500)
    return True


def _unlock(root: Path) -> None:
    for folder in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
        folder.chmod(0o700)


def test_filled_read_only_cache_is_read_not_rebuilt(
    filled: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _lock(filled):
        pytest.skip("chattr +i is not permitted here and root ignores modes")
    try:

        def refuse(*args: object) -> None:
            raise AssertionError("derived or compiled although the read-only cache has it")

        monkeypatch.setattr(symneuron.derivation, "derive", refuse)
        monkeypatch.setattr(cpu, "_build", refuse)
        cache._ROOTS.pop(str(filled), None)
        with pytest.warns(RuntimeWarning, match="reads the entries it holds") as caught:
            assert _spikes() == SPIKES
        assert len(caught) == 1, [str(w.message) for w in caught]
        assert cache.cache_dir() != filled
    finally:
        _unlock(filled)
        cache._ROOTS.pop(str(filled), None)
