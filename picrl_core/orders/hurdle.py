"""The hurdle's order: the ``tau`` quantile of ``pi 1[x >= 0] + (1 - pi) H(x)`` (:mod:`picrl_core.idle`), ``H`` the
repeat mixture or the Gaussian."""

from __future__ import annotations

import numpy as np

from picrl_core.config import PicRLConfig
from picrl_core.idle import hurdle_quantile, idle_share
from picrl_core.orders.order import OrderRule


class HurdleOrder(OrderRule):
    """:func:`~picrl_core.idle.hurdle_quantile` with the idle mass of the estimator's window
    (``estimator.idle_hurdle``); ``busy``: the continuous part (its repeat share used only if it acts on repeats)."""

    def __init__(self, config: PicRLConfig, busy: OrderRule) -> None:
        super().__init__(config)
        self.acts_on_repeat = busy.acts_on_repeat

    def order(
        self,
        planned: np.ndarray,
        sigma: np.ndarray,
        repeat_share: np.ndarray,
        last_seen: np.ndarray,
        fresh: np.ndarray,
        observations: np.ndarray,
        censored: np.ndarray,
    ) -> np.ndarray:
        idle = idle_share(observations[:, self.recent], censored[:, self.recent])
        share = repeat_share if self.acts_on_repeat else np.zeros_like(repeat_share)
        return hurdle_quantile(planned, sigma, share, last_seen, fresh, idle, self.fractile)

    def pending_idle(self, observations: np.ndarray, censored: np.ndarray) -> np.ndarray:
        return idle_share(observations[:, self.recent], censored[:, self.recent])
