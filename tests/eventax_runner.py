"""Run a feedforward LIF network through Eventax (JAX, Diffrax): the outside oracle of
the EventProp reference's gradients.

Runs in its own environment (``pip install eventax``; JAX is no dependency of
symneuron), started by ``tests/test_eventax.py``: reads one JSON job on stdin, writes
every neuron's spike times and the gradients of a weighting of them as JSON on stdout.
A job::

    {"n_in": 5, "sizes": [8, 3], "W": [W0, W1], "D": [D0, D1],   # [n_out][n_in] each
     "inputs": [[...], ...],      # [n_in][K] spike times, 1e30 for an empty slot
     "t_end": 30.0, "coef": [[...], ...],   # [n_neurons][slots]: L = Σ coef·t
     "tau_m": 10.0, "tau_s": 5.0, "threshold": 1.0, "tol": 1e-10}

Eventax's LIF is τ_m V' = −V + I, τ_s I' = −I, I ← I + w at an arrival, V − ϑ at a
spike (its gradient-preserving reset: the same EventProp jump as a reset to 0 at V = ϑ).
Both layers are one Eventax population whose weight mask holds the layers' blocks (rows:
neurons, then inputs). Its defaults (Euler, Newton root-finding to 1e-2) are replaced by
Dopri8 with a PID controller and Newton at ``tol``; gradients are JAX's through the
solver (Eventax's default ``RecursiveCheckpointAdjoint``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import diffrax as dfx
import equinox as eqx
import jax
import optimistix as optx

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
from eventax.evnn import EvNN  # noqa: E402
from eventax.neuron_models import LIF  # noqa: E402


def _blocks(job: dict[str, Any], key: str, n: int, hidden: int) -> jnp.ndarray:
    """The job's two [n_out][n_in] matrices as Eventax's [from, to] over the population."""
    first, second = (jnp.array(m, dtype=jnp.float64) for m in job[key])
    out = jnp.zeros((n + job["n_in"], n), dtype=jnp.float64)
    return out.at[n:, :hidden].set(first.T).at[:hidden, hidden:].set(second.T)


def run(job: dict[str, Any]) -> dict[str, Any]:
    hidden, n = job["sizes"][0], sum(job["sizes"])
    weights, delays = _blocks(job, "W", n, hidden), _blocks(job, "D", n, hidden)
    mask = jnp.zeros_like(weights).at[n:, :hidden].set(1.0).at[:hidden, hidden:].set(1.0)
    tol = job["tol"]
    net = EvNN(
        LIF,
        n_neurons=n,
        max_solver_time=job["t_end"],
        in_size=job["n_in"],
        key=jax.random.PRNGKey(0),
        wmask=mask,
        init_delays=delays,
        input_neurons=jnp.arange(n) < hidden,
        output_neurons=jnp.ones(n),
        solver=dfx.Dopri8(),
        stepsize_controller=dfx.PIDController(rtol=tol, atol=tol),
        root_finder=optx.Newton(tol, tol),
        solver_stepsize=0.01,
        max_event_steps=2000,
        buffer_capacity=2000,
        dtype=jnp.float64,
        thresh=job["threshold"],
        tmem=job["tau_m"],
        tsyn=job["tau_s"],
        vreset=0.0,
        init_weights=weights,
        init_bias=0.0,
    )
    coef = jnp.array(job["coef"], dtype=jnp.float64)
    slots = coef.shape[1]

    def loss(leaves: tuple[jnp.ndarray, ...]) -> tuple[jnp.ndarray, jnp.ndarray]:
        w, d, x = leaves
        model = eqx.tree_at(lambda m: m.neuron_model.weights, net, w)
        model = eqx.tree_at(lambda m: m.delays, model, d)
        times = model.spikes_until_t(x, job["t_end"], max_spikes=slots * n)[:, :slots]
        return jnp.sum(jnp.where(jnp.isfinite(times), times * coef, 0.0)), times

    inputs = jnp.array(job["inputs"], dtype=jnp.float64)
    inputs = jnp.where(inputs > 1e29, jnp.inf, inputs)
    (_, times), (g_w, g_d, g_x) = jax.value_and_grad(loss, has_aux=True)((weights, delays, inputs))
    return {
        "times": jnp.where(jnp.isfinite(times), times, -1.0).tolist(),
        "W": [g_w[n:, :hidden].T.tolist(), g_w[:hidden, hidden:].T.tolist()],
        "D": [g_d[n:, :hidden].T.tolist(), g_d[:hidden, hidden:].T.tolist()],
        "inputs": jnp.where(jnp.isfinite(inputs), g_x, 0.0).tolist(),
    }


if __name__ == "__main__":
    json.dump(run(json.load(sys.stdin)), sys.stdout)
