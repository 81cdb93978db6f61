"""How a method meets demand above its training range (the growth protocol, :mod:`picrl_core.methods.growth`).

For one service with native demand ``D_t``, native capacity in force ``A_t`` (``t = 0..T-1``) and training
peak ``P`` (the top of the training range):

* ``shortfall_above_peak = sum_{t: D_t > P} (D_t - A_t)_+``: native unit-ticks short while demand is above
  the historical peak;
* ``ticks_above_peak = #{t: D_t > P}``;
* ``catch_up_ticks = t_1 - t_0``: ``t_0`` the first tick with ``D_t > P`` (the outgrowth), ``t_1`` the first
  tick ``>= t_0`` with ``A_t >= D_t`` (caught up); ``T - t_0`` when it never catches up (a lower bound),
  NaN when demand never outgrows ``P``;
* ``over_cost_native = c_over sum_t (A_t - D_t)_+``: the over-provisioning cost in native units.

A fleet's values are the mean over its services (``catch_up_ticks`` over the services that outgrew).
"""

from __future__ import annotations

import numpy as np

from picrl_core.config import CostConfig


def catch_up_ticks(capacity: np.ndarray, demand: np.ndarray, peak: float) -> float:
    """``t_1 - t_0`` of one service's ``(T,)`` arrays (see the module); NaN when ``D_t <= P`` throughout."""
    above = np.flatnonzero(demand > peak)
    if above.size == 0:
        return float("nan")
    start = int(above[0])
    covered = np.flatnonzero(capacity[start:] >= demand[start:])
    return float(covered[0] if covered.size else demand.size - start)


def growth_metrics(capacity: np.ndarray, demand: np.ndarray, peak: float, cost: CostConfig) -> dict[str, float]:
    """The module's metrics of ``(T,)`` or ``(T, N)`` native capacity and demand, ``peak`` the training top."""
    a = np.asarray(capacity, dtype=np.float64)
    d = np.asarray(demand, dtype=np.float64)
    if a.shape != d.shape or a.ndim not in (1, 2) or a.size == 0:
        raise ValueError(f"capacity {a.shape} and demand {d.shape} must be one non-empty (T,) or (T, N) episode")
    a, d = (a[:, None], d[:, None]) if a.ndim == 1 else (a, d)
    above = d > peak
    catch_up = [catch_up_ticks(a[:, j], d[:, j], peak) for j in range(a.shape[1])]
    return {
        "shortfall_above_peak": float(np.mean(np.sum(np.where(above, np.maximum(d - a, 0.0), 0.0), axis=0))),
        "ticks_above_peak": float(np.mean(above.sum(axis=0))),
        "catch_up_ticks": float(np.nanmean(catch_up)) if not np.isnan(catch_up).all() else float("nan"),
        "over_cost_native": float(np.mean(cost.c_over * np.sum(np.maximum(a - d, 0.0), axis=0))),
    }
