"""The asymmetric provisioning cost, Eq. (1), and the evaluation metrics built on it (Sec. 2, 4.1.4).

Metric functions take ``actions`` and ``demand`` as ``(T,)`` (one service) or ``(T, N)`` (``N``
services side by side, time on axis 0). A ``(T, N)`` episode is pooled: MAE, shortage rate and the
masses treat every ``(t, service)`` decision as one step, regret sums over all of them, and
:func:`cumulative_regret` accumulates the per-tick cost summed over services.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import ArrayLike

from picrl_core.config import CostConfig


class EpisodeShapeError(ValueError):
    """Actions and demand that do not form one episode: different shapes, empty, not 1-D/2-D."""


def critical_ratio(cost: CostConfig) -> float:
    """``c_under / (c_under + c_over)``: the demand quantile that minimises the expected cost Eq. (1) (the
    newsvendor's critical fractile); a cost-optimal provisioner is short ``1 - critical_ratio`` of the time."""
    return cost.c_under / (cost.c_under + cost.c_over)


def asymmetric_cost(a: ArrayLike, d: ArrayLike, cost: CostConfig) -> np.ndarray:
    """Eq. (1): ``l(a, d) = c_under (d - a)_+ + c_over (a - d)_+``, elementwise (broadcasting)."""
    gap = np.asarray(d, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    return cost.c_under * np.maximum(gap, 0.0) + cost.c_over * np.maximum(-gap, 0.0)


@dataclass(frozen=True)
class EpisodeMetrics:
    """What one evaluated episode is reported by (pooled over services for ``(T, N)`` input).

    ``mae``: mean ``|a - d|``; ``regret``: Eq. (2), the summed cost; ``shortage_rate``: share of
    steps with ``d > a`` (censored steps); ``under_mass``/``over_mass``: summed ``(d - a)_+`` and
    ``(a - d)_+``; ``action_variance``: variance of the actions over time (population variance,
    averaged over services for ``(T, N)``, so level differences between services do not count);
    ``steps``: number of pooled decisions (``T`` or ``T * N``).
    """

    mae: float
    regret: float
    shortage_rate: float
    under_mass: float
    over_mass: float
    action_variance: float
    steps: int

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _episode_arrays(actions: ArrayLike, demand: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(actions, dtype=np.float64)
    d = np.asarray(demand, dtype=np.float64)
    if a.shape != d.shape:
        raise EpisodeShapeError(f"actions have shape {a.shape} but demand has shape {d.shape}")
    if a.ndim not in (1, 2) or a.size == 0:
        raise EpisodeShapeError(f"an episode is a non-empty (T,) or (T, N) array; got shape {a.shape}")
    return a, d


def episode_metrics(actions: ArrayLike, demand: ArrayLike, cost: CostConfig) -> EpisodeMetrics:
    """Metrics of one episode of actions ``a_t`` against the true demand ``d_t`` (Sec. 4.1.4)."""
    a, d = _episode_arrays(actions, demand)
    gap = d - a
    return EpisodeMetrics(
        mae=float(np.mean(np.abs(gap))),
        regret=float(np.sum(asymmetric_cost(a, d, cost))),
        shortage_rate=float(np.mean(gap > 0.0)),
        under_mass=float(np.sum(np.maximum(gap, 0.0))),
        over_mass=float(np.sum(np.maximum(-gap, 0.0))),
        action_variance=float(np.mean(np.var(a, axis=0))),
        steps=int(a.size),
    )


def per_service_metrics(actions: ArrayLike, demand: ArrayLike, cost: CostConfig) -> list[EpisodeMetrics]:
    """:func:`episode_metrics` of each service (column) of ``(T, N)`` episodes."""
    a, d = _episode_arrays(actions, demand)
    a, d = (a, d) if a.ndim == 2 else (a[:, None], d[:, None])
    return [episode_metrics(a[:, j], d[:, j], cost) for j in range(a.shape[1])]


def mean_service_metrics(actions: ArrayLike, demand: ArrayLike, cost: CostConfig) -> EpisodeMetrics:
    """The metrics of a fleet's ``(T, N)`` episodes as the mean over services of each one's
    :func:`episode_metrics` (``steps`` is ``T``); for one service, its own metrics."""
    each = per_service_metrics(actions, demand, cost)
    means = {
        name: float(np.mean([getattr(m, name) for m in each]))
        for name in ("mae", "regret", "shortage_rate", "under_mass", "over_mass", "action_variance")
    }
    return EpisodeMetrics(**means, steps=each[0].steps)


def cumulative_regret(actions: ArrayLike, demand: ArrayLike, cost: CostConfig) -> np.ndarray:
    """``(T,)`` running Eq. (2): ``sum_{s <= t} l(a_s, d_s)`` (summed over services for ``(T, N)``).

    The last entry equals :func:`episode_metrics`'s ``regret``.
    """
    a, d = _episode_arrays(actions, demand)
    per_tick = asymmetric_cost(a, d, cost)
    if per_tick.ndim == 2:
        per_tick = per_tick.sum(axis=1)
    return np.cumsum(per_tick)
