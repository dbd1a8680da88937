"""CPU smoke test of the end-to-end training-step benchmark (``benchmarks/bench_e2e.py``).

``--dry-run`` builds the tiny networks with symneuron's CPU/torch backends, the nn.ReLU floor
and SpikingJelly's torch backend (when importable), runs whole training steps in the worker
processes and writes the JSON, markdown and PNG. The oracle of each figure is the floor's
record of the same run (added = step - floor) and SpikingJelly's first-step loss against
symneuron's (same weights, same batch, same neuron constants).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "bench_e2e.py"


def _load(name: str) -> object:
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location(name, SCRIPT.parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    out = tmp_path_factory.mktemp("e2e")
    files = ["--out", out / "e2e.json", "--md", out / "e2e.md", "--plot", out / "e2e.png"]
    cmd = [sys.executable, SCRIPT, "--dry-run", "--models", "LIF", *files]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "e2e.json").read_text()), proc.stdout, out


@pytest.mark.slow  # the dry run spawns workers: ~25 s
def test_dry_run_records_every_configuration(dry_run: tuple[dict, str, Path]) -> None:
    results, _, _ = dry_run
    recs = results["records"]
    assert results["complete"] and results["meta"]["dry_run"]
    configs = {(r["network"], r["precision"]) for r in recs}
    assert configs == {(n, p) for n in ("cnn", "mlp") for p in ("fp32", "bf16")}
    for network, precision in configs:
        mine = {
            (r["library"], r["model"]): r
            for r in recs
            if (r["network"], r["precision"]) == (network, precision)
        }
        floor, sym = mine[("floor", "-")], mine[("symneuron", "LIF")]
        assert floor["status"] == sym["status"] == "ok", (floor, sym)
        assert sym["step_ms"] > 0 and sym["wall_ms"] > 0
        assert sym["added_ms"] == pytest.approx(sym["step_ms"] - floor["step_ms"])
        assert sym["added_wall_ms"] == pytest.approx(sym["wall_ms"] - floor["wall_ms"])
        for library in ("sj-cupy", "sj-triton"):  # need CUDA: n/a with the reason
            assert mine[(library, "LIF")]["status"] == "n/a"
            assert "CUDA" in mine[(library, "LIF")]["reason"]
            assert mine[(library, "LIF")]["added_ms"] is None


@pytest.mark.slow  # the dry run spawns workers: ~25 s
def test_dry_run_spikingjelly_torch_matches_symneuron(dry_run: tuple[dict, str, Path]) -> None:
    """Same weights, batch and neuron constants: SpikingJelly's first-step loss equals
    symneuron's in fp32; in bf16 a spike at the threshold may flip (a looser bound)."""
    pytest.importorskip("spikingjelly")
    recs = [r for r in dry_run[0]["records"] if r["library"] == "sj-torch"]
    assert len(recs) == 4
    for rec in recs:
        assert rec["status"] == "ok", rec
        assert rec["loss0_relerr"] <= (1e-5 if rec["precision"] == "fp32" else 0.1), rec
    cnn = next(r for r in recs if (r["network"], r["precision"]) == ("cnn", "fp32"))
    assert min(cnn["spike_rates"]) > 0  # the neurons fire: the loss depends on them


@pytest.mark.slow  # the dry run spawns workers: ~25 s
def test_dry_run_outputs(dry_run: tuple[dict, str, Path]) -> None:
    results, stdout, out = dry_run
    md = (out / "e2e.md").read_text()
    assert stdout.rstrip().endswith(md.rstrip().splitlines()[-1])  # the table is printed last
    assert "| network | precision | neuron | library | step ms | added ms |" in md
    assert md.count("n/a: dry run on the CPU") == 2 * 2 * 2  # cupy + triton, 2 nets, 2 dtypes
    png = (out / "e2e.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and results["plot"] == str(out / "e2e.png")


def test_missing_spikingjelly_is_reported_not_raised(tmp_path: Path) -> None:
    bench = _load("bench_e2e")
    with pytest.raises(FileNotFoundError, match=r"pip install spikingjelly==0\.0\.0\.0\.14"):
        bench.locate_sj("sj014", tmp_path)  # type: ignore[attr-defined]


def test_annotate_marks_a_mismatching_loss() -> None:
    bench = _load("bench_e2e")
    recs = [
        {
            "network": "mlp",
            "precision": "fp32",
            "library": lib,
            "model": model,
            "status": "ok",
            "step_ms": step,
            "wall_ms": 2 * step,
            "loss0": loss,
        }
        for lib, model, step, loss in [
            ("floor", "-", 1.0, 9.0),
            ("symneuron", "LIF", 1.5, 2.0),
            ("sj-torch", "LIF", 4.0, 2.1),
        ]
    ]
    bench.annotate(recs)  # type: ignore[attr-defined]
    assert recs[1]["added_ms"] == 0.5 and recs[2]["added_wall_ms"] == 6.0
    assert recs[2]["loss_check"].startswith("check ✗")
