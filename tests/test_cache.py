"""The on-disk cache of generated text: a warm process runs without SymPy derivation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import symneuron as sn
from symneuron.definition import Definition, V, X
from symneuron.runtime import cache, cpu, cuda, kernels

pytestmark = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")

# Runs LIF with a learnable tau and PLIF (whose backward reads X) on the cpu backend and
# prints their outputs and gradients; with WARM=1, Neuron.spec raises, so everything must
# come from the disk cache the first run left.
SCRIPT = textwrap.dedent(
    """
    import os, torch, symneuron as sn
    if os.environ.get("WARM") == "1":
        import symneuron.derivation
        def no_derivation(neuron):
            raise AssertionError("derived although the cache was warm")
        symneuron.derivation.derive = no_derivation
    torch.manual_seed(3)
    x = (torch.rand(6, 4, 5, dtype=torch.float64) * 1.5).requires_grad_()
    tau = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    w = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    s1, v1 = sn.simulate(sn.models.LIF(learnable=["tau"]), x, params={"tau": tau}, backend="cpu")
    s2, v2 = sn.simulate(sn.models.PLIF(), x, params={"w": w}, backend="cpu")
    ((s1 * 1.3).sum() + v1.sum() + (s2 * 0.7).sum() + v2.pow(2).sum()).backward()
    torch.save([s1, v1, s2, v2, x.grad, tau.grad, w.grad], os.environ["OUT"])
    """
)


def _run(tmp_path: Path, warm: bool) -> list[torch.Tensor]:
    out = tmp_path / f"out{int(warm)}.pt"
    env = {
        **os.environ,
        "SYMNEURON_CACHE": str(tmp_path / "cache"),
        "WARM": str(int(warm)),
        "OUT": str(out),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(sn.__file__).parents[1])])),
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out)


@pytest.mark.slow  # two fresh Python processes, each compiling or loading four kernels
def test_warm_cache_skips_derivation_and_gives_the_same_results(tmp_path: Path) -> None:
    cold = _run(tmp_path, warm=False)
    generated = sorted(p.suffix for p in (tmp_path / "cache" / "generated").iterdir())
    assert generated.count(".c") == 4  # LIF and PLIF: forward and backward kernels
    assert generated.count(".txt") == 2  # needs_x per neuron
    warm = _run(tmp_path, warm=True)
    assert all(a.dtype == torch.float64 for a in cold)
    assert cold[4].abs().sum() > 0 and cold[5] != 0 and cold[6] != 0  # gradients flowed
    for a, b in zip(cold, warm, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_generated_text_is_keyed_by_definition_and_generator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []

    def make(text: str):  # noqa: ANN202
        return lambda: made.append(text) or text

    monkeypatch.setenv("SYMNEURON_CACHE", str(tmp_path))
    assert cache.generated(("a", "b"), ".c", make("one")) == "one"
    assert cache.generated(("a", "b"), ".c", make("two")) == "one"  # cached
    assert cache.generated(("a", "c"), ".c", make("three")) == "three"  # other key
    assert made == ["one", "three"]
    cache.generator_version.cache_clear()
    version = cache.generator_version()
    assert len(version) == 16 and version == cache.generator_version()


def test_unwritable_cache_is_bypassed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("SYMNEURON_CACHE", str(blocker / "cache"))
    with pytest.warns(RuntimeWarning, match="SYMNEURON_CACHE"):
        assert cache.generated(("x",), ".c", lambda: "made") == "made"


# -- damage: every cached artefact is checked before use and rebuilt once ----------------

#: (neuron, learnable param) run by :func:`_run_pair`: LIF's backward does not read X,
#: PLIF's does, so their needs-X flags differ ("0" and "1") and swapping them would
#: hand PLIF's backward a NULL X.
PAIR = (("LIF", "tau"), ("PLIF", "w"))
#: kind of artefact -> glob under the cache root (two or more files of each after a run)
KINDS = {"source": "generated/*.c", "flag": "generated/*.txt", "library": "cpu-*.so"}


def _forget() -> None:
    """Empty the process's tables, so that the next run reads the disk cache again."""
    kernels._PROGRAMS.clear()
    cpu._LIBRARIES.clear()
    cuda._MODULES.clear()


def _run_pair(backend: str = "cpu") -> list[torch.Tensor]:
    """Outputs and gradients of LIF (learnable tau) and PLIF (learnable w) on seeded input."""
    gen = torch.Generator().manual_seed(11)
    x = torch.rand(6, 4, 5, generator=gen, dtype=torch.float64) * 1.5
    x = x.to("cuda" if backend == "cuda" else "cpu").requires_grad_()
    out: list[torch.Tensor] = []
    loss = torch.zeros((), dtype=torch.float64, device=x.device)
    leaves = []
    for model, name in PAIR:
        value = torch.tensor(2.5 if name == "tau" else 0.3, dtype=torch.float64, device=x.device)
        value.requires_grad_()
        neuron = sn.models.ZOO[model](learnable=[name])
        s, v = sn.simulate(neuron, x, params={name: value}, backend=backend)
        loss = loss + (s * 1.3).sum() + v.pow(2).sum()
        out += [s.detach(), v.detach()]
        leaves.append(value)
    loss.backward()
    grads = [x.grad, *(leaf.grad for leaf in leaves)]
    return [t.cpu() for t in [*out, *grads]]  # type: ignore[union-attr]


def _damage(kind: str, how: str, files: list[Path]) -> list[Path]:
    """Apply damage ``how`` to the first file of ``files`` (and the second, for a swap)."""
    first, second = files[0], files[1]
    data = first.read_bytes()
    if how == "swap":
        other = second.read_bytes()
        first.write_bytes(other)
        second.write_bytes(data)
        return [first, second]
    if how == "truncate":
        data = data[: len(data) // 2]
    elif how == "empty":
        data = b""
    elif how == "random":
        gen = torch.Generator().manual_seed(len(data))
        data = bytes(torch.randint(0, 256, (len(data),), generator=gen, dtype=torch.uint8))
    else:  # one character: the first digit, changed (a flag "0" <-> "1", a constant)
        at = next(i for i, byte in enumerate(data) if chr(byte).isdigit())
        data = data[:at] + str((int(chr(data[at])) + 1) % 10).encode() + data[at + 1 :]
    first.write_bytes(data)
    return [first]


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[torch.Tensor]]:
    """A cache filled by one cpu run of the pair, and that run's results (checked
    against the torch reference)."""
    root = tmp_path_factory.mktemp("warm") / "cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SYMNEURON_CACHE", str(root))
        _forget()
        results = _run_pair()
        _forget()
    for got, want in zip(results, _run_pair("torch"), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    for kind, pattern in KINDS.items():
        assert len(list(root.glob(pattern))) >= 2, kind
    return root, results


@pytest.mark.parametrize("how", ["truncate", "empty", "random", "one character", "swap"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_damaged_artefact_is_rebuilt_with_a_warning(
    kind: str,
    how: str,
    warm_cache: tuple[Path, list[torch.Tensor]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = tmp_path / "cache"
    shutil.copytree(warm_cache[0], root)
    monkeypatch.setenv("SYMNEURON_CACHE", str(root))
    damaged = _damage(kind, how, sorted(root.glob(KINDS[kind])))
    _forget()
    with pytest.warns(RuntimeWarning, match="damaged") as caught:
        results = _run_pair()
    named = " ".join(str(w.message) for w in caught)
    assert all(str(path) in named for path in damaged), named
    for got, want in zip(results, warm_cache[1], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    for path in root.glob("**/*"):  # healed: every file checks again
        if path.is_file():
            assert cache.unseal(path.name, path.read_bytes()) is not None, path
    _forget()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _run_pair()
    _forget()


@pytest.mark.cuda
@pytest.mark.parametrize("how", ["truncate", "empty", "random", "one character", "swap"])
def test_damaged_cuda_binary_is_rebuilt_with_a_warning(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SYMNEURON_CACHE", str(tmp_path / "cache"))
    _forget()
    cold = _run_pair("cuda")
    for got, want in zip(cold, _run_pair("torch"), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    binaries = sorted((tmp_path / "cache").glob("cuda-*.cubin"))
    assert len(binaries) >= 2
    damaged = _damage("binary", how, binaries)
    _forget()
    with pytest.warns(RuntimeWarning, match="damaged") as caught:
        warm = _run_pair("cuda")
    named = " ".join(str(w.message) for w in caught)
    assert all(str(path) in named for path in damaged), named
    for got, want in zip(warm, cold, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert all(cache.unseal(p.name, p.read_bytes()) is not None for p in binaries)
    _forget()


def test_seal_binds_name_and_content() -> None:
    sealed = cache.seal("a.c", b"int x = 1;")
    assert cache.unseal("a.c", sealed) == b"int x = 1;"
    assert cache.unseal("b.c", sealed) is None  # the same bytes under another name
    assert cache.unseal("a.c", sealed.replace(b"1", b"0", 1)) is None
    assert cache.unseal("a.c", sealed[:-1]) is None
    assert cache.unseal("a.c", b"") is None


# Damages that crashed a fresh process before (truncated library: bus error; swapped
# needs-X flags: a NULL X read by PLIF's backward): the process must survive them.
FRESH = textwrap.dedent(
    """
    import os, sys, torch
    sys.path.insert(0, os.environ["TESTS"])
    from test_cache import _run_pair
    torch.save(_run_pair(), os.environ["OUT"])
    """
)


def _fresh_process(root: Path, out: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SYMNEURON_CACHE": str(root),
        "OUT": str(out),
        "TESTS": str(Path(__file__).parent),
        "PYTHONPATH": str(Path(sn.__file__).parents[1]),
    }
    return subprocess.run(
        [sys.executable, "-c", FRESH], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow  # a fresh Python process
def test_fresh_process_survives_truncated_libraries_and_swapped_flags(
    warm_cache: tuple[Path, list[torch.Tensor]], tmp_path: Path
) -> None:
    root = tmp_path / "cache"
    shutil.copytree(warm_cache[0], root)
    for library in root.glob("cpu-*.so"):
        _damage("library", "truncate", [library, library])
    _damage("flag", "swap", sorted(root.glob("generated/*.txt")))
    proc = _fresh_process(root, tmp_path / "out.pt")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("damaged") >= 4, proc.stderr[-3000:]
    for got, want in zip(torch.load(tmp_path / "out.pt"), warm_cache[1], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.slow  # four fresh Python processes compiling at once
def test_concurrent_processes_fill_one_empty_cache(
    warm_cache: tuple[Path, list[torch.Tensor]], tmp_path: Path
) -> None:
    root = tmp_path / "cache"
    env = {**os.environ, "SYMNEURON_CACHE": str(root), "TESTS": str(Path(__file__).parent)}
    env["PYTHONPATH"] = str(Path(sn.__file__).parents[1])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", FRESH],
            env={**env, "OUT": str(tmp_path / f"out{i}.pt")},
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    assert not any("damaged" in e for e in errors), errors
    for i in range(4):
        for got, want in zip(torch.load(tmp_path / f"out{i}.pt"), warm_cache[1], strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    files = [p for p in root.glob("**/*") if p.is_file()]
    assert files and all(cache.unseal(p.name, p.read_bytes()) is not None for p in files)
    assert not list(root.glob("**/*.tmp")) and not list(root.glob("*.load"))


# -- an unusable root, and info / clear ------------------------------------------------


def _unusable_roots(tmp_path: Path) -> dict[str, Path]:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    return {"a file": blocker, "below a file": blocker / "cache", "/proc": Path("/proc/sn")}


@pytest.mark.parametrize("where", ["a file", "below a file", "/proc", "immutable"])
def test_unwritable_root_falls_back_with_one_warning(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if where == "immutable":
        root = tmp_path / "locked"
        root.mkdir()
        locked = subprocess.run(["chattr", "+i", str(root)], capture_output=True).returncode == 0
        if not locked:
            if os.geteuid() == 0:
                pytest.skip("chattr +i is not permitted here and root ignores modes")
            root.chmod(0o500)
    else:
        root = _unusable_roots(tmp_path)[where]
    monkeypatch.setenv("SYMNEURON_CACHE", str(root))
    cache._ROOTS.pop(str(root), None)
    _forget()
    try:
        with pytest.warns(RuntimeWarning, match="SYMNEURON_CACHE") as caught:
            used = cache.cache_dir()
            assert cache.cache_dir() == used != root
            spikes, v = sn.simulate(sn.models.LIF(), torch.full((3, 2), 1.5), backend="cpu")
        assert len([w for w in caught if "SYMNEURON_CACHE" in str(w.message)]) == 1
        assert spikes.tolist() == [[0, 0], [1, 1], [0, 0]]  # H: 0.75, 1.125 fires, 0.75
        assert list(used.glob("cpu-*.so"))
    finally:
        if where == "immutable":
            subprocess.run(["chattr", "-i", str(root)], capture_output=True)
            root.chmod(0o700)
        _forget()


def test_info_and_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv("SYMNEURON_CACHE", str(root))
    _forget()
    x = torch.rand(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    tau = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    v = sn.simulate(sn.models.LIF(learnable=["tau"]), x, params={"tau": tau}, backend="cpu")[1]
    v.sum().backward()
    _forget()
    (root / "notes.txt").write_text("the user's own file")
    found = cache.info()
    on_disk = [p for p in root.glob("**/*") if p.is_file() and p.name != "notes.txt"]
    assert found["path"] == str(root)
    assert found["files"] == len(on_disk) == 5  # forward and backward: 2 sources, 2 libraries
    assert found["bytes"] == sum(p.stat().st_size for p in on_disk)
    kinds = found["kinds"]
    assert isinstance(kinds, dict)
    assert {k: v["files"] for k, v in kinds.items()} == {
        "generated source": 2,
        "generated facts": 1,
        "cpu library": 2,
    }
    assert cache.clear() == 5
    assert cache.info()["files"] == 0 and (root / "notes.txt").exists()


# -- bounded in-memory tables ----------------------------------------------------------


def test_tables_stay_bounded_over_300_neurons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(300):
        neuron = Definition(V * 0.5 + X, params={"a": float(i)}, name=f"N{i}")
        kernels.program(neuron, "cpu")
        assert len(kernels._PROGRAMS) <= kernels._PROGRAMS.bound
    assert len(kernels._PROGRAMS) == kernels._PROGRAMS.bound
    monkeypatch.setenv("SYMNEURON_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu, "_LIBRARIES", cache.BoundedTable(3))
    sources = [f"int sn_value(void) {{ return {i}; }}\n" for i in range(5)]
    for source in sources:
        cpu.load(source)
        assert len(cpu._LIBRARIES) <= 3
    again = cpu.load(sources[0])  # forgotten, loaded again from the disk cache
    assert again.sn_value() == 0 and cpu.load(sources[4]).sn_value() == 4
    kernels._PROGRAMS.clear()
