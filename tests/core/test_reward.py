"""Pessimism factor, expected gap and step rewards, Eq. (9)-(10) (picrl_core.reward)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import truncnorm

from picrl_core.config import CostConfig, RewardConfig
from picrl_core.reward import (
    RewardInputError,
    expected_cost,
    expected_gap,
    pessimism_factor,
    step_reward,
    surrogate_reward,
)

COST = CostConfig()  # c_under = 2, c_over = 1
REWARD = RewardConfig(use_pessimism=True)  # Eq. 9 as the paper has it: beta = 0.5, N_max = 10
LAMBDA_0 = np.sqrt(2.0 / np.pi)  # lambda(0) = phi(0) / (1/2)


def test_pessimism_factor_hand_values() -> None:
    np.testing.assert_allclose(pessimism_factor([0, 1, 4, 10, 25], REWARD), [1.0, 1.5, 3.0, 6.0, 6.0])
    custom = RewardConfig(beta=0.2, n_max=3, use_pessimism=True)
    np.testing.assert_allclose(pessimism_factor(np.array([[0, 2], [3, 9]]), custom), [[1.0, 1.4], [1.6, 1.6]])


def test_pessimism_ablation_a3_is_all_ones() -> None:
    off = replace(REWARD, use_pessimism=False)
    np.testing.assert_array_equal(pessimism_factor([0, 3, 50], off), [1.0, 1.0, 1.0])


def test_negative_or_nan_counts_are_rejected() -> None:
    with pytest.raises(RewardInputError):
        pessimism_factor([1, -1], REWARD)
    with pytest.raises(RewardInputError):
        pessimism_factor([np.nan], REWARD)


def test_expected_gap_is_the_truncated_normal_excess() -> None:
    mu, sigma = 0.45, 0.12
    a = mu + sigma * np.linspace(-6.0, 6.0, 49)
    # E[d - a | d > a] for d ~ N(mu, sigma^2), by scipy's truncated normal.
    reference = truncnorm((a - mu) / sigma, np.inf, loc=mu, scale=sigma).mean() - a
    np.testing.assert_allclose(expected_gap(a, mu, sigma), reference, rtol=1e-8)
    assert expected_gap(mu, mu, sigma) == pytest.approx(sigma * LAMBDA_0, rel=1e-14)


def test_expected_cost_is_the_asymmetric_cost_averaged_over_the_forecast() -> None:
    """E[l(a, d)] for d ~ N(mu, sigma^2), against a quadrature on a fine grid (what a killed tick's row earns)."""
    mu, sigma = 0.45, 0.12
    d = np.linspace(mu - 12 * sigma, mu + 12 * sigma, 400_001)
    weight = np.exp(-0.5 * ((d - mu) / sigma) ** 2)
    weight /= weight.sum()
    for a in (0.0, 0.3, mu, 0.6, 1.0):
        reference = float(np.sum(weight * (COST.c_under * np.maximum(d - a, 0) + COST.c_over * np.maximum(a - d, 0))))
        assert expected_cost(a, mu, sigma, COST) == pytest.approx(reference, rel=1e-6), a


def test_expected_gap_stays_positive_far_above_the_mean() -> None:
    # z = 90 ... 1e8: the plain difference mu + sigma*lambda - a cancels to 0 (or below) up there.
    gaps = expected_gap(np.array([1.0, 5.0, 100.0, 1e6 + 0.1]), 0.1, 0.01)
    assert np.all(gaps > 0)
    np.testing.assert_allclose(gaps, 0.01 / np.array([90.0, 490.0, 9990.0, 1e8]), rtol=1e-3)


@pytest.mark.parametrize("sigma", [0.0, -0.1, np.nan])
def test_expected_gap_needs_positive_sigma(sigma: float) -> None:
    with pytest.raises(RewardInputError):
        expected_gap(0.5, 0.5, sigma)


def test_surrogate_reward_hand_value() -> None:
    # a = mu: gap = sigma * lambda(0); n = 3: Psi = 2.5; r = -2 * gap * 2.5.
    r = surrogate_reward(0.5, 0.5, 0.1, 3, COST, REWARD)
    assert r == pytest.approx(-2.0 * 0.1 * LAMBDA_0 * 2.5, rel=1e-14)
    assert surrogate_reward(0.5, 0.5, 0.1, 3, COST, replace(REWARD, use_pessimism=False)) == pytest.approx(
        -2.0 * 0.1 * LAMBDA_0, rel=1e-14
    )


def test_step_reward_mixes_true_cost_and_surrogate() -> None:
    a = np.array([0.5, 0.6, 0.4, 0.3])
    y = np.array([0.5, 0.4, 0.4, 0.3])  # censored steps observe y = a
    censored = np.array([True, False, True, False])
    mu = np.array([0.5, 0.2, 0.3, 0.2])
    sigma = np.array([0.1, 0.05, 0.1, 0.0])  # sigma is not read on uncensored steps
    n = np.array([3, 0, 1, 0])
    r = step_reward(a, y, censored, mu, sigma, n, COST, REWARD)
    assert r[0] == pytest.approx(-2.0 * 0.1 * LAMBDA_0 * 2.5)
    assert r[1] == pytest.approx(-1.0 * 0.2)  # over-provisioned by 0.2
    assert r[2] == pytest.approx(float(surrogate_reward(0.4, 0.3, 0.1, 1, COST, REWARD)))
    assert r[3] == 0.0  # exact provisioning


def test_censored_reward_ablation_a2_makes_censoring_free() -> None:
    a = np.array([0.5, 0.6])
    y = np.array([0.5, 0.4])
    censored = np.array([True, False])
    r = step_reward(a, y, censored, 0.5, 0.1, np.array([2, 0]), COST, replace(REWARD, use_censored_reward=False))
    np.testing.assert_allclose(r, [0.0, -0.2])


def test_step_reward_broadcasts_scalars_and_keeps_shape() -> None:
    a = np.full((4, 3), 0.5)
    censored = np.zeros((4, 3), dtype=bool)
    censored[1, 2] = True
    r = step_reward(a, 0.45, censored, 0.5, 0.1, 1, COST, REWARD)
    assert r.shape == (4, 3)
    assert r[1, 2] == pytest.approx(-2.0 * 0.1 * LAMBDA_0 * 1.5)
    assert np.all(np.delete(r.ravel(), 5) == pytest.approx(-0.05))


def test_censored_steps_count_themselves() -> None:
    with pytest.raises(RewardInputError, match="including|counts the current"):
        step_reward([0.5], [0.5], [True], 0.5, 0.1, [0], COST, REWARD)
