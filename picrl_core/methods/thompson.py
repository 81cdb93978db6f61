"""Phase-2+3 substitution (Table 2): Thompson sampling in place of the policy network.

PIC-RL's decision module (policy network pretrained in Phase 2, refined online in Phase 3) is
replaced by a Bayesian bandit over a grid of the policy's decision parameters
(:mod:`picrl_core.rules.thompson`): ``ETA_LEVELS`` values of ``eta`` in ``[eta_low, eta_high]`` times ``K_LEVELS``
values of ``k`` in ``risk_centre + [k_low, k_high]`` (:class:`~picrl_core.config.PolicyConfig`). Everything else is
PIC-RL's: the Phase-1 predictor, the action rule ``a = clip(mu + k sigma + m + b, 0, 1)``, the reactive calibrator
Eq. (12) driven by the chosen ``eta`` (:func:`~picrl_core.calibrator.reactive_step`), and the per-step
reward :func:`~picrl_core.reward.step_reward` (true cost when uncensored, the pessimistic surrogate
Eq. (9) when censored), so only the exploration/exploitation mechanism differs (paper: "adapted only
at the interface level to our continuous decision parameterization").

The bandit is Gaussian Thompson sampling (Agrawal & Goyal, "Further Optimal Regret Bounds for
Thompson Sampling", AISTATS 2013, Algorithm 2): arm ``j`` with ``n_j`` pulls and reward sum ``S_j``
is scored by a draw from ``N(S_j / (n_j + 1), v / (n_j + 1))`` and the arm with the highest draw is
played. Algorithm 2 assumes rewards in ``[0, 1]`` (``v = 1``); our rewards are costs of a few
hundredths, so ``v`` is the learner's running reward variance (``PRIOR_REWARD_VARIANCE`` until two rewards are
seen, never below ``REWARD_VARIANCE_FLOOR``).

Phase 2 (offline): one shared bandit learns from PIC rollouts of the training split, cut into
``config.pretrain.chunks`` consecutive chunks played side by side (every chunk samples its own arm
from the shared posterior and every reward updates it). Phase 3 (online): every service starts from a
copy of that posterior and keeps updating its own copy, as the deployable rule of :mod:`picrl_core.rules.thompson`
a worker runs. Offline draws come from a ``numpy`` generator seeded by ``config.seed``; online ones are keyed on
``(config.seed, service, tick)`` (the same run twice, or the stream, gives the same actions).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from picrl_core.batching import INVARIANT_CHUNK
from picrl_core.calibrator import feedback, reactive_step
from picrl_core.config import PicRLConfig
from picrl_core.methods.base import Provisioner, run_pic_loop
from picrl_core.methods.conformal import PredictorFeed
from picrl_core.methods.deployed import RuleProvisioner
from picrl_core.pipeline import phase1_predictor
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.reward import step_reward
from picrl_core.rules.thompson import ARMS, POSTERIOR, ThompsonRule, arm_grid, reward_scale
from picrl_core.series import PreparedSeries


@dataclass
class GaussianThompson:
    """Sufficient statistics of L independent Gaussian-Thompson learners over the same A arms."""

    pulls: np.ndarray  # (L, A)
    sums: np.ndarray  # (L, A) summed rewards per arm
    seen: np.ndarray  # (L,) rewards seen over all arms
    total: np.ndarray  # (L,) their sum
    total_sq: np.ndarray  # (L,) their sum of squares

    @classmethod
    def empty(cls, learners: int, arms: int) -> GaussianThompson:
        return cls(
            np.zeros((learners, arms)),
            np.zeros((learners, arms)),
            np.zeros(learners),
            np.zeros(learners),
            np.zeros(learners),
        )

    def scale(self) -> np.ndarray:
        """Each learner's reward variance ``v`` (L,)."""
        return reward_scale(self.seen, self.total, self.total_sq)

    def sample(self, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One arm per entry of ``rows`` (the learner each draw uses), by the highest posterior draw."""
        pulls, sums = self.pulls[rows], self.sums[rows]
        std = np.sqrt(self.scale()[rows][:, None] / (pulls + 1.0))
        return np.argmax(sums / (pulls + 1.0) + std * rng.standard_normal(pulls.shape), axis=1)

    def update(self, rows: np.ndarray, arms: np.ndarray, rewards: np.ndarray) -> None:
        """Record ``rewards[i]`` for arm ``arms[i]`` of learner ``rows[i]`` (rows may repeat)."""
        np.add.at(self.pulls, (rows, arms), 1.0)
        np.add.at(self.sums, (rows, arms), rewards)
        np.add.at(self.seen, rows, 1.0)
        np.add.at(self.total, rows, rewards)
        np.add.at(self.total_sq, rows, rewards**2)


class ThompsonProvisioner(Provisioner):
    """PIC-RL's predict/act/calibrate loop with the ``(eta, k)`` of every tick chosen by Thompson
    sampling, every service learning into ``bandit`` itself: the offline phase (:func:`pretrain_bandit`). Online,
    each service has its own copy of learner 0: :class:`~picrl_core.rules.thompson.ThompsonRule`."""

    def __init__(
        self, model: GaussianLSTM, config: PicRLConfig, bandit: GaussianThompson, seed: tuple[int, int]
    ) -> None:
        self.model = model
        self.config = config
        self.prior = bandit
        self.seed = seed
        self.eta_arms, self.k_arms = arm_grid(config)

    def start(self, history: np.ndarray, history_context: np.ndarray | None) -> np.ndarray:
        self.feed = PredictorFeed(self.model, history, history_context, self.config.online.inference_chunk)
        n = self.feed.observations.shape[0]
        self.rng = np.random.default_rng(self.seed)
        self.bandit = self.prior
        self.rows = np.zeros(n, dtype=np.int64)
        self.margin, self.bias = np.zeros(n), np.zeros(n)
        self.streak = np.zeros(n)
        return self._decide()

    def act(self, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        cfg = self.config
        y = np.asarray(y, dtype=np.float64)
        censored = np.asarray(censored, dtype=bool)
        self.streak = np.where(censored, self.streak + 1, 0)
        reward = step_reward(self.action, y, censored, self.mu, self.sigma, self.streak, cfg.cost, cfg.reward)
        self.bandit.update(self.rows, self.arm, reward)
        shortage, over = feedback(y, self.action, censored)
        self.margin, self.bias = reactive_step(
            self.margin, self.bias, self.eta_arms[self.arm], shortage, over, self.sigma, cfg
        )
        self.feed.push(y, censored, context)
        return self._decide()

    def _decide(self) -> np.ndarray:
        self.mu, self.sigma = self.feed.predict()
        self.arm = self.bandit.sample(self.rows, self.rng)
        self.action = np.clip(self.mu + self.k_arms[self.arm] * self.sigma + self.margin + self.bias, 0.0, 1.0)
        return self.action


def pretrain_bandit(model: GaussianLSTM, series: PreparedSeries, config: PicRLConfig) -> GaussianThompson:
    """Phase 2: one pass of PIC rollouts over the training split in ``config.pretrain.chunks``
    consecutive chunks (of each series of a fleet, ``chunks // services`` at least one), all learning into
    one shared bandit; each chunk starts from the W uncensored steps before it."""
    width = model.cfg.window
    per_service = len(series.train) // series.services
    steps = per_service - width
    chunks = max(1, min(config.pretrain.chunks // series.services, steps))
    length = steps // chunks
    starts = ((per_service * np.arange(series.services))[:, None] + width + length * np.arange(chunks)).ravel()
    ticks = starts[None, :] + np.arange(length)[:, None]  # (length, chunks)
    before = starts[:, None] - width + np.arange(width)[None, :]  # (chunks, W)
    ctx = series.train_ctx
    bandit = GaussianThompson.empty(1, ARMS)
    rollout = replace(config, online=replace(config.online, inference_chunk=INVARIANT_CHUNK))  # large batches
    provisioner = ThompsonProvisioner(model, rollout, bandit, seed=(config.seed, 0))
    run_pic_loop(
        provisioner,
        series.train[ticks],
        series.train[before],
        context=None if ctx is None else ctx[ticks],
        history_context=None if ctx is None else ctx[before],
    )
    return bandit


def fit_thompson(
    series: PreparedSeries, config: PicRLConfig, *, predictor: GaussianLSTM | None = None
) -> RuleProvisioner:
    """Phase 1 (or ``predictor``, trained on this series), then the offline bandit; the returned provisioner is the
    deployable :class:`~picrl_core.rules.thompson.ThompsonRule` (``picrl worker --method thompson``), every service
    starting from a copy of the offline posterior."""
    model = phase1_predictor(series, config) if predictor is None else predictor.eval()
    bandit = pretrain_bandit(model, series, config)
    prior = {name: getattr(bandit, name)[0] for name in POSTERIOR}
    rule = ThompsonRule(model, config, prior, config.seed)
    return RuleProvisioner(rule, series.scaler.low, series.scaler.high)
