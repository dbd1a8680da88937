"""The ``symneuron`` command line, run in-process through ``main(argv)``.

Oracles: SymPy's own ``diff`` and ``latex`` for ``show``, the Python API
(``neuron.source``) for ``source``, ``benchmarks/floor.py`` for the bench floor;
exit codes as documented (0 ok, 1 check failed, 2 bad command line).
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import sympy as sp
import torch

import symneuron as sn
from symneuron import cli
from symneuron.cli import main

REPO = Path(__file__).resolve().parents[1]
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def lines(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines()}


# -- MODEL -----------------------------------------------------------------------------


def test_zoo_is_read_from_the_models_module() -> None:
    names = set(cli.zoo())
    assert set(sn.models.ZOO) <= names
    assert set(sn.models.NOISY) <= names
    assert set(getattr(sn.models, "STATEFUL", {})) <= names
    assert {"LIF", "Izhikevich"} <= names


def test_model_with_keyword_arguments() -> None:
    neuron = cli.load_model("LIF(tau=3.0, v_reset=None, learnable=['tau'])")
    assert neuron == sn.models.LIF(tau=3.0, v_reset=None, learnable=["tau"])


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("NoSuchModel", "unknown model 'NoSuchModel'"),
        ("LIF(3.0)", "keyword only"),
        ("LIF(tau=foo)", "not a Python literal"),
        ("LIF(tua=3.0)", "tua"),
        ("LIF(tau=", "cannot read the model"),
        ("os.system('true')", "cannot read the model"),
        ("LIF(tau=", "path/to/file.py:name"),
        ("coba.py", "as 'coba.py:name'"),
    ],
)
def test_bad_model_exits_2(capsys: pytest.CaptureFixture[str], model: str, message: str) -> None:
    code, out, err = run(capsys, "show", model)
    assert code == 2 and out == ""
    assert message in err


def test_unknown_model_lists_every_zoo_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "show", "LIFF")
    assert code == 2
    for name in sn.models.ZOO:
        assert name in err
    assert "path/to/file.py:name" in err


def test_arguments_are_never_evaluated(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    marker = tmp_path / "evaluated"
    code, _, err = run(capsys, "show", f"LIF(tau=open({str(marker)!r}, 'w'))")
    assert code == 2 and "not a Python literal" in err
    assert not marker.exists()


USER_FILE = """
import sympy as sp
import symneuron as sn

tau = sp.Symbol("tau", positive=True)
mine = sn.Neuron(sn.V + (sn.X - sn.V) / tau, params={tau: 4.0}, name="Mine")

def make(tau=5.0):
    return sn.models.LIF(tau=tau, name="Made")

number = 3
"""


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_neurons.py"
    path.write_text(USER_FILE)
    return path


def test_user_file_neuron_and_factory(user_file: Path) -> None:
    mine = cli.load_model(f"{user_file}:mine")
    assert mine.name == "Mine" and mine.params == {"tau": 4.0}
    assert cli.load_model(f"{user_file}:mine(v_reset=None)").v_reset is None
    assert cli.load_model(f"{user_file}:make").params == {"tau": 5.0}
    assert cli.load_model(f"{user_file}:make(tau=6.0)").params == {"tau": 6.0}


@pytest.mark.parametrize(
    ("name", "message"),
    [("missing", "has no 'missing'; the neurons defined there: ['mine']"), ("number", "int")],
)
def test_user_file_errors(
    capsys: pytest.CaptureFixture[str], user_file: Path, name: str, message: str
) -> None:
    code, _, err = run(capsys, "show", f"{user_file}:{name}")
    assert code == 2 and message in err


def test_missing_user_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "show", f"{tmp_path}/nope.py:mine")
    assert code == 2 and "no file" in err


# -- show ------------------------------------------------------------------------------


def test_show_prints_sympys_partials(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", "LIF(learnable=['tau'])")
    assert code == 0
    lif = sn.models.LIF(learnable=["tau"])
    tau = lif.symbols["tau"]
    assert f"H = {lif.charge}" in lines(out)
    for name, wrt in [("V", sn.V), ("X", sn.X), ("tau", tau)]:
        derivative = sp.diff(lif.charge, wrt)
        printed = next(x for x in lines(out) if x.startswith(f"dH/d{name} = "))
        assert (
            sp.simplify(
                sp.sympify(printed.split(" = ")[1], locals={"tau": tau, "V": sn.V, "X": sn.X})
                - derivative
            )
            == 0
        )
    assert "param tau = 2.0 (learnable)" in lines(out)


@pytest.mark.parametrize("name", sorted(sn.models.NOISY))
def test_show_noisy_model(capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, out, err = run(capsys, "show", name)
    neuron = sn.models.NOISY[name]()
    assert code == 0, err
    assert f"H = {sp.sstr(neuron.charge)}" in lines(out)


def test_show_latex(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", "QIF", "--latex")
    assert code == 0
    qif = sn.models.QIF()
    assert f"H = {sp.latex(qif.charge)}" in lines(out)
    d_v = sp.latex(sp.diff(qif.charge, sn.V))
    assert f"\\frac{{\\partial H}}{{\\partial V}} = {d_v}" in lines(out)


def test_show_states(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", "Izhikevich(a=0.3, b=0.2)")
    assert code == 0
    izh = sn.models.Izhikevich(a=0.3, b=0.2)
    state = izh.states["W"]
    assert f"W~ = {state.update}" in lines(out)
    assert "W_new = S*b + W~" in lines(out)  # the on-spike rule sees the updated W~
    w = izh.state_symbols["W"]
    assert f"dW~/dW = {sp.diff(state.update, w)}" in lines(out)


# -- source ----------------------------------------------------------------------------


@pytest.mark.parametrize(("backend", "dtype"), [("cpu", "fp64"), ("cuda", "bf16")])
def test_source_is_the_apis(capsys: pytest.CaptureFixture[str], backend: str, dtype: str) -> None:
    code, out, _ = run(capsys, "source", "LIF", "--backend", backend, "--dtype", dtype)
    assert code == 0
    assert out == sn.models.LIF().source(backend, cli.DTYPES[dtype]) + "\n"


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_source_half_on_cpu_is_refused(capsys: pytest.CaptureFixture[str], dtype: str) -> None:
    code, out, err = run(capsys, "source", "LIF", "--backend", "cpu", "--dtype", dtype)
    assert code == 2 and out == ""
    assert "--backend cuda" in err and "fp32/fp64" in err


def test_bad_option_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "source", "LIF", "--dtype", "fp8")[0] == 2
    assert run(capsys, "frobnicate")[0] == 2
    assert run(capsys, "--help")[0] == 0
    assert run(capsys, "--version")[:2] == (0, f"symneuron {sn.__version__}\n")


# -- check -----------------------------------------------------------------------------


def test_check_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", "LIF(learnable=['tau'])", "--dtype", "fp32")
    assert code == 0
    assert "PASS" in out and "dtype=float32" in out


def test_check_fails_with_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    derivatives = sn.Neuron.derivatives

    def wrong(self: sn.Neuron) -> dict[str, sp.Expr]:
        out = derivatives(self)
        out["dH/dV"] = out["dH/dV"] + sp.Rational(1, 10)
        return out

    monkeypatch.setattr(sn.Neuron, "derivatives", wrong)
    code, out, _ = run(capsys, "check", "LIF")
    assert code == 1
    assert "FAIL dH/dV vs finite diff" in out


@NO_GPU
def test_check_on_cuda_without_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "check", "LIF", "--device", "cuda")
    assert code == 2 and "needs a CUDA GPU" in err


def test_check_half_needs_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "check", "LIF", "--dtype", "bf16")
    assert code == 2 and "--device cuda" in err


# -- bench -----------------------------------------------------------------------------


@NO_GPU
def test_bench_without_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "bench", "LIF")
    assert code == 2 and out == ""
    assert "needs a CUDA GPU" in err


@pytest.mark.parametrize("model", ["LIF", "Izhikevich", "ALIF"])
def test_bench_floor_is_benchmarks_floor(model: str) -> None:
    spec = importlib.util.spec_from_file_location("floor", REPO / "benchmarks" / "floor.py")
    assert spec is not None and spec.loader is not None
    floor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floor)
    for short, size in [("fp32", 4), ("bf16", 2)]:
        expected = floor.bytes_per_element(model, "training", floor.ITEMSIZE[short])
        assert cli.floor_bytes(cli.load_model(model), 16, 1000, size) == expected * 16 * 1000


def test_sizes() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["bench", "LIF", "--N", "2^20", "--T", "16"])
    assert (args.N, args.T) == (2**20, 16)


# -- cache -----------------------------------------------------------------------------


def test_cache_info_and_clear(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from symneuron.runtime import cache

    info = {"root": "/somewhere", "files": 3, "kinds": {"cpu library": {"files": 3}}}
    monkeypatch.setattr(cache, "info", lambda: info, raising=False)
    monkeypatch.setattr(cache, "clear", lambda: 3, raising=False)
    code, out, _ = run(capsys, "cache", "info")
    expected = ["root: /somewhere", "files: 3", "kinds:", "  cpu library:", "    files: 3"]
    assert code == 0 and out.splitlines() == expected
    code, out, _ = run(capsys, "cache", "clear")
    assert code == 0 and "removed 3 cache files" in out


@pytest.mark.skipif(
    not hasattr(importlib.import_module("symneuron.runtime.cache"), "clear"),
    reason="symneuron.runtime.cache.info/clear not there yet",
)
def test_cache_clear_empties_the_cache(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # a cache of its own: the session's is shared with the other test processes (xdist)
    monkeypatch.setenv("SYMNEURON_CACHE", str(tmp_path / "cache"))
    neuron = sn.Neuron(0.5 * sn.V + sn.X, name="ClearedByTheCLI")  # compiled by no other test
    sn.simulate(neuron, torch.ones(2, 3, dtype=torch.float64))  # compiles: fills it
    code, out, _ = run(capsys, "cache", "clear")
    assert code == 0 and "removed" in out and "removed 0 " not in out
    code, out, _ = run(capsys, "cache", "clear")
    assert code == 0 and "removed 0 " in out


# -- python -m symneuron ---------------------------------------------------------------


def test_python_dash_m(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "symneuron", "show", "LIF"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"dH/dV = {sp.diff(sn.models.LIF().charge, sn.V)}" in lines(result.stdout)
