"""One-sided conformal calibration on the Phase-1 predictor as a deployable rule (:mod:`picrl_core.methods.conformal`
says the method: ``a = clip(mu + q, 0, 1)``, ``q`` the ACI-adapted conformal ``1 - alpha_t`` quantile of the service's
pool of recent residuals, a censored one entering as ``+inf``).

Per service the record keeps the predictor's window (:mod:`picrl_core.rules.feed`), the pending ``mu``, ``alpha_t`` and
the pool of the last ``n`` residuals in float32 (``n = 256``: 1 KiB). Every service starts from the seed pool fitted
offline (the validation split's residuals) and the chosen ACI step, both in the artifact. On a moved range the pool's
residuals scale with the span, as the controller's spreads do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from picrl_core.artifact import ArtifactError, ModelArtifact
from picrl_core.calibrator import feedback
from picrl_core.costs import critical_ratio
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.rules.base import RecordRule
from picrl_core.rules.feed import feed_fields, move_feed, predict_feed, push_feed, range_move, start_feed


def conformal_quantile(residuals: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Per row of ``residuals`` ``(N, n)``: the ``ceil((n + 1)(1 - alpha))``-th smallest value, ``+inf``
    when that rank exceeds ``n`` (rank clipped to at least 1)."""
    n = residuals.shape[1]
    rank = np.ceil((n + 1) * (1.0 - np.asarray(alpha, dtype=np.float64)) - 1e-9).astype(np.int64)
    rank = np.clip(rank, 1, n + 1)
    ordered = np.sort(residuals, axis=1)
    picked = np.take_along_axis(ordered, np.minimum(rank, n)[:, None] - 1, axis=1)[:, 0]
    return np.where(rank <= n, picked, np.inf)


class ConformalRule(RecordRule):
    """``order = mu + q`` per service; ``calibration`` the seed pool ``(n,)`` (or ``(B, n)``: one per service, in the
    comparison's fleets), ``alpha`` the target miscoverage, ``step`` the ACI step."""

    method = "conformal"

    def __init__(self, model: GaussianLSTM, calibration: np.ndarray, alpha: float, step: float, chunk: int) -> None:
        self.model, self.chunk = model, chunk
        self.calibration = np.asarray(calibration, dtype=np.float32)
        self.alpha, self.aci_step = alpha, step
        super().__init__()

    @classmethod
    def from_artifact(cls, artifact: ModelArtifact) -> ConformalRule:
        """The rule of a ``picrl train --method conformal`` model: its predictor, seed pool and ACI step, the target
        miscoverage of the config's costs."""
        if artifact.predictor is None:
            raise ArtifactError("a conformal model needs its Phase-1 predictor")
        parameters, config = artifact.parameters, artifact.config
        alpha = 1.0 - critical_ratio(config.cost)
        chunk = config.online.inference_chunk
        return cls(artifact.predictor, np.array(parameters["calibration"]), alpha, parameters["aci_step"], chunk)

    def parameters(self) -> dict[str, Any]:
        return {"calibration": self.calibration.tolist(), "aci_step": self.aci_step}

    def fields(self) -> list[tuple[Any, ...]]:
        cfg = self.model.cfg
        pool = self.calibration.shape[-1]
        return [*feed_fields(cfg.window, cfg.context_channels), ("alpha_t", "<f8"), ("residuals", "<f4", (pool,))]

    def start(
        self, state: np.recarray, history: np.ndarray, low: np.ndarray, high: np.ndarray, context: np.ndarray | None
    ) -> None:
        start_feed(state, history, context, self.model.cfg.context_channels)
        state.residuals = np.broadcast_to(self.calibration, state.residuals.shape)
        state.alpha_t = self.alpha
        self._order(state)

    def advance(self, state: np.recarray, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> None:
        shortage, _ = feedback(y, state.action, censored)
        known = ~censored | shortage  # a lower bound below the action (coupled censoring) updates nothing
        residual = np.where(censored, np.inf, y - state.mu).astype(np.float32)
        shifted = np.concatenate([state.residuals[:, 1:], residual[:, None]], axis=1)
        state.residuals = np.where(known[:, None], shifted, state.residuals)
        state.alpha_t = np.where(known, state.alpha_t + self.aci_step * (self.alpha - shortage), state.alpha_t)
        push_feed(state, y, censored, context)
        self._order(state)

    def moved(
        self, state: np.recarray, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray
    ) -> None:
        ratio, shift = range_move(low, high, new_low, new_high)
        move_feed(state, ratio, shift)
        state.mu = state.mu * ratio + shift
        state.residuals = (np.asarray(state.residuals) * ratio[:, None]).astype(np.float32)
        self._quantile(state)

    def _order(self, state: np.recarray) -> None:
        """The order of the window in force (the forecast's ``mu`` and ``sigma`` in the breakdown)."""
        state.mu, state.sigma = predict_feed(self.model, state, self.chunk)
        self._quantile(state)

    @staticmethod
    def _quantile(state: np.recarray) -> None:
        """``order = mu + q``; the breakdown's ``margin`` is ``q``, or the distance to the top of the range where ``q``
        is infinite (an action record holds finite numbers)."""
        quantile = conformal_quantile(np.asarray(state.residuals), state.alpha_t)
        state.order = state.mu + quantile
        state.margin = np.where(np.isfinite(quantile), quantile, 1.0 - state.mu)
