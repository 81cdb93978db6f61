"""Inverse Mills ratio (picrl_core.mills) against scipy/mpmath, and Proposition 2 on the surrogate."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from scipy.special import erfcx, log_ndtr

from picrl_core.config import CostConfig, RewardConfig
from picrl_core.mills import (
    censored_normal_terms,
    inverse_mills_gap,
    inverse_mills_ratio,
    inverse_mills_ratio_derivative,
    log_normal_survival,
    mean_above,
)
from picrl_core.reward import pessimism_factor, surrogate_reward

DENSE = np.linspace(-40.0, 40.0, 80_001)
# Below z ~ -37.5 lambda(z) ~ phi(z) is smaller than the smallest normal double (2.2e-308).
NORMAL_RANGE = np.linspace(-37.0, 40.0, 3_081)
SPECIAL = np.array([-3.0, -2.9999999999, 0.0, 1e-9, -1e-9, 2.9999999999, 3.0, 3.0000000001])


def scipy_lambda(z: np.ndarray) -> np.ndarray:
    return np.sqrt(2.0 / np.pi) / erfcx(z / np.sqrt(2.0))


def mp_reference(z: float) -> tuple[float, float, float]:
    """``(lambda, lambda - z, lambda')`` at 50 significant digits."""
    with mpmath.workdps(50):
        x = mpmath.mpf(z)
        lam = mpmath.npdf(x) / mpmath.ncdf(-x)
        return float(lam), float(lam - x), float(lam * (lam - x))


@pytest.fixture(scope="module")
def mp_grid() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    z = np.concatenate([np.linspace(-37.0, 40.0, 771), SPECIAL])
    ref = np.array([mp_reference(float(v)) for v in z])
    return z, ref[:, 0], ref[:, 1], ref[:, 2]


def test_lambda_matches_scipy_erfcx_on_dense_grid() -> None:
    # rtol wherever the value is a normal double; the subnormal tail below z ~ -37.5 is ~1e-308 anyway.
    np.testing.assert_allclose(inverse_mills_ratio(DENSE), scipy_lambda(DENSE), rtol=1e-10, atol=1e-300)
    assert np.all(scipy_lambda(NORMAL_RANGE) > 1e-300)


def test_lambda_gap_and_derivative_match_mpmath(mp_grid) -> None:
    z, lam, gap, deriv = mp_grid
    np.testing.assert_allclose(inverse_mills_ratio(z), lam, rtol=1e-10)
    np.testing.assert_allclose(inverse_mills_gap(z), gap, rtol=1e-10)
    np.testing.assert_allclose(inverse_mills_ratio_derivative(z), deriv, rtol=1e-10)
    # 1 - lambda' ~ 1/z^2 is what Proposition 2's gradient is made of: it must not cancel away.
    np.testing.assert_allclose(1.0 - inverse_mills_ratio_derivative(z), 1.0 - deriv, rtol=1e-9)


def test_combined_call_equals_separate_functions() -> None:
    log_sf, lam, deriv = censored_normal_terms(DENSE)
    np.testing.assert_array_equal(log_sf, log_normal_survival(DENSE))
    np.testing.assert_array_equal(lam, inverse_mills_ratio(DENSE))
    np.testing.assert_array_equal(deriv, inverse_mills_ratio_derivative(DENSE))


def test_derivative_lies_strictly_between_zero_and_one() -> None:
    deriv = inverse_mills_ratio_derivative(DENSE)
    assert np.all(deriv < 1.0)
    assert np.all(deriv >= 0.0)
    assert np.all(inverse_mills_ratio_derivative(NORMAL_RANGE) > 0.0)
    # lambda is increasing (lambda' > 0) and lambda(z) - z is decreasing (lambda' < 1).
    lam = inverse_mills_ratio(NORMAL_RANGE)
    assert np.all(np.diff(lam) > 0)
    assert np.all(np.diff(inverse_mills_gap(NORMAL_RANGE)) < 0)


def test_gap_is_positive_and_asymptotic_for_large_z() -> None:
    assert np.all(inverse_mills_gap(DENSE) > 0)
    z = np.array([1e3, 1e4, 1e6])
    # lambda(z) - z = 1/z - 2/z^3 + 10/z^5 - ... (Laplace's continued fraction).
    np.testing.assert_allclose(inverse_mills_gap(z), 1 / z - 2 / z**3 + 10 / z**5, rtol=1e-12)


@pytest.mark.parametrize("z", [1e3, -1e3, 1e8, -1e8, 1e300, -1e300])
def test_finite_far_outside_the_grid(z: float) -> None:
    log_sf, lam, deriv = censored_normal_terms(z)
    assert np.isfinite(log_sf) or z > 1e154  # log(1 - Phi(1e300)) ~ -5e599 is -inf in float64
    assert np.isfinite(lam) and np.isfinite(deriv) and np.isfinite(inverse_mills_gap(z))
    assert 0.0 <= deriv <= 1.0
    if z > 0:
        assert lam == pytest.approx(z, rel=1e-6)
    else:
        assert lam == 0.0


def test_log_survival_matches_scipy_log_ndtr() -> None:
    expected = log_ndtr(-DENSE)
    np.testing.assert_allclose(log_normal_survival(DENSE), expected, rtol=1e-10, atol=1e-300)
    # log(1 - Phi(z)) ~ -phi(z)/|z| where 1 - Phi(z) rounds to 1: relative accuracy kept.
    z = np.array([-9.0, -20.0, -30.0])
    np.testing.assert_allclose(log_normal_survival(z), log_ndtr(-z), rtol=1e-10)
    assert np.all(log_normal_survival(z) < 0)
    assert np.isfinite(log_normal_survival(1e3))


def test_shapes_scalars_and_nan() -> None:
    z = np.linspace(-5, 5, 24).reshape(2, 3, 4)
    for fn in (inverse_mills_ratio, inverse_mills_gap, inverse_mills_ratio_derivative, log_normal_survival):
        assert fn(z).shape == (2, 3, 4)
        assert fn(0.5).shape == ()
        assert np.isnan(fn(np.nan))
    assert float(inverse_mills_ratio(0.0)) == pytest.approx(np.sqrt(2 / np.pi), rel=1e-14)


# --- Proposition 2 on the surrogate reward, Eq. (9) -------------------------------------------

COST = CostConfig()
REWARD = RewardConfig(use_pessimism=True)  # Eq. 9 with its pessimism, as the paper has it


def test_prop2_surrogate_reward_increases_with_the_action() -> None:
    mu, sigma = 0.4, 0.07
    z = np.linspace(-8.0, 30.0, 3_801)
    a = mu + z * sigma
    r = surrogate_reward(a, mu, sigma, 3, COST, REWARD)
    assert np.all(np.diff(r) > 0)
    h = 1e-5 * sigma
    fd = (surrogate_reward(a + h, mu, sigma, 3, COST, REWARD) - surrogate_reward(a - h, mu, sigma, 3, COST, REWARD)) / (
        2 * h
    )
    assert np.all(fd > 0)
    # dr/da = c_under * Psi(n) * (1 - lambda'(z)) (proof of Proposition 2).
    analytic = COST.c_under * pessimism_factor(3, REWARD) * (1.0 - inverse_mills_ratio_derivative(z))
    np.testing.assert_allclose(fd, analytic, rtol=1e-5)


def test_prop2_gradient_scales_with_pessimism() -> None:
    mu, sigma, h = 0.5, 0.1, 1e-6
    a = np.array([0.3, 0.5, 0.62, 0.9])
    counts = np.arange(0, REWARD.n_max + 4)
    grads = np.array(
        [
            (surrogate_reward(a + h, mu, sigma, n, COST, REWARD) - surrogate_reward(a - h, mu, sigma, n, COST, REWARD))
            / (2 * h)
            for n in counts
        ]
    )
    psi = pessimism_factor(counts, REWARD)
    np.testing.assert_allclose(grads / grads[0], np.broadcast_to(psi[:, None], grads.shape), rtol=1e-6)
    assert np.all(np.diff(grads[: REWARD.n_max + 1], axis=0) > 0)  # grows up to N_max, then stays
    np.testing.assert_allclose(grads[REWARD.n_max :], np.broadcast_to(grads[REWARD.n_max], (4, a.size)))


def test_mean_above_is_the_truncated_normal_mean() -> None:
    rng = np.random.default_rng(0)
    draws = rng.normal(0.4, 0.05, 2_000_000)
    for bound in (0.3, 0.4, 0.5):
        assert mean_above(0.4, 0.05, bound) == pytest.approx(draws[draws > bound].mean(), abs=2e-4)
    assert mean_above(0.0, 1.0, 60.0) >= 60.0  # never below the bound, far in the tail
