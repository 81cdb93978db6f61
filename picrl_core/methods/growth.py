"""The growth protocol: every method runs on the unclipped demand, in a range that grows as the stream's does.

The paper's protocol (Sec. 4.1.1) clips validation and test demand to the training range ``[L, H]``, so a
fleet that outgrows its history is scored on a flat 1.0. A stream worker instead keeps each service in a
range ``[L, H_t]`` and grows it when it is outgrown (``stream.ranges``, :func:`~picrl_core.scaling.next_high`).
:func:`run_growth_loop` is that loop offline, tick by tick as the worker applies it:

* capacity in force ``A_t = L + a_t (H_t - L)`` (native), usage ``min(D_t, A_t)``, ``c_t = 1[D_t > A_t]``;
* the provisioner sees ``y_t = a_t`` when short, else ``clip((min(D_t, A_t) - L) / (H_t - L), 0, 1)``;
* it decides ``a_{t+1}``, then ``H_{t+1} = L + g (H_t - L)`` when ``c_t``, ``a_t = 1`` and this is the
  ``n``-th short tick in a row or later (``g = range_growth``, ``n = grow_after``), else ``H_t``;
* on a grown range, a provisioner that can carry its state over (:class:`FollowsRange`: PIC-RL, by
  :func:`~picrl_core.controller_state.rescale_state`, exactly as the worker) re-expresses it; any other
  restarts from its last ``H`` feedback values re-expressed in the new range (its offline history's length),
  as an operator re-bases a recommender on its recent log. On a fleet every service of the provisioner
  restarts when one service's range grows.

Demand below ``L`` is seen as 0 and the capacity never goes below ``L`` (ranges do not shrink).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from picrl_core.methods.base import Provisioner, _checked
from picrl_core.scaling import from_unit, next_high, to_unit


@dataclass(frozen=True)
class RangeGrowth:
    """The worker's growth rule (``stream.engine_settings``: ``range_growth``, ``grow_after``)."""

    factor: float = 2.0
    after: int = 3


STREAM_GROWTH = RangeGrowth()  # the worker's defaults


class FollowsRange(ABC):
    """A provisioner whose state can be carried over to a grown range."""

    @abstractmethod
    def moved(self, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray) -> np.ndarray:
        """Express the state in ``[new_low, new_high]`` (per service) instead of ``[low, high]``; returns the
        pending actions in the new ranges ``(N,)``."""


@dataclass(frozen=True)
class GrowthLoopResult:
    """Each tick's native capacity in force, shortage flag and range top, ``(T, N)``; the actions in [0, 1]
    of the range in force."""

    capacity: np.ndarray
    censored: np.ndarray
    high: np.ndarray
    actions: np.ndarray


def run_growth_loop(
    provisioner: Provisioner,
    demand: np.ndarray,
    history: np.ndarray,
    low: np.ndarray | float,
    high: np.ndarray | float,
    growth: RangeGrowth,
    *,
    context: np.ndarray | None = None,
    history_context: np.ndarray | None = None,
    censoring: bool = True,
) -> GrowthLoopResult:
    """``provisioner`` in closed loop over native ``demand`` ``(T, N)``, each service starting in ``[low, high]``
    from ``history`` ``(N, H)`` (in [0, 1] of that range) and growing as the module says. ``censoring=False``
    (a full-information reference) reveals ``clip((D_t - L) / (H_t - L), 0, 1)`` and no flag; the ranges still
    grow on the shortages."""
    demand = np.asarray(demand, dtype=np.float64)
    if demand.ndim != 2:
        raise ValueError(f"demand must have shape (ticks, services); got {demand.shape}")
    steps, n = demand.shape
    low = np.broadcast_to(np.asarray(low, dtype=np.float64), (n,)).copy()
    high = np.broadcast_to(np.asarray(high, dtype=np.float64), (n,)).copy()
    recent = np.array(history, dtype=np.float64)
    recent_context = None if history_context is None else np.array(history_context, dtype=np.float64)
    record = {name: np.empty((steps, n)) for name in ("capacity", "high", "actions")}
    censored = np.empty((steps, n), dtype=bool)
    streak = np.zeros(n, dtype=np.int64)
    a = _checked(provisioner.start(recent.copy(), history_context), n, provisioner)
    for t in range(steps):
        capacity = from_unit(a, low, high)
        short = demand[t] > capacity
        y = np.where(short, a, to_unit(np.minimum(demand[t], capacity), low, high))
        streak = np.where(short, streak + 1, 0)
        record["capacity"][t], record["high"][t], record["actions"][t], censored[t] = capacity, high, a, short
        if t + 1 == steps:
            break
        seen = y if censoring else to_unit(demand[t], low, high)
        ctx = None if context is None else context[t]
        next_a = _checked(provisioner.act(seen.copy(), short & censoring, ctx), n, provisioner)
        recent = np.concatenate([recent[:, 1:], seen[:, None]], axis=1)
        if recent_context is not None and ctx is not None:
            recent_context = np.concatenate([recent_context[:, 1:], ctx[:, None]], axis=1)
        new_high = next_high(low, high, a, short, streak, after=growth.after, factor=growth.factor)
        if (new_high != high).any():
            recent = np.clip(recent * ((high - low) / (new_high - low))[:, None], 0.0, 1.0)  # the bottom stays
            if isinstance(provisioner, FollowsRange):
                next_a = provisioner.moved(low, high, low, new_high)
            else:
                next_a = provisioner.start(recent.copy(), None if recent_context is None else recent_context.copy())
            next_a = _checked(next_a, n, provisioner)
            high = new_high
        a = next_a
    return GrowthLoopResult(record["capacity"], censored, record["high"], record["actions"])
