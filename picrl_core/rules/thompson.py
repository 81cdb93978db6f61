"""Thompson sampling over PIC-RL's ``(eta, k)`` grid as a deployable rule (:mod:`picrl_core.methods.thompson` says
the method and how its prior is learnt offline).

Per service the record keeps the predictor's window (:mod:`picrl_core.rules.feed`), the reactive calibrator's margin
and bias, the arm in force and its own Gaussian-Thompson posterior over the :data:`ARMS` arms (pulls, reward sums,
and the count, sum and sum of squares of its rewards), every service starting from the offline posterior in the
artifact. Each arm's draw is keyed on ``(seed, service key, tick)`` (:func:`~picrl_core.noise.counter_normal`), so a
worker and the simulator draw the same numbers whatever the batching. On a moved range the levels and spreads move
as the controller's do, and the rewards (costs in units of the range) scale with its span.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from picrl_core.artifact import ArtifactError, ModelArtifact
from picrl_core.calibrator import feedback, reactive_step
from picrl_core.config import PicRLConfig
from picrl_core.noise import counter_normal
from picrl_core.policy import risk_centre
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.reward import step_reward
from picrl_core.rules.base import RecordRule
from picrl_core.rules.feed import feed_fields, move_feed, predict_feed, push_feed, range_move, start_feed

ETA_LEVELS = 3  # eta values on the grid (eta_low, middle, eta_high)
K_LEVELS = 5  # k values on the grid
ARMS = ETA_LEVELS * K_LEVELS
PRIOR_REWARD_VARIANCE = 1e-2  # reward scale before two rewards are seen (a gap of ~0.1 of the range)
REWARD_VARIANCE_FLOOR = 1e-6
POSTERIOR = ("pulls", "sums", "seen", "total", "total_sq")  # a learner's sufficient statistics


def arm_grid(config: PicRLConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(eta, k)`` of every arm, each ``(ARMS,)``."""
    policy = config.policy
    eta, k = np.meshgrid(
        np.linspace(policy.eta_low, policy.eta_high, ETA_LEVELS),
        risk_centre(config) + np.linspace(policy.k_low, policy.k_high, K_LEVELS),
        indexing="ij",
    )
    return eta.ravel(), k.ravel()


def reward_scale(seen: np.ndarray, total: np.ndarray, total_sq: np.ndarray) -> np.ndarray:
    """Each learner's reward variance ``v``: the running one from two rewards on, floored; a prior before."""
    count = np.maximum(seen, 1.0)
    variance = total_sq / count - (total / count) ** 2
    return np.where(seen >= 2, np.maximum(variance, REWARD_VARIANCE_FLOOR), PRIOR_REWARD_VARIANCE)


class ThompsonRule(RecordRule):
    """``a = clip(mu + k sigma + m + b)`` with ``(eta, k)`` the arm of the highest posterior draw, per service."""

    method = "thompson"

    def __init__(self, model: GaussianLSTM, config: PicRLConfig, prior: dict[str, Any], seed: int) -> None:
        self.model, self.config, self.seed = model, config, seed
        self.prior = {name: np.asarray(prior[name], dtype=np.float64) for name in POSTERIOR}  # learner 0's
        self.eta_arms, self.k_arms = arm_grid(config)
        super().__init__()

    @classmethod
    def from_artifact(cls, artifact: ModelArtifact) -> ThompsonRule:
        """The rule of a ``picrl train --method thompson`` model: its predictor, offline posterior and seed."""
        if artifact.predictor is None:
            raise ArtifactError("a Thompson model needs its Phase-1 predictor")
        return cls(artifact.predictor, artifact.config, artifact.parameters["prior"], artifact.parameters["seed"])

    def parameters(self) -> dict[str, Any]:
        return {"prior": {name: value.tolist() for name, value in self.prior.items()}, "seed": self.seed}

    def fields(self) -> list[tuple[Any, ...]]:
        cfg = self.model.cfg
        return [
            *feed_fields(cfg.window, cfg.context_channels),
            ("arm", "<i8"),
            ("pulls", "<f8", (ARMS,)),
            ("sums", "<f8", (ARMS,)),
            ("seen", "<f8"),
            ("total", "<f8"),
            ("total_sq", "<f8"),
        ]

    def start(
        self, state: np.recarray, history: np.ndarray, low: np.ndarray, high: np.ndarray, context: np.ndarray | None
    ) -> None:
        start_feed(state, history, context, self.model.cfg.context_channels)
        for name, value in self.prior.items():
            setattr(state, name, value)
        self._order(state)

    def advance(self, state: np.recarray, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> None:
        cfg = self.config
        streak = state.censor_streak
        reward = step_reward(state.action, y, censored, state.mu, state.sigma, streak, cfg.cost, cfg.reward)
        played = np.arange(ARMS)[None, :] == np.asarray(state.arm)[:, None]
        state.pulls = state.pulls + played
        state.sums = state.sums + np.where(played, reward[:, None], 0.0)
        state.seen, state.total, state.total_sq = state.seen + 1.0, state.total + reward, state.total_sq + reward**2
        shortage, over = feedback(y, state.action, censored)
        state.margin, state.bias = reactive_step(state.margin, state.bias, state.eta, shortage, over, state.sigma, cfg)
        push_feed(state, y, censored, context)
        self._order(state)

    def moved(
        self, state: np.recarray, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray
    ) -> None:
        ratio, shift = range_move(low, high, new_low, new_high)
        move_feed(state, ratio, shift)
        state.mu = state.mu * ratio + shift
        state.sigma, state.margin, state.bias = state.sigma * ratio, state.margin * ratio, state.bias * ratio
        state.sums, state.total = state.sums * ratio[:, None], state.total * ratio
        state.total_sq = state.total_sq * ratio**2
        state.order = state.mu + state.k * state.sigma + state.margin + state.bias

    def _order(self, state: np.recarray) -> None:
        """The forecast, the arm of the highest draw from each service's posterior, and Eq. (11) with its ``k``."""
        state.mu, state.sigma = predict_feed(self.model, state, self.config.online.inference_chunk)
        pulls = np.asarray(state.pulls)
        std = np.sqrt(reward_scale(state.seen, state.total, state.total_sq)[:, None] / (pulls + 1.0))
        noise = counter_normal(self.seed, state.keys, state.tick, ARMS)
        state.arm = np.argmax(state.sums / (pulls + 1.0) + std * noise, axis=1)
        arm = np.asarray(state.arm)
        state.eta, state.k = self.eta_arms[arm], self.k_arms[arm]
        state.order = state.mu + state.k * state.sigma + state.margin + state.bias
