"""The counterfactual simulation environment of Sec. 4.1.2 and the PIC observation model of Sec. 2.

The oracle demand ``D*_t`` comes from a trace; the environment reveals only
``Y_t = min(D*_t, A_t)`` and ``C_t = 1[D*_t > A_t]`` to the controller. Demand is used here and in
the metrics, never passed to the controller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from picrl_core.controller import PicRLController, Transition
from picrl_core.controller_state import ControllerState

StepHook = Callable[[int, ControllerState, Transition], None]


def censor(demand: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Action-as-threshold observation: ``(y, c) = (min(d, a), 1[d > a])``."""
    demand = np.asarray(demand, dtype=np.float64)
    action = np.asarray(action, dtype=np.float64)
    return np.minimum(demand, action), demand > action


# The fields of a pending decision that a trajectory records at every tick (the action and its breakdown, Eq. 11)
DECISION_FIELDS = ("action", "mu", "sigma", "k", "eta", "margin", "bias", "escape")


@dataclass
class Trajectory:
    """What happened at every tick of a closed-loop run, each field ``(T, N)``."""

    demand: np.ndarray
    action: np.ndarray
    observed: np.ndarray
    censored: np.ndarray
    mu: np.ndarray
    sigma: np.ndarray
    k: np.ndarray
    eta: np.ndarray
    margin: np.ndarray
    bias: np.ndarray
    escape: np.ndarray
    reward: np.ndarray

    def column(self, service: int) -> Trajectory:
        """The single-service trajectory of ``service`` (fields ``(T, 1)``)."""
        return Trajectory(**{f.name: getattr(self, f.name)[:, service : service + 1] for f in fields(self)})


def simulate(
    controller: PicRLController,
    demand: np.ndarray,
    history: np.ndarray,
    *,
    context: np.ndarray | None = None,
    history_context: np.ndarray | None = None,
    keys: np.ndarray | None = None,
    start_tick: int = 0,
    on_step: StepHook | None = None,
) -> Trajectory:
    """Run ``controller`` in closed loop over ``demand`` ``(T, N)`` for N services at once.

    ``history`` ``(N, H)`` is uncensored past demand used as the cold-start window; ``context``
    ``(T, N, C)`` is the per-tick context revealed with the feedback. ``on_step(t, state, transition)``
    is called after every tick (the online slow loop hooks in there).
    """
    demand = np.asarray(demand, dtype=np.float64)
    if demand.ndim != 2:
        raise ValueError(f"demand must have shape (ticks, services); got {demand.shape}")
    steps, services = demand.shape
    keys = np.arange(services, dtype=np.uint64) if keys is None else keys
    state = controller.initial_state(keys, history, history_context, start_tick)
    record = {f.name: np.empty((steps, services)) for f in fields(Trajectory)}
    record["demand"] = demand
    record["censored"] = np.empty((steps, services), dtype=bool)
    for t in range(steps):
        action = state.action
        observed, censored = censor(demand[t], action)
        for name in DECISION_FIELDS:
            record[name][t] = getattr(state, name)
        record["observed"][t] = observed
        record["censored"][t] = censored
        state, transition = controller.step(state, observed, censored, None if context is None else context[t])
        record["reward"][t] = transition.reward
        if on_step is not None:
            on_step(t, state, transition)
    return Trajectory(**record)
