"""The growth protocol: every method runs on the unclipped demand, in a range that moves as the stream's does.

The paper's protocol (Sec. 4.1.1) clips validation and test demand to the training range ``[L, H]``, so a
fleet that outgrows its history is scored on a flat 1.0. A stream worker instead keeps each service in a
range ``[L_t, H_t]``, grows it when it is outgrown and lowers its floor when the usage stays below it
(``stream.ranges``, :func:`~picrl_core.scaling.next_high`, :func:`~picrl_core.scaling.next_low`).
:func:`run_growth_loop` is that loop offline, tick by tick as the worker applies it:

* capacity in force ``A_t = L_t + a_t (H_t - L_t)`` (native), usage ``u_t = min(D_t, A_t)``, ``c_t = 1[D_t > A_t]``;
* the provisioner sees ``y_t = a_t`` when short, else ``clip((u_t - L_t) / (H_t - L_t), 0, 1)``;
* it decides ``a_{t+1}``, then ``H_{t+1} = L_t + g (H_t - L_t)`` when ``c_t``, ``a_t = 1`` and this is the
  ``n``-th short tick in a row or later (``g = range_growth``, ``n = grow_after``), else ``H_t``;
* ``L_{t+1} = rho u_t`` when ``u_t < L_t`` on the ``m``-th unshort tick in a row below the floor (``rho = floor_share``,
  ``m = shrink_after``; the run restarts on a lowered floor), else ``L_t``;
* on a moved range, a provisioner that can carry its state over (:class:`FollowsRange`: PIC-RL, by
  :meth:`~picrl_core.controller.PicRLController.rescale`, exactly as the worker) re-expresses it; any other
  restarts from its last ``H`` feedback values re-expressed in the new range (its offline history's length),
  as an operator re-bases a recommender on its recent log. On a fleet every service of the provisioner
  restarts when one service's range moves.

Demand below ``L_t`` is seen as 0 and the capacity never goes below ``L_t``; ``m`` ticks of it bring ``L_t`` down.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from picrl_core.methods.base import Provisioner, _checked
from picrl_core.scaling import floor_streak, from_unit, next_high, next_low, to_unit


@dataclass(frozen=True)
class RangeGrowth:
    """The worker's range rules (``stream.engine_settings``: ``range_growth``, ``grow_after``, ``shrink_after``,
    ``floor_share``)."""

    factor: float = 2.0
    after: int = 3
    shrink_after: int = 3  # 0: floors never come down
    floor_share: float = 0.5


STREAM_GROWTH = RangeGrowth()  # the worker's defaults


class FollowsRange(ABC):
    """A provisioner whose state can be carried over to a moved range."""

    @abstractmethod
    def moved(self, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray) -> np.ndarray:
        """Express the state in ``[new_low, new_high]`` (per service) instead of ``[low, high]``; returns the
        pending actions in the new ranges ``(N,)``."""


@dataclass(frozen=True)
class GrowthLoopResult:
    """Each tick's native capacity in force, shortage flag and range, ``(T, N)``; the actions in [0, 1]
    of the range in force."""

    capacity: np.ndarray
    censored: np.ndarray
    low: np.ndarray
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
    from ``history`` ``(N, H)`` (in [0, 1] of that range) and moving as the module says. ``censoring=False``
    (a full-information reference) reveals ``clip((D_t - L_t) / (H_t - L_t), 0, 1)`` and no flag; the ranges still
    move on the shortages and the usage."""
    demand = np.asarray(demand, dtype=np.float64)
    if demand.ndim != 2:
        raise ValueError(f"demand must have shape (ticks, services); got {demand.shape}")
    steps, n = demand.shape
    low = np.broadcast_to(np.asarray(low, dtype=np.float64), (n,)).copy()
    high = np.broadcast_to(np.asarray(high, dtype=np.float64), (n,)).copy()
    recent = np.array(history, dtype=np.float64)
    recent_context = None if history_context is None else np.array(history_context, dtype=np.float64)
    record = {name: np.empty((steps, n)) for name in ("capacity", "low", "high", "actions")}
    censored = np.empty((steps, n), dtype=bool)
    streak = np.zeros(n, dtype=np.int64)
    below = np.zeros(n, dtype=np.int64)  # the worker's row field floor_streak
    a = _checked(provisioner.start(recent.copy(), history_context), n, provisioner)
    for t in range(steps):
        capacity = from_unit(a, low, high)
        short = demand[t] > capacity
        usage = np.minimum(demand[t], capacity)
        y = np.where(short, a, to_unit(usage, low, high))
        streak = np.where(short, streak + 1, 0)
        below = floor_streak(below, usage, low, short)
        record["capacity"][t], record["low"][t], record["high"][t] = capacity, low, high
        record["actions"][t], censored[t] = a, short
        if t + 1 == steps:
            break
        seen = y if censoring else to_unit(demand[t], low, high)
        ctx = None if context is None else context[t]
        next_a = _checked(provisioner.act(seen.copy(), short & censoring, ctx), n, provisioner)
        recent = np.concatenate([recent[:, 1:], seen[:, None]], axis=1)
        if recent_context is not None and ctx is not None:
            recent_context = np.concatenate([recent_context[:, 1:], ctx[:, None]], axis=1)
        new_high = next_high(low, high, a, short, streak, after=growth.after, factor=growth.factor)
        new_low, below = next_low(low, usage, below, after=growth.shrink_after, share=growth.floor_share)
        if (new_high != high).any() or (new_low != low).any():
            native = low[:, None] + recent * (high - low)[:, None]
            recent = np.clip((native - new_low[:, None]) / (new_high - new_low)[:, None], 0.0, 1.0)
            if isinstance(provisioner, FollowsRange):
                next_a = provisioner.moved(low, high, new_low, new_high)
            else:
                next_a = provisioner.start(recent.copy(), None if recent_context is None else recent_context.copy())
            next_a = _checked(next_a, n, provisioner)
            low, high = new_low, new_high
        a = next_a
    return GrowthLoopResult(record["capacity"], censored, record["low"], record["high"], record["actions"])
