"""The repeat mixture's order: the ``tau`` quantile of ``p 1[x >= v] + (1 - p) G(x)`` (:mod:`picrl_core.repeats`)."""

from __future__ import annotations

import numpy as np

from picrl_core.orders.order import OrderRule
from picrl_core.repeats import repeat_quantile


class RepeatMixtureOrder(OrderRule):
    """:func:`~picrl_core.repeats.repeat_quantile` around the planned sum (``estimator.act_on_repeat``)."""

    acts_on_repeat = True

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
        return repeat_quantile(planned, sigma, repeat_share, last_seen, fresh, self.fractile)
