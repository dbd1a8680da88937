"""``benchmarks/eventprop_bptt.py``: EventProp against surrogate BPTT, on the CPU.

Its inputs (Poisson counts padded with +inf, binned per step for BPTT), and its
``--device cpu --quick`` run end to end (the C kernels and the CPU neuron kernels), read
back from its table and JSON.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import eventprop_bptt as bench  # noqa: E402


def test_inputs_are_sorted_padded_times_and_their_bins_count_them() -> None:
    case = bench.Case("shd", (30, 4, 2), 3, 200, ((0.1, 0.1), (0.1, 0.1)))
    times = bench.input_times(case, torch.Generator().manual_seed(1))
    finite = torch.isfinite(times)
    assert times.shape[:2] == (3, 30) and bool((times[finite] < 200).all())
    assert bool((times.diff(dim=-1)[finite[..., 1:]] >= 0).all())
    bins = bench.binned(times, case.steps)
    assert bins.shape == (200, 3, 30) and torch.equal(bins.sum(0), finite.sum(-1).float())


@pytest.mark.slow  # the three rows of both quick cases: about 7 s
def test_quick_cpu_run_writes_its_table_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "quick.json"
    assert bench.main(["--device", "cpu", "--quick", "--out", str(out)]) == 0
    records = json.loads(out.read_text())["records"]
    assert {(r["case"], r["row"]) for r in records} == {
        (c, r) for c in ("shd", "yinyang") for r in ("eventprop", "bptt", "eventprop-recurrent")
    }
    assert all(r["status"] == "ok" and math.isfinite(r["median_s"]) for r in records)
    assert all(r["spikes_per_sample"][0] > 0 for r in records)
    assert out.with_suffix(".png").exists()
    table = capsys.readouterr().out
    assert "EventProp time / BPTT" in table and "recurrent / feedforward" in table


def test_profile_reports_each_rows_time_per_step(capsys: pytest.CaptureFixture[str]) -> None:
    """``--profile`` on the CPU: each case's row under torch.profiler, its wall time."""
    argv = ["--device", "cpu", "--quick", "--profile", "--steps", "1", "--rows", "eventprop"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "## shd eventprop" in out and "## yinyang eventprop" in out
    assert "ms/step" in out and "host, most self time per step:" in out
