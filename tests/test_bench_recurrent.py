"""``benchmarks/recurrent.py``: the recurrent-layer training-step benchmark on the CPU.

The oracle of each row is the hand-written torch loop: same weights and input give the same
float64 loss and gradients (the check refuses a row that differs, shown here by giving the
torch loop another surrogate), and a row firing outside 2–20 % of neuron-steps is refused.
The slow test runs ``--device cpu --quick`` end to end and reads its table and JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "recurrent.py"
sys.path.insert(0, str(SCRIPT.parent))

import recurrent  # noqa: E402


def test_the_gradient_check_refuses_a_row_that_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert recurrent.check_gradients("cpu", ["torch", "symneuron", "symneuron-loop"]) == {}
    monkeypatch.setattr(recurrent, "ALPHA", 2.0)  # the torch loop's surrogate, not the zoo's
    refused = recurrent.check_gradients("cpu", ["torch", "symneuron", "symneuron-loop"])
    assert set(refused) == {"symneuron", "symneuron-loop"}
    assert all(why.startswith("gradient check failed") for why in refused.values())


def test_a_row_firing_outside_the_range_is_not_timed() -> None:
    case = recurrent.Case(2, 8, 10, "cpu", recurrent.torch.float32)
    case.x = case.x * 0.0  # silent
    timer = recurrent.core.Timer(recurrent.torch.device("cpu"))
    args = argparse.Namespace(warmup=1, steps=1)
    (rec,) = recurrent.time_row(case, "torch", timer, args)
    assert rec["status"] == "error" and "step_ms" not in rec
    assert rec["error"] == "firing rate 0.000 outside 2%–20%"


@pytest.mark.slow
def test_quick_run_prints_every_row(tmp_path: Path) -> None:
    out = tmp_path / "recurrent.json"
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    table = lines[lines.index("| B | H | T | row | firing rate | eager ms | graphed ms |") :]
    assert len(table) == 2 + 2 * (1 + len(recurrent.ROWS))  # header, rule, 2 configs x rows
    for b, h, t in recurrent.QUICK:
        for row in ["input copy (floor)", *recurrent.ROWS]:
            cells = next(ln for ln in table if ln.startswith(f"| {b} | {h} | {t} | {row} |"))
            eager = cells.split("|")[6].strip()
            assert float(eager) > 0, cells
    results = json.loads(out.read_text())
    assert results["refused"] == {}
    rates = [r["rate"] for r in results["records"] if "rate" in r]
    assert rates and all(0.02 <= r <= 0.20 for r in rates)
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "gradient check symneuron on cpu: loss and 5 gradients equal" in proc.stdout
