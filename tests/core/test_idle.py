"""The hurdle: a point mass at the range's floor in the next demand's forecast (picrl_core.idle)."""

from __future__ import annotations

from dataclasses import replace
from statistics import NormalDist

import numpy as np
import pytest

from picrl_core.config import PicRLConfig
from picrl_core.controller import PicRLController
from picrl_core.idle import busy_responsibility, hurdle_quantile, idle_share
from picrl_core.policy import PolicyNetwork
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.repeats import repeat_quantile

TAU = 2.0 / 3.0  # the critical fractile of the default costs (c_under 2, c_over 1)
Z_STAR = NormalDist().inv_cdf(TAU)


def test_the_idle_share_is_the_markov_transition_out_of_the_last_ticks_state() -> None:
    observations = np.array(
        [
            [0.0, 0.0, 0.0, 0.3, 0.0, 0.0, 0.0],  # last idle: 5 pairs start idle, 4 stay
            [0.2, 0.3, 0.0, 0.4, 0.5, 0.6, 0.7],  # last busy: 5 pairs start busy, 1 goes idle
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.4],  # last busy, no pair starts busy: no evidence, 0
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # censored at 0 (a shortage at a = 0) is busy
        ],
        dtype=np.float32,
    )
    censored = np.zeros_like(observations, dtype=bool)
    censored[3, [1, 3]] = True
    # row 3: idle, busy, idle, busy, idle, idle, idle: 3 pairs start idle (to busy, busy, idle, idle: 2 of 4)
    np.testing.assert_allclose(idle_share(observations, censored), [0.8, 0.2, 0.0, 0.5])


def _hurdle_cdf(x: float, action: float, sigma: float, share: float, seen: float, idle: float, left: bool) -> float:
    """``F(x)`` (``F(x-)`` with ``left``) of the hurdle mixture: ``pi`` at 0, else the repeat mixture whose Gaussian
    part's 2/3 quantile is ``action`` (its atom at ``seen`` only above the floor)."""
    gaussian = NormalDist(action - Z_STAR * sigma, sigma).cdf(x)
    repeat = share if seen > 0.0 else 0.0
    busy = repeat * (x > seen if left else x >= seen) + (1.0 - repeat) * gaussian
    return idle * (x > 0.0 if left else x >= 0.0) + (1.0 - idle) * busy


@pytest.mark.parametrize(
    ("idle", "share", "seen", "action"),
    [
        (0.8, 0.0, 0.0, 0.3),  # pi >= tau: the floor
        (0.5, 0.0, 0.0, 0.3),  # the Gaussian at (tau - pi) / (1 - pi) = 1/3
        (0.5, 0.9, 0.0, 0.3),  # a last demand at the floor is no repeat atom
        (0.2, 0.6, 0.35, 0.4),  # the repeat's atom at that lower level
        (0.3, 0.1, 0.9, 0.5),  # the repeat far above: below it
        (0.6, 0.0, 0.2, 0.05),  # the continuous quantile below 0: the floor
        (0.1, 0.3, 0.52, 0.5),
    ],
)
def test_the_action_is_the_hurdle_mixtures_critical_fractile_quantile(
    idle: float, share: float, seen: float, action: float
) -> None:
    sigma = 0.1
    q = float(
        hurdle_quantile(
            np.array([action]),
            np.array([sigma]),
            np.array([share]),
            np.array([seen]),
            np.array([True]),
            np.array([idle]),
            TAU,
        )[0]
    )
    assert q >= 0.0
    # the quantile's definition: F(q-) <= tau <= F(q)
    assert _hurdle_cdf(q, action, sigma, share, seen, idle, left=True) <= TAU + 1e-9
    assert _hurdle_cdf(q, action, sigma, share, seen, idle, left=False) >= TAU - 1e-9
    assert (q == 0.0) == (_hurdle_cdf(0.0, action, sigma, share, seen, idle, left=False) >= TAU)


def test_without_idling_the_order_is_the_repeat_mixtures_bit_for_bit() -> None:
    action, sigma = np.array([0.5, 0.2, 0.9, 0.4]), np.array([0.1, 0.01, 0.3, 0.05])
    share, seen = np.array([0.0, 0.6, 0.3, 0.8]), np.array([0.45, 0.2, 0.1, 0.38])
    fresh = np.array([True, True, True, False])
    np.testing.assert_array_equal(
        hurdle_quantile(action, sigma, share, seen, fresh, np.zeros(4), TAU),
        repeat_quantile(action, sigma, share, seen, fresh, TAU),
    )


def test_only_a_tick_seen_at_the_floor_under_a_positive_idle_mass_leaves_the_temperature() -> None:
    y = np.array([0.0, 0.0, 0.0, 0.3])
    observed = np.array([True, True, False, True])
    idle = np.array([0.5, 0.0, 0.5, 0.5])
    np.testing.assert_array_equal(busy_responsibility(y, observed, idle), [0.0, 1.0, 1.0, 1.0])


def _run(controller: PicRLController, history: np.ndarray, demand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    state = controller.initial_state(np.arange(history.shape[0], dtype=np.uint64), history)
    actions, temperatures = [], []
    for d in demand:
        state, _ = controller.step(state, np.minimum(d, state.action), d > state.action)
        actions.append(state.action)
        temperatures.append(state.temperature)
    return np.array(actions), np.array(temperatures)


def test_the_hurdle_acts_at_the_floor_of_an_idle_service_and_changes_nothing_on_one_that_never_idles(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig
) -> None:
    on = replace(tiny_config, estimator=replace(tiny_config.estimator, idle_hurdle=True))
    off = replace(tiny_config, estimator=replace(tiny_config.estimator, idle_hurdle=False))
    window = tiny_config.predictor.window
    rng = np.random.default_rng(5)
    busy_history, busy_demand = rng.uniform(0.2, 0.8, (3, 3 * window)), rng.uniform(0.2, 0.8, (12, 3))
    runs = [_run(PicRLController(tiny_predictor, tiny_policy, c), busy_history, busy_demand) for c in (on, off)]
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    # idle half the time, the history ending busy: from the second idle tick on, every pair of the window that starts
    # idle stayed idle (pi = 1 >= tau) and the order is the floor
    idle_history = np.tile(np.r_[np.zeros(window), rng.uniform(0.3, 0.6, window)], 2)[None, :]
    controller = PicRLController(tiny_predictor, tiny_policy, on)
    actions, temperatures = _run(controller, idle_history, np.zeros((6, 1)))
    assert (actions[1:] == 0.0).all()
    assert (temperatures[2:] == temperatures[1]).all()  # seen at the floor under pi > 0: the temperature holds
    off_actions, _ = _run(PicRLController(tiny_predictor, tiny_policy, off), idle_history, np.zeros((6, 1)))
    assert (off_actions > 0.0).all()


def test_an_order_at_the_floor_leaves_the_margin_where_it_was(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig
) -> None:
    window = tiny_config.predictor.window
    history = np.tile(np.r_[np.full(window // 2, 0.5), np.zeros(window // 2)], 2)[None, :]  # ends idle: pi = 1
    config = replace(tiny_config, estimator=replace(tiny_config.estimator, idle_hurdle=True))
    controller = PicRLController(tiny_predictor, tiny_policy, config)
    state = controller.initial_state(np.zeros(1, np.uint64), history)
    margins = []
    for y, short in ((0.0, False), (0.0, True)):  # idle again, then the busy onset, short at the floor
        assert state.action[0] == 0.0
        margins.append(state.margin[0])
        state, _ = controller.step(state, np.full(1, y), np.full(1, short))
    assert state.margin[0] == margins[0] == margins[1]  # a shortage at an order of the continuous part steps it up
