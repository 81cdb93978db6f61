"""Reactive calibrator, Eq. (12) / Algorithm 1 fast update (picrl_core.calibrator)."""
from __future__ import annotations

import numpy as np
import pytest

from picrl_core.calibrator import calibrate
from picrl_core.config import CalibratorConfig

CFG = CalibratorConfig(delta_m=0.01, delta_b=0.002, gamma=0.5, margin_limit=0.3, bias_limit=0.2)


def _one(margin: float, bias: float, eta: float, censored: bool, over: bool,
         cfg: CalibratorConfig = CFG) -> tuple[float, float]:
    m, b = calibrate(np.array([margin]), np.array([bias]), np.array([eta]), np.array([censored]),
                     np.array([over]), cfg)
    return float(m[0]), float(b[0])


@pytest.mark.parametrize("eta", [0.5, 1.7, 3.0])
def test_shortage_raises_margin_and_bias_by_eta_delta(eta: float) -> None:
    m, b = _one(0.05, -0.03, eta, censored=True, over=False)
    assert m == pytest.approx(0.05 + eta * CFG.delta_m, abs=1e-15)
    assert b == pytest.approx(-0.03 + eta * CFG.delta_b, abs=1e-15)


@pytest.mark.parametrize("eta", [0.5, 1.7, 3.0])
def test_over_provisioned_step_lowers_margin_fully_and_bias_by_gamma(eta: float) -> None:
    m, b = _one(0.05, -0.03, eta, censored=False, over=True)
    assert m == pytest.approx(0.05 - eta * CFG.delta_m, abs=1e-15)
    assert b == pytest.approx(-0.03 - CFG.gamma * eta * CFG.delta_b, abs=1e-15)


def test_uncensored_exact_match_changes_nothing() -> None:
    """``a == y`` and not censored: neither shortage nor over-provisioning, so no update."""
    assert _one(0.12, -0.07, 2.0, censored=False, over=False) == (0.12, -0.07)


def test_updates_are_clipped_at_the_limits() -> None:
    m, b = _one(CFG.margin_limit - 1e-3, CFG.bias_limit - 1e-4, 3.0, censored=True, over=False)
    assert (m, b) == (CFG.margin_limit, CFG.bias_limit)
    m, b = _one(-CFG.margin_limit + 1e-3, -CFG.bias_limit + 1e-4, 3.0, censored=False, over=True)
    assert (m, b) == (-CFG.margin_limit, -CFG.bias_limit)


def test_long_shortage_streak_stays_within_bounds() -> None:
    margin, bias = np.zeros(1), np.zeros(1)
    for _ in range(500):
        margin, bias = calibrate(margin, bias, np.array([3.0]), np.array([True]), np.array([False]), CFG)
    assert margin[0] == CFG.margin_limit and bias[0] == CFG.bias_limit


def test_batch_equals_row_by_row() -> None:
    rng = np.random.default_rng(4)
    n = 200
    margin = rng.uniform(-0.35, 0.35, n)  # some start outside the limits: clipping applies per row
    bias = rng.uniform(-0.25, 0.25, n)
    eta = rng.uniform(0.5, 3.0, n)
    censored = rng.random(n) < 0.4
    over = ~censored & (rng.random(n) < 0.7)
    m_batch, b_batch = calibrate(margin, bias, eta, censored, over, CFG)
    rows = [_one(margin[i], bias[i], eta[i], bool(censored[i]), bool(over[i])) for i in range(n)]
    np.testing.assert_array_equal(m_batch, [r[0] for r in rows])
    np.testing.assert_array_equal(b_batch, [r[1] for r in rows])
    assert np.all(np.abs(m_batch) <= CFG.margin_limit) and np.all(np.abs(b_batch) <= CFG.bias_limit)
