"""Tobit estimator of censored demand (picrl_core.censored_estimator) against scipy references."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from scipy.optimize import approx_fprime, minimize
from scipy.stats import norm

from picrl_core.censored_estimator import (
    ROWS_PER_THREAD,
    UNCERTAINTY_CAP,
    EstimatorInputError,
    estimate_censored_demand,
)
from picrl_core.config import EstimatorConfig, RewardConfig
from picrl_core.reward import pessimism_factor

ESTIMATOR = EstimatorConfig()
REWARD = RewardConfig(use_pessimism=True)  # Eq. 9 with its pessimism, as the paper has it


def censor(d: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PIC observation: ``y = min(d, a)``, ``c = d > a``."""
    return np.minimum(d, thresholds), d > thresholds


def negative_log_likelihood(params: np.ndarray, y: np.ndarray, c: np.ndarray) -> float:
    """The Tobit likelihood in ``(m, log s)``, written with scipy.stats."""
    m, log_s = params
    u = (y - m) / np.exp(log_s)
    return -(np.sum(norm.logpdf(u[~c]) - log_s) + np.sum(norm.logsf(u[c])))


def scipy_tobit(y: np.ndarray, c: np.ndarray) -> np.ndarray:
    start = np.array([y.mean(), np.log(y.std())])
    fit = minimize(
        negative_log_likelihood,
        start,
        args=(y, c),
        method="Nelder-Mead",
        options={"xatol": 1e-10, "fatol": 1e-13, "maxiter": 5000},
    )
    return fit.x


def windows(rows: int, width: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Demand ~ N(0.5, 0.1) censored at per-row action levels (1 to W-2 censored points each)."""
    rng = np.random.default_rng(seed)
    d = rng.normal(0.5, 0.1, size=(rows, width))
    levels = rng.uniform(0.4, 0.65, size=(rows, 1)) + rng.normal(0.0, 0.02, size=(rows, width))
    y, c = censor(d, levels)
    keep = (c.sum(axis=1) >= 1) & ((~c).sum(axis=1) >= 2)
    return y[keep], c[keep]


def test_tobit_removes_the_bias_of_naive_averaging() -> None:
    rng = np.random.default_rng(7)
    width = 4000
    d = rng.normal(0.5, 0.1, size=(4, width))
    y, c = censor(d, np.full_like(d, 0.55))  # about 31% censored
    est = estimate_censored_demand(y, c, np.zeros(4, dtype=int), replace(ESTIMATOR, window=width), REWARD)
    naive = y.mean(axis=1)
    uncensored_only = np.array([row[~cr].mean() for row, cr in zip(y, c)])
    # Proposition 1: averaging censored observations (or only the uncensored ones) is biased low.
    assert np.all(naive < 0.49) and np.all(uncensored_only < naive)
    np.testing.assert_allclose(est.mean, 0.5, atol=0.008)
    np.testing.assert_allclose(est.std, 0.1, atol=0.006)


def test_batch_matches_scipy_optimize_row_by_row() -> None:
    y, c = windows(24, ESTIMATOR.window, seed=11)
    est = estimate_censored_demand(y, c, np.zeros(len(y), dtype=int), ESTIMATOR, REWARD)
    for i in range(len(y)):
        m, log_s = scipy_tobit(y[i], c[i])
        assert est.mean[i] == pytest.approx(m, rel=1e-4)
        assert est.std[i] == pytest.approx(np.exp(log_s), rel=1e-4)
        # Ours is the maximiser: at least as likely as scipy's optimum.
        ours = negative_log_likelihood(np.array([est.mean[i], np.log(est.std[i])]), y[i], c[i])
        assert ours <= negative_log_likelihood(np.array([m, log_s]), y[i], c[i]) + 1e-9


def test_uncertainty_is_the_standard_error_from_the_observed_information() -> None:
    y, c = windows(6, ESTIMATOR.window, seed=5)
    est = estimate_censored_demand(y, c, np.zeros(len(y), dtype=int), ESTIMATOR, REWARD)
    for i in range(len(y)):
        theta = np.array([est.mean[i], np.log(est.std[i])])

        def grad(t: np.ndarray, yi: np.ndarray = y[i], ci: np.ndarray = c[i]) -> np.ndarray:
            return approx_fprime(t, negative_log_likelihood, 1e-6, yi, ci)

        hessian = np.array([(grad(theta + e) - grad(theta - e)) / 2e-4 for e in np.eye(2) * 1e-4])
        reference = np.sqrt(np.linalg.inv(0.5 * (hessian + hessian.T))[0, 0])
        assert est.uncertainty[i] == pytest.approx(reference, rel=1e-3)


def test_uncertainty_grows_with_the_censored_share() -> None:
    # A noise-free N(0.5, 0.1) sample (its quantiles, in random order) censored ever lower.
    d = norm.ppf((np.arange(200) + 0.5) / 200, loc=0.5, scale=0.1)
    np.random.default_rng(2).shuffle(d)
    shares = [0.0, 0.1, 0.25, 0.4, 0.55, 0.7, 0.85]
    thresholds = np.array([norm.ppf(1 - s, loc=0.5, scale=0.1) if s else 10.0 for s in shares])
    y, c = censor(np.tile(d, (len(shares), 1)), thresholds[:, None])
    np.testing.assert_allclose(c.mean(axis=1), shares)
    est = estimate_censored_demand(y, c, np.zeros(len(shares), dtype=int), replace(ESTIMATOR, window=200), REWARD)
    assert np.all(np.diff(est.uncertainty) > 0)
    assert est.uncertainty[0] == pytest.approx(d.std() / np.sqrt(200))  # s / sqrt(n) without censoring
    assert est.uncertainty[-1] > 2.5 * est.uncertainty[0]


def test_no_censoring_is_the_closed_form_gaussian_mle() -> None:
    rng = np.random.default_rng(4)
    y = rng.normal(0.3, 0.05, size=(3, 32))
    est = estimate_censored_demand(y, np.zeros_like(y, dtype=bool), np.zeros(3, dtype=int), ESTIMATOR, REWARD)
    np.testing.assert_allclose(est.mean, y.mean(axis=1))
    np.testing.assert_allclose(est.std, y.std(axis=1))
    np.testing.assert_allclose(est.uncertainty, y.std(axis=1) / np.sqrt(32))


def test_rows_are_independent_and_deterministic() -> None:
    y, c = windows(12, ESTIMATOR.window, seed=9)
    n = np.arange(len(y))
    batch = estimate_censored_demand(y, c, n, ESTIMATOR, REWARD)
    again = estimate_censored_demand(y, c, n, ESTIMATOR, REWARD)
    np.testing.assert_array_equal(batch.mean, again.mean)
    for i in (0, 5, len(y) - 1):
        alone = estimate_censored_demand(y[i : i + 1], c[i : i + 1], n[i : i + 1], ESTIMATOR, REWARD)
        np.testing.assert_allclose(alone.mean, batch.mean[i : i + 1], rtol=1e-12)
        np.testing.assert_allclose(alone.std, batch.std[i : i + 1], rtol=1e-12)
        np.testing.assert_allclose(alone.uncertainty, batch.uncertainty[i : i + 1], rtol=1e-12)


def test_row_blocks_on_two_threads_give_the_bits_of_one_call() -> None:
    y, c = windows(10_000, ESTIMATOR.window, seed=4)
    assert len(y) >= 2 * ROWS_PER_THREAD  # enough rows for the estimator to split them
    n = np.arange(len(y)) % 7
    start = (y.mean(axis=1) + 0.01, y.std(axis=1) + 0.01)
    one = estimate_censored_demand(y, c, n, ESTIMATOR, REWARD, start=start)
    two = estimate_censored_demand(y, c, n, ESTIMATOR, REWARD, start=start, threads=2)
    for name in ("mean", "std", "pessimism", "uncertainty"):
        np.testing.assert_array_equal(getattr(two, name), getattr(one, name), err_msg=name)


def test_pessimism_is_psi_of_the_consecutive_count() -> None:
    y, c = windows(5, ESTIMATOR.window, seed=1)
    n = np.array([0, 1, 4, 10, 30])[: len(y)]
    est = estimate_censored_demand(y, c, n, ESTIMATOR, REWARD)
    np.testing.assert_array_equal(est.pessimism, pessimism_factor(n, REWARD))
    off = estimate_censored_demand(y, c, n, ESTIMATOR, replace(REWARD, use_pessimism=False))
    np.testing.assert_array_equal(off.pessimism, np.ones(len(n)))


def test_only_the_most_recent_window_is_used() -> None:
    y, c = windows(4, 48, seed=3)
    full = estimate_censored_demand(y, c, np.zeros(len(y), dtype=int), ESTIMATOR, REWARD)
    recent = estimate_censored_demand(y[:, -32:], c[:, -32:], np.zeros(len(y), dtype=int), ESTIMATOR, REWARD)
    np.testing.assert_array_equal(full.mean, recent.mean)


def test_edge_cases_give_finite_documented_values() -> None:
    y = np.array(
        [
            [0.5, 0.5, 0.5, 0.5, 0.5, 0.5],  # constant, uncensored: std at the floor
            [0.3, 0.4, 0.2, 0.5, 0.1, 0.2],  # all censored: no MLE
            [0.6, 0.2, 0.2, 0.2, 0.2, 0.2],  # one uncensored point above every threshold
            [0.1, 0.9, 0.9, 0.9, 0.9, 0.9],  # one uncensored point below every threshold
            [0.5, 0.5, 0.5, 0.5, 0.5, 0.5],  # nothing valid
            [0.5, 0.4, np.nan, np.nan, 0.5, 0.5],  # window still filling (NaN where invalid)
            [0.5, 0.4, 0.3, 0.2, 0.1, 0.6],  # a single censored point
        ]
    )
    c = np.array(
        [[0] * 6, [1] * 6, [0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1], [0] * 6, [0, 1, 0, 0, 1, 0], [0, 0, 0, 0, 0, 1]],
        dtype=bool,
    )
    valid = np.ones_like(c)
    valid[4] = False
    valid[5, 2:4] = False
    floor = ESTIMATOR.sigma_floor
    with np.errstate(invalid="raise", divide="raise", over="raise"):
        est = estimate_censored_demand(y, c, np.zeros(7, dtype=int), ESTIMATOR, REWARD, valid=valid)
    for values in (est.mean, est.std, est.pessimism, est.uncertainty):
        assert values.shape == (7,) and values.dtype == np.float64 and np.all(np.isfinite(values))
    assert np.all(est.std >= floor) and np.all((est.uncertainty >= 0) & (est.uncertainty <= UNCERTAINTY_CAP))
    assert est.mean[0] == pytest.approx(0.5) and est.std[0] == floor
    assert est.std[1] == pytest.approx(max(y[1].std(), floor))
    assert est.mean[1] == pytest.approx(0.5 + est.std[1]) and est.uncertainty[1] == UNCERTAINTY_CAP
    assert est.mean[2] == pytest.approx(0.6) and est.std[2] == pytest.approx(floor)
    assert est.mean[3] > 0.9  # the one low value cannot outweigh five "more than 0.9"
    assert est.mean[4] == 0.0 and est.std[4] == floor and est.uncertainty[4] == UNCERTAINTY_CAP
    assert est.mean[5] > 0.5 and est.std[5] == pytest.approx(floor)
    assert est.mean[6] > y[6, :5].mean()


def test_bad_inputs_are_rejected() -> None:
    y = np.full((2, 4), 0.5)
    c = np.zeros((2, 4), dtype=bool)
    n = np.zeros(2, dtype=int)
    with pytest.raises(EstimatorInputError):
        estimate_censored_demand(y[0], c[0], n, ESTIMATOR, REWARD)
    with pytest.raises(EstimatorInputError):
        estimate_censored_demand(y, c[:, :3], n, ESTIMATOR, REWARD)
    with pytest.raises(EstimatorInputError):
        estimate_censored_demand(y, c, np.zeros(3, dtype=int), ESTIMATOR, REWARD)
    with pytest.raises(EstimatorInputError, match="non-finite"):
        estimate_censored_demand(np.where(np.eye(2, 4, dtype=bool), np.nan, y), c, n, ESTIMATOR, REWARD)
