"""The static roofline estimate (``benchmarks/roofline.py``): counting PTX per time step.

The loop analysis is checked on a hand-written PTX loop (exact counts), then on the zoo's
real kernels compiled by NVRTC (no GPU): LIF's step is cheaper than HodgkinHuxley's, EIF's
forward has an ``expf`` (MUFU) and IF's none, the bytes a kernel moves match the floor
model's tensors. Skipped where NVRTC is unavailable (the hand-written PTX tests still run).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from symneuron.runtime import nvrtc

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str) -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


roofline = _load("roofline")
floor = roofline.floor
needs_nvrtc = pytest.mark.skipif(
    not nvrtc.nvrtc_available(), reason="NVRTC unavailable (no cupy-cuda13x/nvidia-cuda-nvrtc)"
)

# A time loop unrolled twice (two stores) with a remainder loop (one store); each step
# has a diamond whose taken side is long, and a rare side that touches local memory.
LOOP_PTX = """
$L__BB0_2:
	ld.global.nc.f32 	%f1, [%rd1];
	mov.f32 	%f9, 0f3F800000;
	@%p1 bra 	$L__BB0_4;
	div.rn.f32 	%f2, %f1, %f3;
	ex2.approx.ftz.f32 	%f4, %f2;
	bra.uni 	$L__BB0_5;
$L__BB0_4:
	st.local.u32 	[%rd9], %r1;
	add.f32 	%f2, %f1, %f3;
$L__BB0_5:
	st.global.f32 	[%rd2], %f2;
	ld.global.nc.f32 	%f5, [%rd1+4];
	add.s64 	%rd1, %rd1, 8;
	st.global.f32 	[%rd2+4], %f5;
	@%p2 bra 	$L__BB0_2;
$L__BB0_7:
	ld.global.nc.u16 	%rs1, [%rd1];
	cvt.u32.u16 	%r1, %rs1;
	st.global.u16 	[%rd2], %rs1;
	@%p3 bra 	$L__BB0_7;
	ret;
"""


def test_hand_written_loop_counts_the_fast_path_per_step() -> None:
    step = roofline.step_counts(roofline.parse_ptx(LOOP_PTX))
    # fast path: ld, mov (0), bra, div (10), ex2, bra.uni, st, ld, add.s64 (2), st, bra
    assert step.unroll == 2
    assert step.issued == pytest.approx((1 + 0 + 1 + 10 + 1 + 1 + 1 + 1 + 2 + 1 + 1) / 2)
    assert step.mufu == pytest.approx(2 / 2)  # ex2 and the reciprocal inside div.rn
    assert step.ieee == pytest.approx(1 / 2)
    assert (step.loads, step.stores) == (4.0, 4.0)


def test_the_roofline_names_what_binds() -> None:
    gpu = roofline.H100
    step = roofline.Step(issued=10, mufu=0, ieee=0, loads=8, stores=8, unroll=8)
    assert roofline.kernel_time(step, gpu)[2] == "memory"
    assert roofline.kernel_time(roofline.Step(500, 0, 0, 8, 8, 8), gpu)[2] == "issue"
    assert roofline.kernel_time(roofline.Step(100, 90, 0, 8, 8, 8), gpu)[2] == "MUFU"
    seconds, serial, _ = roofline.kernel_time(step, gpu)
    assert seconds == pytest.approx(16 / gpu.copy_bandwidth)
    assert serial == pytest.approx(16 / gpu.copy_bandwidth + 10 / gpu.issue_rate)


def test_spearman_ranks() -> None:
    assert roofline.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert roofline.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert roofline.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254)


@pytest.fixture(scope="module")
def rows() -> dict[tuple[str, str], dict]:
    pairs = [("LIF", "fp32"), ("LIF", "bf16"), ("IF", "fp32"), ("EIF", "fp32")]
    pairs += [("HodgkinHuxley", "fp32")]
    return {p: roofline.estimate(*p) for p in pairs}


@needs_nvrtc
def test_lif_step_is_cheaper_than_hodgkin_huxley(rows: dict) -> None:
    lif, hh = rows["LIF", "fp32"], rows["HodgkinHuxley", "fp32"]
    for kernel in roofline.KERNELS:
        assert 0 < lif[kernel]["issued"] < hh[kernel]["issued"]
        assert lif[kernel]["unroll"] == 8  # #pragma unroll (K == 1 ? 8 : 4)
    assert hh["forward"]["bound"] in ("issue", "MUFU") or hh["backward"]["bound"] != "memory"


@needs_nvrtc
def test_exponentials_count_as_mufu(rows: dict) -> None:
    assert rows["EIF", "fp32"]["forward"]["mufu"] >= 1
    assert rows["IF", "fp32"]["forward"]["mufu"] == 0


@needs_nvrtc
@pytest.mark.parametrize("key", [("LIF", "fp32"), ("LIF", "bf16"), ("HodgkinHuxley", "fp32")])
def test_bytes_match_the_floor_model(rows: dict, key: tuple[str, str]) -> None:
    model, dtype = key
    row, item, k = rows[key], floor.ITEMSIZE[dtype], floor.extra_states(model)
    assert row["floor_bytes"] == floor.bytes_per_element(model, "training", item)
    assert row["forward"]["bytes"] == floor.tensors("forward", k) * item
    assert row["forward"]["floor_bytes"] == floor.tensors("forward", k) * item
    if model == "LIF":  # the broadcast dL/dS is not read; nothing else above the floor
        assert row["backward"]["bytes"] == floor.tensors("backward", k, False) * item


@needs_nvrtc
def test_a_tensor_dl_ds_is_read() -> None:
    row = roofline.estimate("LIF", "fp32", grad_spike="tensor")
    assert row["backward"]["bytes"] == floor.tensors("backward", 0) * 4
    assert row["floor_fraction"] == pytest.approx(1.0)  # memory-bound at the floor


@needs_nvrtc
def test_main_prints_the_table_and_writes_json(tmp_path: Path, capsys) -> None:
    out = tmp_path / "roofline.json"
    assert roofline.main(["--models", "IF,LIF,QIF", "--dtypes", "bf16", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Spearman rho" in printed and "LIF" in printed
    doc = json.loads(out.read_text())
    assert [r["model"] for r in doc["rows"]] == ["IF", "LIF", "QIF"]
    assert doc["machine"]["issue_rate"] == pytest.approx(132 * 4 * 32 * 1.98e9)
