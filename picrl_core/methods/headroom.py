"""The rule operators write by hand: the recent maximum plus headroom (VPA-like, without VPA's histogram).

``A_{t+1} = (1 + h) max(Y_{t-W+1}, ..., Y_t)`` in native units, ``Y`` the observed usage (the capacity
itself on a short tick, so a run of shortages raises the capacity by ``1 + h`` per tick). ``W`` is one hour
of ticks (a common default); ``h`` is chosen on the validation split among :data:`HEADROOMS`
(:mod:`picrl_core.methods.selection`). The rule keeps its window in native units, so under the growth
protocol it carries over to a grown range exactly (:class:`~picrl_core.methods.growth.FollowsRange`).
"""

from __future__ import annotations

import math

import numpy as np

from picrl_core.config import PicRLConfig
from picrl_core.methods.base import Method, Provisioner
from picrl_core.methods.growth import FollowsRange
from picrl_core.methods.selection import select_on_validation
from picrl_core.scaling import from_unit, to_unit
from picrl_core.series import PreparedSeries

WINDOW_SECONDS = 3600.0  # W: the last hour of observations
HEADROOMS = (0.02, 0.05, 0.1, 0.2, 0.3)  # candidate h, chosen on validation (h = 0 never leaves a shortage)


class RecentMaxProvisioner(Provisioner, FollowsRange):
    """``a = to_unit((1 + h) max(last W native observations))`` per service, in ``[low, high]``."""

    def __init__(self, window: int, headroom: float, low: float, high: float) -> None:
        if window < 1 or headroom < 0:
            raise ValueError(f"window must be >= 1 and headroom >= 0; got {window}, {headroom}")
        self.window, self.headroom = window, headroom
        self.trained = (np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64))
        self.low, self.high = self.trained
        self._seen = np.empty((0, 0))  # (N, <= W) native observations, oldest first

    def _action(self) -> np.ndarray:
        return to_unit((1.0 + self.headroom) * self._seen.max(axis=1), self.low, self.high)

    def start(self, history: np.ndarray, history_context: np.ndarray | None) -> np.ndarray:
        self.low, self.high = self.trained  # a new run starts in the training range, wherever the last one moved
        self._seen = from_unit(np.asarray(history, dtype=np.float64)[:, -self.window :], self.low, self.high)
        return self._action()

    def act(self, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        native = from_unit(np.asarray(y, dtype=np.float64), self.low, self.high)
        self._seen = np.concatenate([self._seen, native[:, None]], axis=1)[:, -self.window :]
        return self._action()

    def moved(self, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray) -> np.ndarray:
        self.low, self.high = np.asarray(new_low, dtype=np.float64), np.asarray(new_high, dtype=np.float64)
        return self._action()


def fit_recent_max(series: PreparedSeries, config: PicRLConfig, *, step_seconds: float = 60.0) -> RecentMaxProvisioner:
    """The rule with ``W`` one hour of ticks and ``h`` of lowest validation regret (ties: the smaller)."""
    window = max(1, math.ceil(WINDOW_SECONDS / step_seconds))
    low, high = series.scaler.low, series.scaler.high
    chosen = select_on_validation(
        HEADROOMS, lambda h: RecentMaxProvisioner(window, h, low, high), series, config
    ).chosen
    return RecentMaxProvisioner(window, chosen, low, high)


METHOD = Method(
    "recent-max",
    "Recent max + headroom",
    "The hand-written operator rule: (1 + h) times the maximum of the last hour's usage, h chosen on validation",
    "operator",
    fit_recent_max,
    timed=True,
)
