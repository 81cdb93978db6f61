"""The shortage's E-step under a forecast that repeats the last seen demand or is the Gaussian (picrl_core.repeats)."""

from __future__ import annotations

from dataclasses import replace
from statistics import NormalDist

import numpy as np
import pytest

from picrl_core.config import EstimatorConfig, PicRLConfig
from picrl_core.controller import PicRLController
from picrl_core.mills import mean_above
from picrl_core.policy import PolicyNetwork
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.repeats import inside_range, mean_above_or_repeat, repeat_quantile, repeats_in, track_repeats


def test_without_repeats_or_with_the_repeat_below_the_bound_the_e_step_is_the_gaussians_bit_for_bit() -> None:
    mu, sigma, bound = np.array([0.4, 0.5, 0.2]), np.array([0.05, 0.1, 0.02]), np.array([0.45, 0.48, 0.25])
    gaussian = mean_above(mu, sigma, bound)
    np.testing.assert_array_equal(mean_above_or_repeat(mu, sigma, bound, np.zeros(3), np.full(3, 0.9)), gaussian)
    # a repeat at or below the bound cannot have been short: only the Gaussian is left
    np.testing.assert_array_equal(mean_above_or_repeat(mu, sigma, bound, np.full(3, 0.9), bound), gaussian)


def test_the_e_step_weighs_the_repeat_by_its_posterior_given_the_shortage() -> None:
    mu, sigma, bound, share, seen = 0.40, 0.05, 0.43, 0.8, 0.44
    tail = NormalDist(mu, sigma)
    survival = 1.0 - tail.cdf(bound)
    weight = share / (share + (1.0 - share) * survival)
    expected = weight * seen + (1.0 - weight) * float(mean_above(mu, sigma, bound))
    got = mean_above_or_repeat(
        np.array([mu]), np.array([sigma]), np.array([bound]), np.array([share]), np.array([seen])
    )
    assert got[0] == pytest.approx(expected, rel=1e-12)
    assert seen < got[0] < float(mean_above(mu, sigma, bound))  # between the plateau and the Gaussian's tail mean
    always = mean_above_or_repeat(np.array([mu]), np.array([sigma]), np.array([bound]), np.ones(1), np.array([seen]))
    assert always[0] == seen  # a service whose demand always repeated: the plateau itself


def test_far_in_the_gaussians_tail_even_a_rare_repeat_takes_the_shortage() -> None:
    # a capacity 40 sigma above the forecast: a shortage there is (almost) only possible as the repeat
    got = mean_above_or_repeat(np.array([0.2]), np.array([0.005]), np.array([0.4]), np.array([0.01]), np.array([0.45]))
    assert got[0] == pytest.approx(0.45, abs=1e-12)


def test_a_repeat_is_equality_up_to_float32_rounding_and_no_more() -> None:
    last = np.full(3, 0.3)
    y = np.array([float(np.float32(0.3)), 0.3 + 2e-7, 0.3])
    share, _ = track_repeats(np.zeros(3), last, y, np.ones(3, bool), np.ones(3, bool), rate=1.0)
    np.testing.assert_array_equal(share, [1.0, 0.0, 1.0])


def test_the_share_of_repeats_moves_only_on_a_seen_tick_after_a_seen_tick() -> None:
    share, last = np.full(4, 0.5), np.array([0.3, 0.3, 0.3, 0.3])
    y = np.array([0.3, 0.4, 0.3, 0.35])
    observed = np.array([True, True, False, True])
    after_seen = np.array([True, True, True, False])
    new_share, new_last = track_repeats(share, last, y, observed, after_seen, rate=0.25)
    np.testing.assert_allclose(new_share, [0.625, 0.375, 0.5, 0.5])  # repeat, change, unseen, first after a streak
    np.testing.assert_array_equal(new_last, [0.3, 0.4, 0.3, 0.35])  # every seen demand becomes the last seen


def test_the_cold_start_share_is_the_historys_share_of_repeated_pairs() -> None:
    history = np.array([[1.0, 1.0, 2.0, 2.0, 2.0], [0.1, 0.2, 0.3, 0.4, 0.5]], dtype=np.float32)
    np.testing.assert_allclose(repeats_in(history), [0.75, 0.0])
    np.testing.assert_array_equal(repeats_in(np.ones((2, 1))), [0.0, 0.0])  # one value: no pair


def test_a_shortage_on_a_plateau_enters_the_window_at_the_plateau(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig
) -> None:
    window = tiny_config.predictor.window
    history = np.full((1, 3 * window), 0.6)
    for repeat in (True, False):
        config = replace(
            tiny_config, estimator=replace(tiny_config.estimator, impute_window=True, impute_repeat=repeat)
        )
        controller = PicRLController(tiny_predictor, tiny_policy, config)
        state = controller.initial_state(np.zeros(1, np.uint64), history)
        assert state.repeat_share[0] == 1.0 and state.last_seen[0] == pytest.approx(0.6)
        state = replace(state, action=np.array([0.5]))  # provisioned below the plateau: short, seen at 0.5
        new, _ = controller.step(state, np.array([0.5]), np.array([True]))
        expected = 0.6 if repeat else mean_above(state.mu, state.sigma, state.action)[0]
        assert new.observations[0, -1] == np.float32(expected) and not new.censored[0, -1]
        assert new.last_seen[0] == state.last_seen[0] and new.repeat_share[0] == 1.0  # nothing seen: both hold


def test_a_repeat_rate_outside_0_1_is_refused() -> None:
    for rate in (0.0, 1.5):
        with pytest.raises(ValueError, match="repeat_rate"):
            EstimatorConfig(repeat_rate=rate)


def test_a_short_historys_padding_counts_as_no_repeat(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig
) -> None:
    controller = PicRLController(tiny_predictor, tiny_policy, tiny_config)
    distinct = np.array([[0.1, 0.2, 0.3], [0.4, 0.4, 0.5]])  # padded on the left to the window by their first value
    state = controller.initial_state(np.arange(2, dtype=np.uint64), distinct)
    np.testing.assert_allclose(state.repeat_share, [0.0, 0.5])
    np.testing.assert_allclose(state.last_seen, [0.3, 0.5])
    assert controller.initial_state(np.zeros(1, np.uint64), np.array([[0.7]])).repeat_share[0] == 0.0


def test_a_tick_nobody_saw_leaves_the_share_and_the_last_seen_demand(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig
) -> None:
    controller = PicRLController(tiny_predictor, tiny_policy, tiny_config)
    state = controller.initial_state(np.zeros(1, np.uint64), np.full((1, 3 * tiny_config.predictor.window), 0.6))
    state = replace(state, action=np.array([0.5]))
    y, flag = np.array([0.3]), np.array([False])  # over-provisioned, seen at 0.3: no repeat of 0.6
    unseen, _ = controller.step(state, y, flag, None, np.array([True]))
    assert (unseen.repeat_share[0], unseen.last_seen[0]) == (state.repeat_share[0], state.last_seen[0])
    seen, _ = controller.step(state, y, flag)
    assert seen.last_seen[0] == 0.3 and seen.repeat_share[0] == pytest.approx(1.0 - tiny_config.estimator.repeat_rate)


TAU = 2.0 / 3.0  # the critical fractile of the default costs (c_under 2, c_over 1)
Z_STAR = NormalDist().inv_cdf(TAU)


def _mixture_cdf(x: float, action: float, sigma: float, share: float, seen: float, left: bool = False) -> float:
    """``F(x)`` (``F(x-)`` with ``left``) of the repeat mixture; its Gaussian part's 2/3 quantile is ``action``."""
    gaussian = NormalDist(action - Z_STAR * sigma, sigma).cdf(x)
    return share * (x > seen if left else x >= seen) + (1.0 - share) * gaussian


@pytest.mark.parametrize(
    ("share", "seen"), [(0.9, 0.30), (0.2, 0.90), (0.2, 0.10), (0.5, 0.55), (0.3, 0.52), (0.6, 0.05), (0.05, 0.51)]
)
def test_the_action_on_repeats_is_the_mixtures_critical_fractile_quantile(share: float, seen: float) -> None:
    action, sigma = 0.5, 0.1
    q = float(
        repeat_quantile(
            np.array([action]), np.array([sigma]), np.array([share]), np.array([seen]), np.array([True]), TAU
        )[0]
    )
    # the quantile's definition: F(q-) <= tau <= F(q), tau = 2/3
    assert _mixture_cdf(q, action, sigma, share, seen, left=True) <= 2.0 / 3.0 + 1e-9
    assert _mixture_cdf(q, action, sigma, share, seen) >= 2.0 / 3.0 - 1e-9
    assert (q == seen) == (
        _mixture_cdf(seen, action, sigma, share, seen, left=True)
        < 2.0 / 3.0
        <= _mixture_cdf(seen, action, sigma, share, seen)
    )


def test_without_repeats_or_after_an_unseen_tick_the_action_is_the_gaussians_bit_for_bit() -> None:
    action, sigma, seen = np.array([0.5, 0.2, 0.9]), np.array([0.1, 0.01, 0.3]), np.array([0.45, 0.2, 0.1])
    fresh = np.ones(3, bool)
    np.testing.assert_array_equal(repeat_quantile(action, sigma, np.zeros(3), seen, fresh, TAU), action)
    np.testing.assert_array_equal(repeat_quantile(action, sigma, np.full(3, 0.9), seen, ~fresh, TAU), action)


def test_a_shortage_at_or_above_the_last_seen_demand_counts_as_no_repeat() -> None:
    share, last, y = np.full(3, 0.5), np.full(3, 0.3), np.array([0.3, 0.3, 0.3])
    observed, missed = np.zeros(3, bool), np.array([True, True, False])
    after_seen = np.array([True, False, True])
    new_share, new_last = track_repeats(share, last, y, observed, after_seen, rate=0.25, missed=missed)
    np.testing.assert_allclose(new_share, [0.375, 0.5, 0.5])  # a known miss, one after a streak, nothing known
    np.testing.assert_array_equal(new_last, last)  # a shortage is no demand seen


def test_the_interior_cold_start_share_leaves_out_pairs_at_the_ranges_bounds() -> None:
    history = np.array([[0.0, 0.0, 0.0, 0.3, 0.3], [1.0, 1.0, 0.5, 0.6, 0.7], [0.0, 0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(repeats_in(history), [0.75, 0.25, 1.0])
    np.testing.assert_allclose(repeats_in(history, interior=True), [1.0, 0.0, 0.0])  # 0 and 1 are clipped values
    np.testing.assert_array_equal(
        inside_range(np.array([0.0, 1e-8, 0.5, 1.0 - 1e-8, 1.0])), [False, False, True, False, False]
    )


def test_acting_on_repeats_holds_a_plateau_and_changes_nothing_on_a_series_that_never_repeats(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig
) -> None:
    on = replace(tiny_config, estimator=replace(tiny_config.estimator, act_on_repeat=True))
    off = replace(tiny_config, estimator=replace(tiny_config.estimator, act_on_repeat=False))
    window = tiny_config.predictor.window
    plateau = PicRLController(tiny_predictor, tiny_policy, on).initial_state(
        np.zeros(1, np.uint64), np.full((1, 3 * window), 0.6)
    )
    assert plateau.action[0] == pytest.approx(0.6, abs=1e-7)  # every pair repeated: the order is the plateau
    rng = np.random.default_rng(3)
    history, demand = rng.uniform(0.2, 0.8, (4, 3 * window)), rng.uniform(0.2, 0.8, (12, 4))
    runs = []
    for config in (on, off):
        controller = PicRLController(tiny_predictor, tiny_policy, config)
        state = controller.initial_state(np.arange(4, dtype=np.uint64), history)
        actions = []
        for d in demand:
            state, _ = controller.step(state, np.minimum(d, state.action), d > state.action)
            actions.append(state.action)
        runs.append(np.array(actions))
    np.testing.assert_array_equal(runs[0], runs[1])
