"""The paper's order: Eq. (11)'s sum itself, the ``tau`` quantile of ``N(g - z* sigma, sigma^2)``."""

from __future__ import annotations

import numpy as np

from picrl_core.orders.order import OrderRule


class GaussianOrder(OrderRule):
    """``a = g = mu + k sigma + m + b + e`` (Eq. 11 before its clip)."""

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
        return planned
