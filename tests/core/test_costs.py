"""Asymmetric cost Eq. (1), regret Eq. (2) and episode metrics (picrl_core.costs)."""

from __future__ import annotations

import numpy as np
import pytest

from picrl_core.config import CostConfig
from picrl_core.costs import (
    EpisodeMetrics,
    EpisodeShapeError,
    asymmetric_cost,
    cumulative_regret,
    episode_metrics,
)

COST = CostConfig()  # c_under = 2, c_over = 1


def test_asymmetric_cost_hand_values() -> None:
    a = np.array([0.5, 0.7, 0.2])
    d = np.array([0.6, 0.5, 0.2])
    # shortage 0.1 * 2, idle 0.2 * 1, exact 0
    np.testing.assert_allclose(asymmetric_cost(a, d, COST), [0.2, 0.2, 0.0], atol=1e-15)
    other = CostConfig(c_under=3.0, c_over=0.5)
    np.testing.assert_allclose(asymmetric_cost(a, d, other), [0.3, 0.1, 0.0], atol=1e-15)


def test_asymmetric_cost_broadcasts() -> None:
    out = asymmetric_cost(0.5, np.array([[0.0], [1.0]]), COST)
    np.testing.assert_allclose(out, [[0.5], [1.0]])


def test_episode_metrics_hand_values() -> None:
    m = episode_metrics([0.5, 0.7, 0.2], [0.6, 0.5, 0.2], COST)
    assert m.mae == pytest.approx(0.1)
    assert m.regret == pytest.approx(0.4)
    assert m.shortage_rate == pytest.approx(1 / 3)
    assert m.under_mass == pytest.approx(0.1)
    assert m.over_mass == pytest.approx(0.2)
    assert m.action_variance == pytest.approx(0.126666666666666 / 3)
    assert m.steps == 3
    assert m.to_dict() == {
        "mae": m.mae,
        "regret": m.regret,
        "shortage_rate": m.shortage_rate,
        "under_mass": m.under_mass,
        "over_mass": m.over_mass,
        "action_variance": m.action_variance,
        "steps": 3,
    }


def test_regret_is_the_cost_weighted_under_and_over_mass() -> None:
    rng = np.random.default_rng(3)
    a, d = rng.uniform(size=200), rng.uniform(size=200)
    cost = CostConfig(c_under=2.5, c_over=0.7)
    m = episode_metrics(a, d, cost)
    assert m.regret == pytest.approx(cost.c_under * m.under_mass + cost.c_over * m.over_mass)
    assert m.mae * m.steps == pytest.approx(m.under_mass + m.over_mass)
    assert m.shortage_rate == pytest.approx(np.mean(d > a))


def test_multi_service_episode_is_pooled() -> None:
    rng = np.random.default_rng(0)
    a, d = rng.uniform(size=(50, 3)), rng.uniform(size=(50, 3))
    pooled = episode_metrics(a, d, COST)
    flat = episode_metrics(a.ravel(), d.ravel(), COST)
    for name in ("mae", "regret", "shortage_rate", "under_mass", "over_mass"):
        assert getattr(pooled, name) == pytest.approx(getattr(flat, name))
    assert pooled.steps == 150
    # Temporal variance per service, averaged: service levels do not inflate it.
    assert pooled.action_variance == pytest.approx(np.mean([np.var(a[:, j]) for j in range(3)]))
    shifted = episode_metrics(a + np.array([0.0, 5.0, 10.0]), d, COST)
    assert shifted.action_variance == pytest.approx(pooled.action_variance)


def test_cumulative_regret_accumulates_per_tick_cost() -> None:
    rng = np.random.default_rng(1)
    a, d = rng.uniform(size=(40, 2)), rng.uniform(size=(40, 2))
    curve = cumulative_regret(a, d, COST)
    assert curve.shape == (40,)
    assert np.all(np.diff(curve) >= 0)
    np.testing.assert_allclose(np.diff(curve), asymmetric_cost(a, d, COST).sum(axis=1)[1:])
    assert curve[-1] == pytest.approx(episode_metrics(a, d, COST).regret)
    np.testing.assert_allclose(cumulative_regret([0.5, 0.7, 0.2], [0.6, 0.5, 0.2], COST), [0.2, 0.4, 0.4])


@pytest.mark.parametrize(
    "actions, demand",
    [
        (np.zeros(3), np.zeros(4)),
        (np.zeros(0), np.zeros(0)),
        (np.zeros((2, 2, 2)), np.zeros((2, 2, 2))),
        (np.zeros((0, 3)), np.zeros((0, 3))),
    ],
)
def test_malformed_episodes_are_rejected(actions: np.ndarray, demand: np.ndarray) -> None:
    with pytest.raises(EpisodeShapeError):
        episode_metrics(actions, demand, COST)
    with pytest.raises(ValueError):
        cumulative_regret(actions, demand, COST)


def test_metrics_are_frozen() -> None:
    m = episode_metrics([0.1], [0.2], COST)
    assert isinstance(m, EpisodeMetrics)
    with pytest.raises(AttributeError):
        m.mae = 0.0  # type: ignore[misc]
