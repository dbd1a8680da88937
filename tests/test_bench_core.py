"""``benchmarks/core.py``'s worker processes: a worker answers in its own process, one that
dies is restarted for the next request, one that hangs is stopped after the timeout, and
after ``max_failures`` failures in a row it is retired with the reason."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import core  # noqa: E402


class Echo(core.WorkerBase):
    """Answers with its pid; ``die`` exits the process, ``hang`` sleeps past any timeout."""

    def op_pid(self, req: core.Rec) -> core.Rec:
        return {"records": [{"name": "pid", "status": "ok", "pid": os.getpid()}]}

    def op_die(self, req: core.Rec) -> core.Rec:
        os._exit(7)

    def op_hang(self, req: core.Rec) -> core.Rec:
        time.sleep(600)
        return {}


@pytest.mark.slow  # waits out a hung worker: ~25 s
def test_a_worker_is_restarted_after_it_dies_and_retired_after_failures() -> None:
    worker = core.Worker("main", Echo, {"dry_run": True}, max_failures=2)
    try:
        first = worker.request({"op": "pid"}, 120)["records"][0]["pid"]
        assert first != os.getpid()
        with pytest.raises(core.WorkerDied, match=r"exited \(code 7\)"):
            worker.request({"op": "die"}, 120)
        assert worker.request({"op": "pid"}, 120)["records"][0]["pid"] not in (first, os.getpid())
        with pytest.raises(core.WorkerDied, match="gave no answer in 2 s"):
            worker.request({"op": "hang"}, 2)
        with pytest.raises(core.WorkerDied, match="exited"):
            worker.request({"op": "die"}, 120)
        assert "gave up after 2 failures" in worker.dead
        with pytest.raises(core.WorkerDied, match="gave up"):
            worker.request({"op": "pid"}, 120)
    finally:
        worker.stop()
    assert worker.proc is None
