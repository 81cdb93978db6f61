"""Reactive calibrator, Eq. (12) / Algorithm 1 fast update (picrl_core.calibrator), in both rules."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from picrl_core.calibrator import (
    SHORTAGE_TOLERANCE,
    calibrate,
    escape_step,
    feedback,
    over_weights,
    release_escape,
    track_temperature,
)
from picrl_core.config import CalibratorConfig, CostConfig

PAPER = CalibratorConfig(
    rule="paper", margin_in_sigma=False, delta_m=0.01, delta_b=0.002, gamma=0.5, margin_limit=0.3, bias_limit=0.2
)
PINBALL = replace(PAPER, rule="pinball")
COST = CostConfig(c_under=2.0, c_over=1.0)


def _one(
    margin: float,
    bias: float,
    eta: float,
    censored: bool,
    over: bool,
    cfg: CalibratorConfig = PAPER,
    scale: float = 1.0,
) -> tuple[float, float]:
    m, b = calibrate(
        np.array([margin]), np.array([bias]), np.array([eta]), np.array([censored]), np.array([over]), cfg, COST, scale
    )
    return float(m[0]), float(b[0])


@pytest.mark.parametrize("cfg", [PAPER, PINBALL])
@pytest.mark.parametrize("eta", [0.5, 1.7, 3.0])
def test_shortage_raises_margin_and_bias_by_eta_delta(eta: float, cfg: CalibratorConfig) -> None:
    m, b = _one(0.05, -0.03, eta, censored=True, over=False, cfg=cfg)
    assert m == pytest.approx(0.05 + eta * cfg.delta_m, abs=1e-15)
    assert b == pytest.approx(-0.03 + eta * cfg.delta_b, abs=1e-15)


@pytest.mark.parametrize("eta", [0.5, 1.7, 3.0])
def test_paper_rule_lowers_margin_fully_and_bias_by_gamma(eta: float) -> None:
    m, b = _one(0.05, -0.03, eta, censored=False, over=True)
    assert m == pytest.approx(0.05 - eta * PAPER.delta_m, abs=1e-15)
    assert b == pytest.approx(-0.03 - PAPER.gamma * eta * PAPER.delta_b, abs=1e-15)


@pytest.mark.parametrize("cost", [CostConfig(2.0, 1.0), CostConfig(1.0, 1.0), CostConfig(9.0, 1.0)])
def test_pinball_rule_lowers_both_by_the_cost_ratio(cost: CostConfig) -> None:
    """The subgradient of Eq. (1): a shortage weighs c_under, an idle unit c_over."""
    assert over_weights(PINBALL, cost) == (cost.c_over / cost.c_under, cost.c_over / cost.c_under)
    m, b = calibrate(
        np.array([0.05]), np.array([-0.03]), np.array([2.0]), np.array([False]), np.array([True]), PINBALL, cost
    )
    assert m[0] == pytest.approx(0.05 - 2.0 * PINBALL.delta_m * cost.c_over / cost.c_under, abs=1e-15)
    assert b[0] == pytest.approx(-0.03 - 2.0 * PINBALL.delta_b * cost.c_over / cost.c_under, abs=1e-15)


def test_margin_step_scales_with_sigma() -> None:
    m, _ = _one(0.0, 0.0, 1.0, censored=True, over=False, cfg=PINBALL, scale=0.2)
    assert m == pytest.approx(PINBALL.delta_m * 0.2, abs=1e-15)
    m, _ = _one(0.0, 0.0, 1.0, censored=False, over=True, cfg=PINBALL, scale=0.2)
    assert m == pytest.approx(-PINBALL.delta_m * 0.2 * 0.5, abs=1e-15)


@pytest.mark.parametrize(("cfg", "expected"), [(PINBALL, 1 / 3), (PAPER, 1 / 2)])
def test_margin_settles_at_its_rules_shortage_rate(cfg: CalibratorConfig, expected: float) -> None:
    """Acting ``a = m`` on i.i.d. uniform demand, the shortage rate the margin settles at: the critical
    fractile c_over / (c_under + c_over) = 1/3 under the pinball rule, 1/2 under Eq. (12) as printed."""
    rng = np.random.default_rng(0)
    n, steps = 2000, 3000
    cfg = replace(cfg, delta_b=0.0, margin_limit=2.0)
    margin, bias = np.full(n, 0.5), np.zeros(n)
    short_count = np.zeros(n)
    for t in range(steps):
        demand = rng.random(n)
        short = demand > margin
        if t >= steps // 2:
            short_count += short
        margin, bias = calibrate(margin, bias, np.ones(n), short, ~short & (demand < margin), cfg, COST)
    assert short_count.mean() / (steps - steps // 2) == pytest.approx(expected, abs=0.01)


def test_uncensored_exact_match_changes_nothing() -> None:
    """``a == y`` and not censored: neither shortage nor over-provisioning, so no update."""
    assert _one(0.12, -0.07, 2.0, censored=False, over=False) == (0.12, -0.07)


def test_updates_are_clipped_at_the_limits() -> None:
    m, b = _one(PAPER.margin_limit - 1e-3, PAPER.bias_limit - 1e-4, 3.0, censored=True, over=False)
    assert (m, b) == (PAPER.margin_limit, PAPER.bias_limit)
    m, b = _one(-PAPER.margin_limit + 1e-3, -PAPER.bias_limit + 1e-4, 3.0, censored=False, over=True)
    assert (m, b) == (-PAPER.margin_limit, -PAPER.bias_limit)


def test_long_shortage_streak_stays_within_bounds() -> None:
    margin, bias = np.zeros(1), np.zeros(1)
    for _ in range(500):
        margin, bias = calibrate(margin, bias, np.array([3.0]), np.array([True]), np.array([False]), PINBALL, COST, 6.0)
    assert margin[0] == PINBALL.margin_limit and bias[0] == PINBALL.bias_limit


def test_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="pinball"):
        CalibratorConfig(rule="adaptive")


def test_batch_equals_row_by_row() -> None:
    rng = np.random.default_rng(4)
    n = 200
    margin = rng.uniform(-0.35, 0.35, n)  # some start outside the limits: clipping applies per row
    bias = rng.uniform(-0.25, 0.25, n)
    eta = rng.uniform(0.5, 3.0, n)
    scale = rng.uniform(0.01, 0.2, n)
    censored = rng.random(n) < 0.4
    over = ~censored & (rng.random(n) < 0.7)
    m_batch, b_batch = calibrate(margin, bias, eta, censored, over, PINBALL, COST, scale)
    rows = [_one(margin[i], bias[i], eta[i], bool(censored[i]), bool(over[i]), PINBALL, scale[i]) for i in range(n)]
    np.testing.assert_array_equal(m_batch, [r[0] for r in rows])
    np.testing.assert_array_equal(b_batch, [r[1] for r in rows])
    assert np.all(np.abs(m_batch) <= PINBALL.margin_limit) and np.all(np.abs(b_batch) <= PINBALL.bias_limit)


def test_feedback_reads_the_flag_under_pic_and_y_above_a_under_full_information() -> None:
    a = np.array([0.5, 0.5, 0.5, 0.5, 0.5])
    y = np.array([0.5, 0.5, 0.3, 0.7, 0.5 + SHORTAGE_TOLERANCE / 2])  # censored, met, over, FI short, rounding
    short, over = feedback(y, a, np.array([True, False, False, False, False]))
    np.testing.assert_array_equal(short, [True, False, False, True, False])
    np.testing.assert_array_equal(over, [False, False, True, False, False])


def _tracked_temperature(spread: float, censoring: bool, tobit: bool = True, ticks: int = 20_000) -> float:
    """Mean temperature of a unit-sigma forecast of N(0, spread^2) demand, acting at the critical quantile
    ``z* T sigma`` and seeing ``min(d, a)``; without ``tobit`` a censored tick counts at the bound it shows
    (a naive learner)."""
    cfg = CalibratorConfig(online_scale=True, scale_rate=1 / 8, scale_min=1 / 64, scale_max=8.0)
    rng = np.random.default_rng(3)
    temperature, seen = np.ones(1), []
    for demand in rng.normal(0.0, spread, ticks):
        sigma = temperature.copy()  # the predictor's sigma is 1; the controller acts with T * sigma
        action = 0.43 * sigma
        short = np.array([censoring and demand > action[0]])
        y = np.minimum(demand, action) if censoring else np.array([demand])
        temperature = track_temperature(temperature, y, np.zeros(1), sigma, short & tobit, cfg)
        seen.append(temperature[0])
    return float(np.mean(seen[ticks // 4 :]))


@pytest.mark.parametrize("spread", [0.05, 0.4, 3.0])
def test_online_temperature_finds_the_demands_spread_with_and_without_censoring(spread: float) -> None:
    assert _tracked_temperature(spread, censoring=False) == pytest.approx(spread, rel=0.12)
    assert _tracked_temperature(spread, censoring=True) == pytest.approx(spread, rel=0.12)


def test_a_naive_temperature_reads_shortages_as_a_sharp_forecast() -> None:
    """Proposition 1 for the spread: counting a censored tick at its bound shrinks the temperature."""
    assert _tracked_temperature(0.4, censoring=True, tobit=False) < 0.8 * 0.4


def test_online_temperature_stays_in_its_range() -> None:
    cfg = CalibratorConfig(online_scale=True, scale_rate=0.5, scale_min=0.1, scale_max=2.0)
    low = track_temperature(np.array([0.1]), np.array([0.0]), np.zeros(1), np.ones(1), np.zeros(1, bool), cfg)
    high = track_temperature(np.array([2.0]), np.array([50.0]), np.zeros(1), np.ones(1), np.zeros(1, bool), cfg)
    assert (low[0], high[0]) == (0.1, 2.0)
    with pytest.raises(ValueError, match="scale_rate"):
        CalibratorConfig(scale_rate=0.0)


ESCAPE = CalibratorConfig(
    delta_m=0.025, margin_in_sigma=True, escape=True, escape_limit=1.0, escape_start=1.0, escape_growth=2.0
)


def _escape_over(flags: list[str], sigma: float = 0.01, cfg: CalibratorConfig = ESCAPE) -> list[float]:
    """The escape after each tick of ``flags``: "s" short, "o" seen (uncensored, not short), "b" a censored bound
    below the action (neither)."""
    escape, streak, out = np.zeros(1), 0, []
    for flag in flags:
        streak = streak + 1 if flag in "sb" else 0
        escape = escape_step(
            escape, np.array([flag == "s"]), np.array([flag == "o"]), np.array([streak]), np.array([sigma]), cfg
        )
        out.append(float(escape[0]))
    return out


def test_a_lone_shortage_does_not_escape_and_a_streak_doubles_from_the_margins_step() -> None:
    unit = 0.025 * 0.01
    assert _escape_over(["s", "o", "s", "o"]) == [0.0] * 4
    np.testing.assert_allclose(
        _escape_over(["s"] * 6), [0.0, unit, 3 * unit, 7 * unit, 15 * unit, 31 * unit], rtol=1e-12
    )


def test_the_escape_reaches_a_gap_in_logarithmic_ticks_and_halves_once_the_demand_is_seen() -> None:
    gap, sigma = 0.4, 0.005  # a flat service's spread, and a jump of 0.4 above it
    path = _escape_over(["s"] * 40, sigma)
    ticks = next(t for t, e in enumerate(path, 1) if e >= gap)
    assert ticks <= 2 + np.ceil(np.log2(gap / (0.025 * sigma)))  # against gap / (0.025 sigma) = 3,200 margin steps
    after = _escape_over(["s"] * ticks + ["o"] * 3, sigma)
    assert after[-3:] == pytest.approx([after[ticks - 1] / 2, after[ticks - 1] / 4, after[ticks - 1] / 8])


def test_a_bound_below_the_action_holds_the_escape_and_the_limit_caps_it() -> None:
    held = _escape_over(["s", "s", "s", "b", "b"])
    assert held[3] == held[4] == held[2] > 0
    capped = _escape_over(["s"] * 80, sigma=0.5, cfg=replace(ESCAPE, escape_limit=0.3))
    assert max(capped) == capped[-1] == 0.3 and np.isfinite(capped).all()


def test_the_escape_starts_at_its_configured_number_of_margin_steps() -> None:
    unit = 0.025 * 0.01
    np.testing.assert_allclose(
        _escape_over(["s"] * 4, cfg=replace(ESCAPE, escape_start=4.0)),
        [0.0, 4 * unit, 12 * unit, 28 * unit],
        rtol=1e-12,
    )


def test_each_step_of_the_search_is_the_configured_growth_times_the_last() -> None:
    unit = 0.025 * 0.01
    np.testing.assert_allclose(
        _escape_over(["s"] * 5, cfg=replace(ESCAPE, escape_growth=4.0)),
        [0.0, unit, 5 * unit, 21 * unit, 85 * unit],
        rtol=1e-12,
    )
    with pytest.raises(ValueError, match="escape_growth"):
        CalibratorConfig(escape_growth=0.5)


def test_an_escape_limit_and_start_must_be_positive() -> None:
    with pytest.raises(ValueError, match="escape_limit"):
        CalibratorConfig(escape_limit=0.0)
    with pytest.raises(ValueError, match="escape_start"):
        CalibratorConfig(escape_start=0.0)


@pytest.mark.parametrize(
    "release, expected",
    [
        ("halve", [0.2, 0.2, 0.2, 0.2]),  # escape_step's half of e_t, whatever the demand seen
        ("hold", [0.2, 0.3, 0.4, 0.2]),  # not below min(e_t, y - mu'), the demand just seen
        ("handover", [0.0, 0.3, 0.4, 0.2]),  # only that, at least 0
    ],
)
def test_a_seen_demand_releases_the_escape_by_its_rule(release: str, expected: list[float]) -> None:
    cfg = CalibratorConfig(escape_release=release)
    previous, halved = np.full(4, 0.4), np.full(4, 0.2)
    y, mu = np.array([0.5, 0.8, 0.95, 0.9]), np.array([0.6, 0.5, 0.5, 0.7])
    seen = np.array([True, True, True, True])
    np.testing.assert_allclose(release_escape(halved, previous, seen, y, mu, cfg), expected, rtol=1e-12)
    np.testing.assert_array_equal(release_escape(halved, previous, ~seen, y, mu, cfg), halved)  # not seen: kept
    with pytest.raises(ValueError, match="escape_release"):
        CalibratorConfig(escape_release="drop")
