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
    head = "| B | H | T | amp | row | firing rate | eager ms | graphed ms |"
    table = lines[lines.index(head) : lines.index(head) + 2 + 2 * (1 + len(recurrent.ROWS))]
    for b, h, t in recurrent.QUICK:
        for row in ["input copy", *recurrent.ROWS]:
            cells = next(ln for ln in table if ln.startswith(f"| {b} | {h} | {t} | fp32 | {row} |"))
            eager = cells.split("|")[7].strip()
            assert float(eager) > 0, cells
    results = json.loads(out.read_text())
    assert results["refused"] == {}
    rates = [r["rate"] for r in results["records"] if r.get("rate") is not None]
    assert len(rates) == 2 * (len(recurrent.ROWS) - len(recurrent.FLOORS))
    assert all(0.02 <= r <= 0.20 for r in rates)
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    speedup = out.with_name(out.stem + "-speedup.png")
    assert speedup.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # symneuron against the best peer and the floor, per configuration (eager on the CPU)
    found = {(r["B"], r["H"], r["T"]): r for r in results["speedups"]}
    assert set(found) == set(recurrent.QUICK)
    assert all(r["speedup_vs_best_peer"] > 0 and r["over_floor"] > 0 for r in found.values())
    assert "gradient check symneuron on cpu: loss and 5 gradients equal" in proc.stdout


def test_the_floor_products_have_the_loops_gradients() -> None:
    """The floor's hand-written backward (its products, then ∂L/∂W in one product) gives
    the gradients autograd gives the same loop written with torch ops."""
    torch = recurrent.torch
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    s = (torch.rand(5, 3, 4, generator=gen) < 0.3).double()
    g = torch.randn(5, 3, 4, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(recurrent.FloorProducts.apply(x, w, s), (x, w), g)
    before = torch.cat([torch.zeros_like(s[:1]), s[:-1]])
    want = torch.autograd.grad(x + before @ w.t(), (x, w), g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_shards_of_a_sweep_hold_every_configuration_once() -> None:
    """``--shard K/N``: the sweep's configurations in N parts, each once, each part in
    the sweep's order, the costliest spread (no part holds two of the four costliest)."""
    args = recurrent.arguments(["--sweep", "--amp", "fp32,bf16"])
    every = recurrent.jobs(args)
    assert len(every) == 2 * len(recurrent.SIZES) * len(recurrent.BATCHES) * len(recurrent.LENGTHS)
    parts = [
        recurrent.jobs(recurrent.arguments(["--sweep", "--amp", "fp32,bf16", "--shard", f"{k}/4"]))
        for k in range(4)
    ]
    assert sorted(j for part in parts for j in part) == sorted(every)
    assert all(part == [j for j in every if j in part] for part in parts)
    costliest = sorted(every, key=recurrent.results.cost)[-4:]
    assert all(sum(j in part for j in costliest) == 1 for part in parts)
    loads = [sum(map(recurrent.results.cost, part)) for part in parts]
    assert max(loads) < 1.5 * min(loads)
    with pytest.raises(SystemExit, match="0 <= K < N"):
        recurrent.jobs(recurrent.arguments(["--sweep", "--shard", "4/4"]))


def _record(row: str, mode: str, ms: float, h: int = 8) -> dict[str, object]:
    return dict(B=2, H=h, T=10, amp="fp32", row=row, mode=mode, status="ok", step_ms=ms)


def test_merged_shards_give_the_speedups_of_one_run(tmp_path: Path) -> None:
    """``--merge``: the shards' records in one file, each configuration's speed-ups over
    its own rows (the best peer named, the floor and the feedforward step)."""
    first = [
        _record(r, "graphed", ms)
        for r, ms in [
            ("symneuron", 1.0),
            ("torch", 4.0),
            ("spikingjelly", 3.0),
            ("floor", 2.0),
            ("feedforward", 0.5),
        ]
    ]
    second = [_record(r, "eager", ms, h=16) for r, ms in [("symneuron", 2.0), ("torch", 5.0)]]
    paths = []
    for k, records in enumerate([first, second]):
        meta = dict(gpu="GPU", shard=k)
        paths.append(tmp_path / f"r{k}.json")
        paths[-1].write_text(json.dumps(dict(meta=meta, settings={}, refused={}, records=records)))
    out = tmp_path / "all.json"
    assert recurrent.main(["--merge", *map(str, paths), "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert merged["records"] == first + second
    assert [m["shard"] for m in merged["meta"]["shards"]] == [0, 1]
    found = {r["H"]: r for r in merged["speedups"]}
    assert found[8]["best_peer"] == "spikingjelly" and found[8]["speedup_vs_best_peer"] == 3.0
    assert found[8]["over_floor"] == 0.5 and found[8]["over_feedforward"] == 2.0
    assert found[16]["speedup_vs_best_peer"] == 2.5 and "over_floor" not in found[16]
    speedup = out.with_name(out.stem + "-speedup.png")
    assert speedup.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
