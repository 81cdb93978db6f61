"""The censored newsvendor learner by projected stochastic gradient as a deployable rule
(:mod:`picrl_core.methods.censored_sgd` says the method):

    q_{t+1} = Proj(q_t + eps [c_under 1(d_t > a_t) - c_over 1(d_t < a_t)]),    a_t = clip(base_t + q_t, 0, 1),

``base`` 0 (standalone, ``q`` projected on ``[0, 1]``: ``sgd``) or the Phase-1 predictor's ``mu`` (``q`` on
``[-1, 1]``: ``sgd-residual``). Per service the record keeps ``q`` (and, on ``mu``, the predictor's window). On a
moved range the standalone ``q`` is a level (affine), the residual's a spread (it scales with the span).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from picrl_core.artifact import ModelArtifact
from picrl_core.calibrator import feedback
from picrl_core.config import CostConfig
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.rules.base import RecordRule
from picrl_core.rules.feed import feed_fields, move_feed, predict_feed, push_feed, range_move, start_feed


class CensoredSGDRule(RecordRule):
    """``order = base + q`` per service with ``q`` on the censored subgradient, started at ``start``."""

    def __init__(
        self, step: float, cost: CostConfig, start: float, *, predictor: GaussianLSTM | None = None, chunk: int = 1
    ) -> None:
        if step <= 0:
            raise ValueError(f"the SGD step must be positive; got {step}")
        self.eps, self.cost, self.start_offset = step, cost, start
        self.predictor, self.chunk = predictor, chunk
        self.bounds = (0.0, 1.0) if predictor is None else (-1.0, 1.0)
        self.method = "sgd" if predictor is None else "sgd-residual"
        super().__init__()

    @classmethod
    def from_artifact(cls, artifact: ModelArtifact) -> CensoredSGDRule:
        """The rule of a ``picrl train --method sgd`` (``sgd-residual``: with its predictor) model."""
        parameters, config = artifact.parameters, artifact.config
        return cls(
            parameters["step"],
            config.cost,
            parameters["start"],
            predictor=artifact.predictor,
            chunk=config.online.inference_chunk,
        )

    def parameters(self) -> dict[str, Any]:
        return {"step": self.eps, "start": self.start_offset}

    def fields(self) -> list[tuple[Any, ...]]:
        feed = (
            []
            if self.predictor is None
            else feed_fields(self.predictor.cfg.window, self.predictor.cfg.context_channels)
        )
        return [*feed, ("offset", "<f8")]

    def start(
        self, state: np.recarray, history: np.ndarray, low: np.ndarray, high: np.ndarray, context: np.ndarray | None
    ) -> None:
        if self.predictor is not None:
            start_feed(state, history, context, self.predictor.cfg.context_channels)
        state.offset = self.start_offset
        self._order(state)

    def advance(self, state: np.recarray, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> None:
        shortage, over = feedback(y, state.action, censored)
        gradient = self.cost.c_under * shortage - self.cost.c_over * over
        state.offset = np.clip(state.offset + self.eps * gradient, *self.bounds)
        if self.predictor is not None:
            push_feed(state, y, censored, context)
        self._order(state)

    def moved(
        self, state: np.recarray, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray
    ) -> None:
        ratio, shift = range_move(low, high, new_low, new_high)
        if self.predictor is None:  # q is the order itself: a level
            state.offset = np.clip(state.offset * ratio + shift, *self.bounds)
        else:  # q is a residual: a spread; mu moves with the window
            move_feed(state, ratio, shift)
            state.offset = np.clip(state.offset * ratio, *self.bounds)
            state.mu = state.mu * ratio + shift
        state.margin = state.offset
        state.order = state.mu + state.offset

    def _order(self, state: np.recarray) -> None:
        """The breakdown's ``mu`` is the base (the forecast's, or 0), ``margin`` ``q``."""
        if self.predictor is not None:
            state.mu, state.sigma = predict_feed(self.predictor, state, self.chunk)
        state.margin = state.offset
        state.order = state.mu + state.offset
