"""Regenerate the figures in docs/images/ from the main demo (nothing is drawn by hand).

Runs ``examples/demo.py`` in full (seeded, so the same numbers every run) and
writes its ``raster.png``, ``traces.png`` and ``rates.png`` into docs/images/::

    python3 -m pip install -e ".[examples]"
    python3 docs/make_figures.py

About half a minute on two CPU cores. Commit the PNGs it rewrites.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"


def main() -> None:
    spec = importlib.util.spec_from_file_location("demo", ROOT / "examples" / "demo.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {ROOT / 'examples' / 'demo.py'}")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    demo.main(["--out", str(IMAGES), *sys.argv[1:]])
    for path in sorted(IMAGES.glob("*.png")):
        print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
