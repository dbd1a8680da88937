"""Integrate neuron ODEs with Brian2 (numpy target, float64): the outside oracle.

Runs in its own environment (Brian2 2.9 needs numpy < 2), started by
``tests/test_brian2.py``: reads one JSON job on stdin, writes the trajectories as JSON
on stdout. A job is a list of models, each::

    {"odes": {"V": "<dV/dt>", "w": "<dw/dt>", ...}, "params": {"tau": 2.0, ...},
     "method": "rk4", "dt": 0.5, "threshold": "V >= 1.0", "reset": "V = 0.0; w = w + b",
     "refractory": null, "seed": null,
     "init": {"V": [...], "w": [...]}, "x": [[...], ...]}       # x: [T][N]

The right-hand sides are in units of 1/ms and ``dt`` in ms, so every quantity is
dimensionless. X is held constant over each step: a ``run_regularly`` operation at the
start of the step copies this step's input into the variable ``X``, which the ODEs read.
The output per model is V and each state after every step (after the reset), and the
spikes as (step, neuron) pairs. A neuron that spikes on an upward threshold crossing
and has no reset (Hodgkin–Huxley) gets ``"reset": ""`` and the threshold condition as
its ``"refractory"`` condition: Brian2 then lets it fire only when the condition was
false before the step.
"""

from __future__ import annotations

import json
import sys

import brian2 as b2
import numpy as np

METHODS = {
    "euler": "euler",
    "exp_euler": "exponential_euler",
    "rk2": "rk2",
    "rk4": "rk4",
    "exact": "exact",
}


def run(model: dict) -> dict:
    b2.start_scope()
    b2.prefs.codegen.target = "numpy"
    if model.get("seed") is not None:  # white noise (xi) drawn by Brian2's own generator
        b2.seed(model["seed"])
    dt = model["dt"] * b2.ms
    b2.defaultclock.dt = dt
    x = np.asarray(model["x"], dtype=np.float64)
    t_len, n = x.shape
    x_in = b2.TimedArray(x, dt=dt)  # noqa: F841 (looked up by name in the group's code)
    lines = [f"d{name}/dt = ({rhs}) / ms : 1" for name, rhs in model["odes"].items()]
    lines.append("X : 1")
    group = b2.NeuronGroup(
        n,
        "\n".join(lines),
        threshold=model["threshold"],
        reset=model["reset"] or None,
        refractory=model.get("refractory") or False,
        method=METHODS[model["method"]],
        namespace={**model["params"], "x_in": x_in},
        dtype=np.float64,
    )
    group.run_regularly("X = x_in(t, i)", when="start")
    for name, values in model["init"].items():
        setattr(group, name, np.asarray(values, dtype=np.float64))
    names = list(model["odes"])
    states = b2.StateMonitor(group, names, record=True, when="end")
    spikes = b2.SpikeMonitor(group)
    b2.run(t_len * dt)
    steps = np.round(np.asarray(spikes.t / dt)).astype(int)
    return {
        "states": {name: np.asarray(getattr(states, name)).T.tolist() for name in names},
        "spikes": [[int(s), int(i)] for s, i in zip(steps, np.asarray(spikes.i), strict=True)],
        "brian2": b2.__version__,
    }


def main() -> None:
    job = json.load(sys.stdin)
    json.dump([run(model) for model in job], sys.stdout)


if __name__ == "__main__":
    main()
