"""The portfolio rule: what censored feedback reveals of each candidate's cost, the choice with its switching price,
the fleet's start, its row and its moves to a new range."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from picrl_core.artifact import save_artifact
from picrl_core.config import CostConfig, PicRLConfig
from picrl_core.controller import PicRLController
from picrl_core.costs import asymmetric_cost
from picrl_core.deployable import deployed_rule, load_model
from picrl_core.methods.portfolio import CHOICES, train_portfolio
from picrl_core.policy import PolicyNetwork
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.rules.portfolio import (
    CANDIDATES,
    POOL,
    PortfolioParameters,
    PortfolioRule,
    own_feedback,
    truncated_survival,
)
from picrl_core.series import prepare_fleet
from picrl_core.simulator import censor

COST = CostConfig()


def _parameters(start: tuple[float, ...] = (0.0, 0.0, 0.0), price: float = 0.5) -> PortfolioParameters:
    calibration = tuple(np.linspace(-0.1, 0.1, POOL).tolist())
    return PortfolioParameters(0.99, price, 0.005, 0.01, calibration, start)


def test_the_shortage_probability_of_an_undetermined_candidate_is_its_monte_carlo_share() -> None:
    rng = np.random.default_rng(0)
    mu, sigma, a = 0.5, 0.1, 0.55
    draws = rng.normal(mu, sigma, 2_000_000)
    draws = draws[draws > a]
    for candidate in (0.56, 0.6, 0.7, 0.9):
        share = float(np.mean(draws > candidate))
        assert float(truncated_survival(np.array(mu), np.array(sigma), np.array(a), np.array(candidate))) == (
            pytest.approx(share, abs=2e-3)
        )
    far = truncated_survival(np.array([0.0]), np.array([0.1]), np.array([5.0]), np.array([5.5]))
    assert np.isfinite(far).all() and 0.0 <= far[0] <= 1.0


@pytest.fixture()
def rule(tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig) -> PortfolioRule:
    config = replace(tiny_config, online=replace(tiny_config.online, explore=False))
    return PortfolioRule(tiny_predictor, tiny_policy, config, _parameters())


def _start(rule: PortfolioRule, diurnal_series: np.ndarray, services: int = 3):  # type: ignore[no-untyped-def]
    history = np.stack([diurnal_series[1600 + 5 * i : 1616 + 5 * i] for i in range(services)])
    return rule.initial_state(np.arange(services, dtype=np.uint64), history, np.zeros(services), np.ones(services))


def test_a_censored_tick_charges_a_lower_candidate_exactly_credits_a_higher_one_and_an_uncensored_one_reveals_all(
    rule: PortfolioRule, diurnal_series: np.ndarray
) -> None:
    state = _start(rule, diurnal_series)
    state.action = state.action - np.array([0.0, 0.2, 0.0])  # service 1: a scheduler applied less than every order
    a = state.action.copy()
    candidates = np.clip(state.own.orders, 0.0, 1.0)
    assert (candidates[1] > a[1]).all() and (candidates[0] <= a[0]).any()
    censored = np.array([True, True, False])
    y = np.where(censored, a, a - 0.05)
    new, transition = rule.step(state, y, censored)
    assert transition is None
    delta = new.own.scores - rule.settings.forgetting * state.own.scores
    for j in range(len(CANDIDATES)):
        for i in (0, 1):
            # exact below the shortage; above it, the bound's lower end: it covered the shortage
            assert delta[i, j] == pytest.approx(COST.c_under * (a[i] - candidates[i, j]))
        exact = asymmetric_cost(candidates[2, j], y[2], COST) - asymmetric_cost(a[2], y[2], COST)
        assert delta[2, j] == pytest.approx(exact)


def test_the_feedback_of_the_deployed_action_tells_pic_rl_what_it_reveals_of_its_own_order() -> None:
    deployed = np.array([0.5, 0.5, 0.5, 0.5, 0.5])
    own = np.array([0.4, 0.6, 0.4, 0.6, 0.5])
    demand = np.array([0.7, 0.7, 0.45, 0.45, 0.7])
    y, censored = censor(demand, deployed)
    seen, short = own_feedback(y, censored, own)
    # determined: censored above a^0 (short at a^0), seen below a^0 (exact), seen above a^0 (short at a^0)
    for i in (0, 2, 3):
        assert (seen[i], short[i]) == tuple(censor(demand[i], own[i]))
    # undetermined: a^0 above a censored a_t keeps the lower bound d > a_t
    assert (seen[1], short[1]) == (0.5, True)
    # a^0 the deployed action: its own feedback
    assert (seen[4], short[4]) == (y[4], censored[4])


def test_deployed_on_every_tick_its_controller_is_pic_rl_alone_bit_for_bit(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig, diurnal_series: np.ndarray
) -> None:
    config = replace(tiny_config, online=replace(tiny_config.online, explore=False))
    rule = PortfolioRule(tiny_predictor, tiny_policy, config, _parameters((0.0, 50.0, 50.0)))
    alone = PicRLController(tiny_predictor, tiny_policy, config)
    state = _start(rule, diurnal_series)
    history = np.stack([diurnal_series[1600 + 5 * i : 1616 + 5 * i] for i in range(3)])
    reference = alone.initial_state(np.arange(3, dtype=np.uint64), history)
    demand = np.stack([diurnal_series[1616 + 5 * i : 1676 + 5 * i] for i in range(3)], axis=1) * 1.1
    for d in demand:
        assert (state.own.chosen == 0).all() and np.array_equal(state.action, reference.action)
        state, _ = rule.step(state, *censor(d, state.action))
        reference, _ = alone.step(reference, *censor(d, reference.action))
    assert np.array_equal(state.controller.mu, reference.mu)
    assert np.array_equal(state.censor_streak, reference.censor_streak)


def test_a_pic_rl_order_above_a_censored_deployed_action_is_neither_short_nor_over(
    rule: PortfolioRule, diurnal_series: np.ndarray
) -> None:
    state = _start(rule, diurnal_series, 1)
    own = state.controller.action.copy()
    state.action = own - 0.1  # a scheduler applied less than PIC-RL's order, and it was short
    new, _ = rule.step(state, state.action, np.array([True]))
    assert new.censor_streak[0] == 1  # the deployed action's streak
    # the calibrator's margin and bias hold: a shortage at a^0 would raise them, an over-provisioned tick lower them
    assert (new.controller.margin, new.controller.bias) == (state.controller.margin, state.controller.bias)
    short, _ = rule.controller.step(state.controller, own, np.array([True]))
    assert short.margin[0] > state.controller.margin[0] and short.bias[0] > state.controller.bias[0]
    assert new.controller.action[0] == np.clip(new.own.orders[0, 0], 0.0, 1.0)


def test_the_choice_switches_only_once_the_leader_saved_the_price(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig, diurnal_series: np.ndarray
) -> None:
    config = replace(tiny_config, online=replace(tiny_config.online, explore=False))
    starts = {0.4: 0, 0.6: 1}  # conformal ahead of PIC-RL by less, then by more, than the price 0.5
    for lead, chosen in starts.items():
        rule = PortfolioRule(tiny_predictor, tiny_policy, config, _parameters((lead, 0.0, 10.0)))
        state = _start(rule, diurnal_series, 1)
        state.own.chosen = 0
        decided = rule._decide(state.controller, state.own.copy())
        assert decided.own.chosen[0] == chosen
        assert decided.action[0] == np.clip(decided.own.orders[0, chosen], 0.0, 1.0)
        weights = np.exp(-(np.array([lead, 0.0, 10.0])) / 0.5)
        assert decided.own.weight[0] == pytest.approx(weights[chosen] / weights.sum())
        assert rule.choice(decided) == ([CANDIDATES[chosen]], decided.own.weight)


def test_a_new_service_starts_on_pic_rl_unless_the_fleets_leader_is_ahead_by_the_price(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig, diurnal_series: np.ndarray
) -> None:
    for start, chosen in {(1.0, 3.0, 0.0): 2, (0.3, 3.0, 0.0): 0}.items():  # the price is 0.5
        rule = PortfolioRule(tiny_predictor, tiny_policy, tiny_config, _parameters(start))
        state = _start(rule, diurnal_series)
        assert (state.own.chosen == chosen).all()
        assert (state.own.scores == np.array(start)).all()


def test_the_row_packs_and_unpacks_bit_for_bit_under_2_kib(rule: PortfolioRule, diurnal_series: np.ndarray) -> None:
    state = _start(rule, diurnal_series)
    state, _ = rule.step(state, state.action * 0.9, np.zeros(3, dtype=bool))
    rows = rule.codec.pack(state)
    assert rows.dtype.itemsize < 2048
    again = rule.codec.unpack(rows)
    assert rule.codec.pack(again).tobytes() == rows.tobytes()
    stepped, _ = rule.step(again, again.action, np.ones(3, dtype=bool))
    direct, _ = rule.step(state, state.action, np.ones(3, dtype=bool))
    assert rule.codec.pack(stepped).tobytes() == rule.codec.pack(direct).tobytes()


def test_a_moved_range_keeps_the_native_orders_and_leaves_unmoved_services_alone(
    rule: PortfolioRule, diurnal_series: np.ndarray
) -> None:
    state = _start(rule, diurnal_series)
    low, high = np.zeros(3), np.ones(3)
    new_low, new_high = np.zeros(3), np.array([1.0, 2.0, 4.0])
    moved = rule.rescale(state, low, high, new_low, new_high)
    assert moved.own[0].tobytes() == state.own[0].tobytes()
    assert np.allclose(moved.own.orders * new_high[:, None], state.own.orders)
    assert np.allclose(moved.own.scores * new_high[:, None], state.own.scores)
    assert np.array_equal(rule.unclipped(moved), moved.own.orders[np.arange(3), moved.own.chosen])


def test_a_fitted_fleet_model_keeps_the_fleets_start_and_serves_it_after_a_reload(
    tiny_config: PicRLConfig, diurnal_series: np.ndarray, tmp_path: Path
) -> None:
    fleet = prepare_fleet(np.stack([diurnal_series, diurnal_series[::-1]], axis=1), "two")
    artifact = train_portfolio(fleet, tiny_config)
    settings = PortfolioParameters.from_dict(artifact.parameters)
    assert artifact.method == "portfolio" and (settings.forgetting, settings.price) in CHOICES
    assert min(settings.start_scores) == 0.0 and len(settings.calibration) == POOL
    rule = deployed_rule(load_model(save_artifact(artifact, tmp_path / "model")), "portfolio")
    assert isinstance(rule, PortfolioRule) and rule.settings == settings
