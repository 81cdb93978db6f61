"""The interface of the order PIC-RL's controller acts on.

Every rule turns Eq. (11)'s planned sum ``g = mu + k sigma + m + b + e`` into the order before its clip to ``[0, 1]``:
the ``tau`` quantile (``tau`` the critical fractile, :func:`~picrl_core.costs.critical_ratio`) of the predictive
distribution of the next demand that the rule assumes. A controller picks its rule once
(:func:`~picrl_core.orders.choice.order_rule`), so no switch is tested on a tick.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from picrl_core.config import PicRLConfig
from picrl_core.costs import critical_ratio


class OrderRule(ABC):
    """The order for a batch of services from the planned sum and the state the controller keeps."""

    acts_on_repeat: bool = False  # the repeat share p also counts a shortage at or above v and skips bound pairs

    def __init__(self, config: PicRLConfig) -> None:
        self.fractile = critical_ratio(config.cost)
        self.recent = slice(-config.estimator.window, None)  # the estimator's window of the controller's

    @abstractmethod
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
        """The order before its clip, ``(B,)``: from the planned sum ``g``, the scale ``sigma``, the repeat share ``p``
        and last demand seen ``v`` (``fresh``: the last tick was seen), and the window ``(B, W)`` of ``(y, c)``."""

    def pending_idle(self, observations: np.ndarray, censored: np.ndarray) -> np.ndarray | None:
        """The idle mass ``pi`` the order was planned with, from its window ``(B, W)``; None: the rule has none."""
        return None
