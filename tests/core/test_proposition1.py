"""Proposition 1 (instability under mixture), checked numerically on stationary Gaussian demand.

A learner that fits demand from its own censored observations ``y = min(d, a)`` targets a mean
below ``E[D]`` at every threshold, so starting at the unbiased point it drifts into the censoring
trap; PIC-RL (surrogate-trained policy plus reactive calibrator) does not.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from scipy.stats import norm

from picrl_core.config import PicRLConfig
from picrl_core.controller import PicRLController
from picrl_core.costs import episode_metrics
from picrl_core.predictor.train import train_predictor
from picrl_core.pretrain import pretrain_policy
from picrl_core.simulator import simulate
from picrl_core.synthetic import stationary_gaussian

MEAN, STD = 0.5, 0.1
HORIZON = 1500


def naive_censored_learner(demand: np.ndarray, start: float, gamma: float = 0.1, window: int = 16) -> np.ndarray:
    """Actions of the naive learner of Proposition 1 (test-only reference).

    It acts ``A_t``, observes ``y_t = min(d_t, A_t)`` and, taking censored values at face value,
    moves towards the mean of its last ``window`` observations:
    ``A_{t+1} = A_t + gamma * (mean(y_{t-window+1..t}) - A_t)``.
    """
    recent: deque[float] = deque(maxlen=window)
    actions = np.empty(len(demand))
    level = start
    for t, d in enumerate(demand):
        actions[t] = level
        recent.append(min(d, level))
        level += gamma * (float(np.mean(recent)) - level)
    return actions


def mixture_target(threshold: float, rho: float) -> float:
    """Proposition 1's closed form ``(1 - rho) E[D] + rho E[D | D <= A]`` for ``D ~ N(MEAN, STD^2)``
    (truncated-normal mean: ``E[D | D <= A] = mu - sigma phi(alpha) / Phi(alpha)``)."""
    alpha = (threshold - MEAN) / STD
    return (1 - rho) * MEAN + rho * (MEAN - STD * norm.pdf(alpha) / norm.cdf(alpha))


@pytest.mark.parametrize("threshold", [0.4, 0.5, 0.6, 0.75])
@pytest.mark.parametrize("rho", [0.3, 1.0])
def test_mixture_target_is_below_the_mean_and_matches_monte_carlo(threshold: float, rho: float) -> None:
    rng = np.random.default_rng(0)
    n = 400_000
    historical = rng.normal(MEAN, STD, n)  # uncensored stream
    current = rng.normal(MEAN, STD, 4 * n)
    below = current[current <= threshold]  # the censored stream keeps only what lies under A_t
    n_current = round(rho * n)
    mixture = np.concatenate([historical[: n - n_current], below[:n_current]])
    target = mixture_target(threshold, rho)
    assert target < MEAN
    assert mixture.mean() == pytest.approx(target, abs=1.5e-3)
    # the drift force grows with the share of censored data
    assert mixture_target(threshold, rho) <= mixture_target(threshold, rho / 2)


def test_naive_learner_drifts_down_while_picrl_does_not(tiny_config: PicRLConfig) -> None:
    window = tiny_config.predictor.window
    train = stationary_gaussian(2000, MEAN, STD, seed=1)
    val = stationary_gaussian(400, MEAN, STD, seed=2)
    test = stationary_gaussian(window + HORIZON, MEAN, STD, seed=3)
    demand = test[window:]

    naive = naive_censored_learner(demand, start=MEAN)
    naive_metrics = episode_metrics(naive, demand, tiny_config.cost)
    assert naive[-200:].mean() < MEAN - 1.5 * STD  # drifted well below E[D]
    assert np.all(np.diff(naive.reshape(5, -1).mean(axis=1)) < 0)  # every 300-step block lower than the last
    assert naive_metrics.shortage_rate > 0.85

    predictor, _ = train_predictor(train, val, tiny_config.predictor, seed=tiny_config.seed)
    policy, _, _ = pretrain_policy(predictor, train, tiny_config)
    traj = simulate(PicRLController(predictor, policy, tiny_config), demand[:, None], test[None, :window])
    picrl = episode_metrics(traj.action, traj.demand, tiny_config.cost)

    assert traj.action.mean() >= naive.mean() + STD
    assert traj.action[-200:].mean() >= MEAN - 0.5 * STD  # no drift into the censoring trap
    assert picrl.shortage_rate < naive_metrics.shortage_rate - 0.3
    assert picrl.regret < naive_metrics.regret
