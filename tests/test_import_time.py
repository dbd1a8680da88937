"""``import symneuron`` costs about what ``import torch, sympy`` costs.

torch's compiler stack (``torch._dynamo``, AOTAutograd, inductor's config) loads
where compilation is first needed, not at import. Measured in fresh interpreters,
against a baseline measured in the same test: the minimum of several runs of each,
interleaved, so that a loaded machine slows both alike.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import symneuron as sn
from symneuron.memo import CONSTANT_MARK, constant_result

REPO = Path(sn.__file__).parents[1]
#: modules of torch's compiler stack that ``import torch`` leaves unloaded
COMPILER = ("torch._dynamo", "torch._inductor.config", "torch._functorch.aot_autograd")


def _fresh(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _import_seconds(statement: str) -> float:
    code = f"import time\nt = time.perf_counter()\n{statement}\nprint(time.perf_counter() - t)"
    return float(_fresh(code).strip())


def test_constant_result_marks_as_torch_does() -> None:
    import torch._dynamo

    def ours() -> int:
        return 1

    def torchs() -> int:
        return 1

    constant_result(ours)
    torch._dynamo.assume_constant_result(torchs)
    assert vars(torchs) == {CONSTANT_MARK: True}
    assert vars(ours) == vars(torchs)


def test_import_leaves_the_compiler_unloaded() -> None:
    code = f"import sys, symneuron\nprint([m for m in {COMPILER!r} if m in sys.modules])"
    assert _fresh(code).strip() == "[]"


@pytest.mark.slow
def test_import_costs_within_a_fifth_of_torch_and_sympy() -> None:
    base, ours = [], []
    for _ in range(5):  # 10 fresh interpreters: about 30 s of a loaded CI's cores
        base.append(_import_seconds("import torch, sympy"))
        ours.append(_import_seconds("import symneuron"))
    # each pair back to back sees about the same load (the suite's other workers run
    # beside this test); the median of the pairs' ratios, not one quick baseline run
    # (a minimum of each side failed at 1.22 on a loaded CI where idle runs give 1.07)
    ratio = statistics.median(o / b for o, b in zip(ours, base, strict=True))
    assert ratio <= 1.2, f"import symneuron {ours} s, torch + sympy {base} s: {ratio:.3f}"


def test_import_does_no_sympy_arithmetic() -> None:
    """SymPy's first sum loads its tensor and combinatorics modules (about 40 ms):
    importing symneuron builds no expression (the connection is derived on first use)."""
    code = "import sys, symneuron; print('sympy.tensor.tensor' in sys.modules)"
    assert _fresh(code).strip() == "False"
