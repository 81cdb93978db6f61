"""The Kaplan-Meier newsvendor as a deployable rule (:mod:`picrl_core.methods.newsvendor` says the method): the
critical-fractile quantile of the product-limit estimator of each service's last ``W`` observations ``(y, c)``, or
``KM_TAIL_STEP`` above their maximum where the quantile is not identified. The record keeps that window (float64);
on a moved range its levels move as the controller's window does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from picrl_core.artifact import ModelArtifact
from picrl_core.costs import critical_ratio
from picrl_core.rules.base import RecordRule
from picrl_core.rules.feed import range_move

KM_TAIL_STEP = 0.05  # step above the largest observation when the KM quantile is not identified


def kaplan_meier_quantile(y: np.ndarray, censored: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``y``/``censored`` ``(N, W)``: the ``level`` quantile ``inf{x : F_KM(x) >= level}`` of the
    product-limit estimator ``1 - F_KM(x) = prod_{uncensored y_i <= x} (1 - 1/n_i)`` (``n_i`` at risk;
    at ties, deaths before censorings), and whether it is identified (else the quantile is NaN).
    Without censoring it is the empirical quantile ``sorted(y)[ceil(level * W) - 1]``."""
    y = np.asarray(y, dtype=np.float64)
    censored = np.asarray(censored, dtype=bool)
    order = np.lexsort((censored, y), axis=-1)
    ys = np.take_along_axis(y, order, axis=1)
    cs = np.take_along_axis(censored, order, axis=1)
    at_risk = y.shape[1] - np.arange(y.shape[1])
    survival = np.cumprod(np.where(cs, 1.0, 1.0 - 1.0 / at_risk), axis=1)
    reached = ~cs & (1.0 - survival >= level - 1e-12)
    identified = np.any(reached, axis=1)
    quantile = np.take_along_axis(ys, np.argmax(reached, axis=1)[:, None], axis=1)[:, 0]
    return np.where(identified, quantile, np.nan), identified


class KaplanMeierRule(RecordRule):
    """``order`` = the ``ratio`` quantile of the window's product-limit estimator."""

    method = "kaplan-meier"

    def __init__(self, window: int, ratio: float) -> None:
        if window < 1:
            raise ValueError(f"the newsvendor window must be >= 1, got {window}")
        self.window, self.ratio = window, ratio
        super().__init__()

    @classmethod
    def from_artifact(cls, artifact: ModelArtifact) -> KaplanMeierRule:
        """The rule of a ``picrl train --method kaplan-meier`` model (the fractile of the config's costs)."""
        return cls(int(artifact.parameters["window"]), critical_ratio(artifact.config.cost))

    def parameters(self) -> dict[str, Any]:
        return {"window": self.window}

    def fields(self) -> list[tuple[Any, ...]]:
        return [("seen", "<f8", (self.window,)), ("seen_censored", "?", (self.window,))]

    def start(
        self, state: np.recarray, history: np.ndarray, low: np.ndarray, high: np.ndarray, context: np.ndarray | None
    ) -> None:
        missing = self.window - history.shape[1]
        padded = (
            np.concatenate([np.repeat(history[:, :1], missing, axis=1), history], axis=1) if missing > 0 else history
        )
        state.seen = padded[:, -self.window :]
        state.seen_censored = False
        self._order(state)

    def advance(self, state: np.recarray, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> None:
        state.seen = np.concatenate([state.seen[:, 1:], y[:, None]], axis=1)
        state.seen_censored = np.concatenate([state.seen_censored[:, 1:], censored[:, None]], axis=1)
        self._order(state)

    def moved(
        self, state: np.recarray, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray
    ) -> None:
        ratio, shift = range_move(low, high, new_low, new_high)
        state.seen = np.clip(state.seen * ratio[:, None] + shift[:, None], 0.0, 1.0)
        self._order(state)

    def _order(self, state: np.recarray) -> None:
        """The breakdown's ``mu`` is the order (the estimator's quantile; no margin)."""
        quantile, identified = kaplan_meier_quantile(state.seen, state.seen_censored, self.ratio)
        state.order = np.where(identified, quantile, np.asarray(state.seen).max(axis=1) + KM_TAIL_STEP)
        state.mu = state.order
