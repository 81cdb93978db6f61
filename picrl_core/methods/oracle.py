"""The hindsight bound of Table 2: the best constant buffer on the true previous demand.

It is not a method: it is the only provisioner allowed to read the test split (``series.test``) in its
fit, and it acts on the *true* demand, which no method sees. Precisely: with ``d_{-1}`` the last
validation value (the end of the uncensored history the test episode starts from) and ``d_0..d_{T-1}``
the test demand,

    a_t = clip(d_{t-1} + b*, 0, 1),   b* = argmin_b sum_{t=0}^{T-1} l(clip(d_{t-1} + b, 0, 1), d_t),

``l`` the asymmetric cost Eq. (1). The total is piecewise linear in ``b`` with kinks where some
``d_{t-1} + b`` meets ``d_t``, 0 or 1, so ``b*`` is the best of those kinks (:func:`hindsight_buffer`).
Without the clip, ``b*`` is the ``c_under / (c_under + c_over)`` quantile of the increments
``d_t - d_{t-1}``: the newsvendor on the persistence forecast with the increments' distribution known
in hindsight. It bounds what a persistence-plus-buffer rule can reach, not every forecaster (a
predictor that beats persistence can beat it).

Online, the provisioner replays ``series.test`` tick by tick (the loop's demand must be the test split,
one copy per service, as :func:`picrl_core.pipeline.evaluation_inputs` builds it); every uncensored
observation is checked against it, so running it on other demand fails loudly.
"""

from __future__ import annotations

import numpy as np

from picrl_core.config import CostConfig, PicRLConfig
from picrl_core.costs import asymmetric_cost
from picrl_core.methods.base import Provisioner
from picrl_core.series import PreparedSeries


def hindsight_buffer(previous: np.ndarray, demand: np.ndarray, cost: CostConfig) -> float:
    """``b*`` minimising ``f(b) = sum_t l(clip(previous_t + b, 0, 1), demand_t)`` (``(T,)`` arrays).

    Term ``t`` has slope 0 in ``b`` below ``-previous_t`` (action clipped to 0), ``-c_under`` up to
    ``demand_t - previous_t``, ``c_over`` up to ``1 - previous_t`` and 0 above (clipped to 1); ``f`` is
    swept along the sorted kinks from its value ``sum_t l(0, demand_t)`` below all of them.
    """
    previous = np.asarray(previous, dtype=np.float64)
    demand = np.asarray(demand, dtype=np.float64)
    n = previous.size
    kinks = np.concatenate([-previous, demand - previous, 1.0 - previous])
    changes = np.repeat([-cost.c_under, cost.c_under + cost.c_over, -cost.c_over], n)
    order = np.argsort(kinks, kind="stable")
    kinks, slope = kinks[order], np.cumsum(changes[order])  # slope[i]: on [kinks[i], kinks[i + 1])
    total = asymmetric_cost(0.0, demand, cost).sum() + np.concatenate([[0.0], np.cumsum(slope[:-1] * np.diff(kinks))])
    return float(kinks[np.argmin(total)])


class OracleProvisioner(Provisioner):
    """Replays the true demand: ``a_{t+1} = clip(d_t + b*, 0, 1)`` for every service."""

    def __init__(self, demand: np.ndarray, buffer: np.ndarray) -> None:
        self.demand = np.asarray(demand, dtype=np.float64)  # (T, N)
        self.buffer = np.asarray(buffer, dtype=np.float64)  # (N,): each service's b*

    def start(self, history: np.ndarray, history_context: np.ndarray | None) -> np.ndarray:
        history = np.asarray(history, dtype=np.float64)
        if history.ndim != 2 or history.shape[1] < 1:
            raise ValueError(f"history must have shape (services, steps >= 1); got {history.shape}")
        self.tick = 0
        return np.clip(history[:, -1] + self.buffer, 0.0, 1.0)

    def act(self, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        if self.tick >= self.demand.shape[0]:
            raise ValueError(f"the oracle knows {self.demand.shape[0]} test ticks; the loop ran longer")
        d = self.demand[self.tick]
        y = np.asarray(y, dtype=np.float64)
        if np.any(~np.asarray(censored, dtype=bool) & (np.abs(y - d) > 1e-9)):
            raise ValueError(
                f"tick {self.tick}: the observed demand is not series.test's; the oracle only replays the test split"
            )
        self.tick += 1
        return np.clip(np.broadcast_to(d + self.buffer, y.shape), 0.0, 1.0)


def fit_oracle(series: PreparedSeries, config: PicRLConfig) -> OracleProvisioner:
    """Reads ``series.test`` (and the last validation value): the bound, not a method; each service of a
    fleet gets its own ``b*``."""
    test = series.by_service("test")
    previous = np.concatenate([series.by_service("val")[:, -1:], test[:, :-1]], axis=1)
    return OracleProvisioner(test.T, np.array([hindsight_buffer(p, d, config.cost) for p, d in zip(previous, test)]))
