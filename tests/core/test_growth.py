"""The product protocol's range rule, the loop around any method, its metrics, the recent-maximum rule."""

from __future__ import annotations

import numpy as np
import pytest

from picrl_core import synthetic
from picrl_core.config import CostConfig
from picrl_core.costs import mean_service_metrics
from picrl_core.growth_metrics import catch_up_ticks, growth_metrics
from picrl_core.methods.base import Provisioner
from picrl_core.methods.growth import RangeGrowth, run_growth_loop
from picrl_core.methods.headroom import RecentMaxProvisioner
from picrl_core.scaling import floor_streak, next_high, next_low


def test_a_range_grows_on_the_nth_short_tick_at_its_top_unless_fixed_or_the_factor_is_one() -> None:
    low, high = np.zeros(4), np.full(4, 10.0)
    action = np.array([1.0, 1.0, 0.9, 1.0])
    short = np.array([True, True, True, False])
    streak = np.array([3, 2, 5, 0])
    assert np.array_equal(next_high(low, high, action, short, streak, after=3, factor=2.0), [20.0, 10, 10, 10])
    fixed = np.array([True, False, False, False])
    assert np.array_equal(next_high(low, high, action, short, streak, after=3, factor=2.0, fixed=fixed), high)
    assert np.array_equal(next_high(low, high, action, short, streak, after=3, factor=1.0), high)
    assert np.array_equal(next_high(low + 4.0, high, action, short, streak, after=2, factor=1.5), [13.0, 13, 10, 10])


def test_growth_metrics_on_a_hand_built_series() -> None:
    cost = CostConfig(c_under=2.0, c_over=1.0)
    demand = np.array([8.0, 12.0, 14.0, 15.0, 9.0])  # peak 10: above it on ticks 1-3
    capacity = np.array([10.0, 10.0, 12.0, 16.0, 16.0])
    metrics = growth_metrics(capacity, demand, 10.0, cost)
    assert metrics["shortfall_above_peak"] == pytest.approx(2.0 + 2.0)  # ticks 1 and 2; tick 3 is covered
    assert metrics["ticks_above_peak"] == 3.0
    assert metrics["catch_up_ticks"] == 2.0  # outgrown at tick 1, caught up at tick 3
    assert metrics["over_cost_native"] == pytest.approx(1.0 * (2.0 + 1.0 + 7.0))
    assert catch_up_ticks(np.full(5, 10.0), demand, 10.0) == 3.0  # caught up when demand falls back
    rising = np.array([8.0, 12.0, 14.0, 15.0, 16.0])
    assert catch_up_ticks(np.full(5, 10.0), rising, 10.0) == 4.0  # never caught up: the ticks left
    assert np.isnan(catch_up_ticks(capacity, np.full(5, 9.0), 10.0))  # never outgrown
    pair = np.column_stack([demand, np.full(5, 9.0)])  # the second service never outgrows
    fleet = growth_metrics(np.column_stack([capacity, capacity]), pair, 10.0, cost)
    assert fleet["catch_up_ticks"] == 2.0 and fleet["shortfall_above_peak"] == pytest.approx(2.0)


class Top(Provisioner):
    """Always the top of the range; counts its starts."""

    def __init__(self) -> None:
        self.starts = 0
        self.history: list[np.ndarray] = []

    def start(self, history: np.ndarray, history_context: np.ndarray | None) -> np.ndarray:
        self.starts += 1
        self.history.append(history.copy())
        return np.ones(history.shape[0])

    def act(self, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        return np.ones(y.shape[0])


def test_the_loop_grows_the_range_as_the_worker_and_restarts_a_method_that_cannot_follow_it() -> None:
    demand = np.array([5.0, 12.0, 12.0, 12.0, 12.0, 25.0, 25.0, 25.0, 25.0])[:, None]  # native; range [0, 10]
    top = Top()
    run = run_growth_loop(top, demand, np.full((1, 4), 0.5), 0.0, 10.0, RangeGrowth(factor=2.0, after=3))
    # short on ticks 1-3 at the top: the range grows after the third (20), then after ticks 5-7 (40)
    assert run.high[:, 0].tolist() == [10.0, 10, 10, 10, 20, 20, 20, 20, 40]
    assert run.capacity[:, 0].tolist() == [10.0, 10, 10, 10, 20, 20, 20, 20, 40]
    assert run.censored[:, 0].tolist() == [False, True, True, True, False, True, True, True, False]
    assert top.starts == 3  # the first start and one restart per growth
    # the restart's history: the last 4 feedback values, re-expressed in the grown range
    assert np.allclose(top.history[1], [[0.25, 0.5, 0.5, 0.5]])


def test_the_recent_maximum_rule_adds_its_headroom_in_native_units_and_follows_a_grown_range() -> None:
    rule = RecentMaxProvisioner(window=3, headroom=0.1, low=100.0, high=200.0)
    first = rule.start(np.array([[0.0, 0.5, 0.2, 0.1]]), None)  # last 3 native: 150, 120, 110
    assert first == pytest.approx([(1.1 * 150 - 100) / 100])
    assert rule.act(np.array([0.3]), np.array([False]), None) == pytest.approx([(1.1 * 130 - 100) / 100])
    assert rule.moved(np.array([100.0]), np.array([200.0]), np.array([100.0]), np.array([300.0])) == pytest.approx(
        [(1.1 * 130 - 100) / 200]
    )
    demand = np.linspace(150.0, 400.0, 40)[:, None]
    run = run_growth_loop(
        RecentMaxProvisioner(3, 0.1, 100.0, 200.0), demand, np.full((1, 3), 0.5), 100.0, 200.0, RangeGrowth()
    )
    assert run.high[-1, 0] > 400.0 and run.capacity[-1, 0] >= demand[-1, 0]  # it caught up with the growth


def test_a_floor_comes_down_to_a_share_of_the_usage_on_the_mth_tick_below_it_unless_fixed_or_m_is_zero() -> None:
    low = np.full(4, 10.0)
    usage = np.array([4.0, 4.0, 12.0, 4.0])
    short = np.array([False, True, False, False])
    streak = floor_streak(np.array([2, 2, 2, 0]), usage, low, short)
    assert streak.tolist() == [3, 0, 0, 1]  # a short tick or one at or above the floor breaks the run
    new_low, after = next_low(low, usage, streak, after=3, share=0.5)
    assert new_low.tolist() == [2.0, 10, 10, 10] and after.tolist() == [0, 0, 0, 1]  # the run restarts
    fixed = np.array([True, False, False, False])
    assert next_low(low, usage, streak, after=3, share=0.5, fixed=fixed)[0].tolist() == low.tolist()
    assert next_low(low, usage, streak, after=0, share=0.5)[0].tolist() == low.tolist()
    assert next_low(low, usage, streak, after=1, share=0.0)[0].tolist() == [0.0, 10, 10, 0]


def busy_then_idle_nights() -> tuple[np.ndarray, np.ndarray, float, float]:
    """(demand, night ticks) of a daily wave whose nights go idle after its first two days, and the range of those
    two days."""
    n, period = 720, 144
    demand = synthetic.idle_nights(n, period=period, idle_from=2 * period / n, seed=4)
    history = demand[: 2 * period]
    return demand[2 * period :], synthetic.night_ticks(n, period)[2 * period :], history.min(), history.max()


def test_a_service_that_idles_at_night_gives_its_capacity_back() -> None:
    demand, night, low, high = busy_then_idle_nights()
    history = np.full((1, 3), 0.5)
    fixed = run_growth_loop(
        RecentMaxProvisioner(3, 0.1, low, high), demand[:, None], history, low, high, RangeGrowth(shrink_after=0)
    )
    moving = run_growth_loop(
        RecentMaxProvisioner(3, 0.1, low, high), demand[:, None], history, low, high, RangeGrowth()
    )
    night_demand = np.median(demand[night])
    assert np.median(fixed.capacity[night, 0]) >= low > 5 * night_demand  # the fixed floor: 8x the night
    assert np.median(moving.capacity[night, 0]) <= 2 * night_demand
    assert (moving.low[-1] < low).all() and (moving.high[-1] >= high).all()  # the floor came down, the top stayed
    # the mornings' shortages (the rule re-learns the day in ~20 ticks) cost less than the nights saved
    fixed_cost, moving_cost = (
        mean_service_metrics(run.capacity, demand[:, None], CostConfig()) for run in (fixed, moving)
    )
    assert moving_cost.under_mass > fixed_cost.under_mass and moving_cost.regret < 0.8 * fixed_cost.regret
