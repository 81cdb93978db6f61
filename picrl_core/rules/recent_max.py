"""The rule operators write by hand as a deployable rule: the recent maximum plus headroom.

``A_{t+1} = (1 + h) max(Y_{t-W+1}, ..., Y_t)`` in native units, ``Y`` the observed usage (the capacity itself on a
short tick, so a run of shortages raises the capacity by ``1 + h`` per tick). Each service's record keeps its last
``W`` native observations (``-inf`` before it has seen ``W``) and its native range, so a moved range changes only
the unit of the order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from picrl_core.rules.base import RecordRule
from picrl_core.scaling import from_unit


class RecentMaxRule(RecordRule):
    """``order = ((1 + h) max(last W native observations) - low) / (high - low)`` per service."""

    method = "recent-max"

    def __init__(self, window: int, headroom: float) -> None:
        if window < 1 or headroom < 0:
            raise ValueError(f"window must be >= 1 and headroom >= 0; got {window}, {headroom}")
        self.window, self.headroom = window, headroom
        super().__init__()

    @classmethod
    def from_parameters(cls, parameters: dict[str, Any]) -> RecentMaxRule:
        return cls(int(parameters["window"]), float(parameters["headroom"]))

    def parameters(self) -> dict[str, Any]:
        return {"window": self.window, "headroom": self.headroom}

    def fields(self) -> list[tuple[Any, ...]]:
        return [("low", "<f8"), ("high", "<f8"), ("seen", "<f8", (self.window,))]

    def start(
        self, state: np.recarray, history: np.ndarray, low: np.ndarray, high: np.ndarray, context: np.ndarray | None
    ) -> None:
        state.low, state.high = low, high
        recent = from_unit(history[:, -self.window :], low[:, None], high[:, None])
        seen = np.full((len(state), self.window), -np.inf)
        seen[:, self.window - recent.shape[1] :] = recent
        state.seen = seen
        self._order(state)

    def advance(self, state: np.recarray, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> None:
        native = from_unit(y, state.low, state.high)
        state.seen = np.concatenate([state.seen[:, 1:], native[:, None]], axis=1)
        self._order(state)

    def moved(
        self, state: np.recarray, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray
    ) -> None:
        state.low, state.high = new_low, new_high
        self._order(state)

    def _order(self, state: np.recarray) -> None:
        """The order of the window in force; the breakdown's ``mu`` is the recent maximum, ``margin`` its headroom."""
        peak = state.seen.max(axis=1)
        span = state.high - state.low
        state.order = ((1.0 + self.headroom) * peak - state.low) / span
        state.mu = (peak - state.low) / span
        state.margin = self.headroom * peak / span
