"""The vectorised PIC-RL controller and the closed-loop simulator (picrl_core.controller, .simulator)."""

from __future__ import annotations

import inspect
from dataclasses import fields, replace

import numpy as np
import pytest
import torch

from picrl_core.calibrator import track_temperature
from picrl_core.censored_estimator import ROWS_PER_THREAD
from picrl_core.config import PicRLConfig
from picrl_core.controller import PicRLController
from picrl_core.controller_state import ControllerState, rescale_state
from picrl_core.costs import asymmetric_cost
from picrl_core.mills import mean_above
from picrl_core.policy import PolicyNetwork, risk_centre
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.reward import surrogate_reward
from picrl_core.simulator import Trajectory, censor, simulate
from picrl_core.synthetic import diurnal

T = 80  # closed-loop ticks per test run


def _segment(series: np.ndarray, window: int, start: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Single-service ``(demand (T, 1), history (1, W))`` from the held-out end of the fixture series."""
    return series[start : start + T, None], series[None, start - window : start]


def _many(window: int, services: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """``services`` different diurnal series: demand ``(T, N)`` and history ``(N, W)``."""
    cols = [
        diurnal(window + T, period=48, base=0.35 + 0.05 * i, amplitude=0.2, noise=0.04, seed=100 + i)
        for i in range(services)
    ]
    stacked = np.stack(cols, axis=1)
    return stacked[window:], stacked[:window].T.copy()


def _run(
    predictor: GaussianLSTM,
    policy: PolicyNetwork,
    config: PicRLConfig,
    demand: np.ndarray,
    history: np.ndarray,
    *,
    explore: bool = True,
    seed: int | None = None,
    keys: np.ndarray | None = None,
) -> Trajectory:
    controller = PicRLController(predictor, policy, config, explore=explore, seed=seed)
    return simulate(controller, demand, history, keys=keys)


def test_action_formula_and_parameter_ranges(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig, diurnal_series: np.ndarray
) -> None:
    traj = _run(tiny_predictor, tiny_policy, tiny_config, *_segment(diurnal_series, tiny_config.predictor.window))
    expected = np.clip(traj.mu + traj.k * traj.sigma + traj.margin + traj.bias + traj.escape, 0.0, 1.0)
    np.testing.assert_allclose(traj.action, expected, rtol=0, atol=1e-12)
    assert np.all((traj.eta >= 0.5) & (traj.eta <= 3.0))
    centre = risk_centre(tiny_config)
    assert centre == pytest.approx(0.4307, abs=1e-4)  # Phi^-1(2/3): the newsvendor fractile at 2:1 prices
    assert np.all((traj.k >= centre - 1.0) & (traj.k <= centre + 1.0))
    assert np.all(traj.sigma > 0)
    assert traj.censored.any() and (~traj.censored).any()  # both feedback kinds were exercised
    observed, censored = censor(traj.demand, traj.action)
    np.testing.assert_array_equal(traj.observed, observed)
    np.testing.assert_array_equal(traj.censored, censored)


@pytest.mark.parametrize("bias, eta, k", [(60.0, 3.0, 1.0), (-60.0, 0.5, -1.0)])
def test_saturated_policy_hits_the_range_ends(
    tiny_predictor: GaussianLSTM,
    tiny_policy: PolicyNetwork,
    tiny_config: PicRLConfig,
    diurnal_series: np.ndarray,
    bias: float,
    eta: float,
    k: float,
) -> None:
    with torch.no_grad():
        tiny_policy.body[-1].bias.fill_(bias)
    traj = _run(tiny_predictor, tiny_policy, tiny_config, *_segment(diurnal_series, tiny_config.predictor.window))
    np.testing.assert_allclose(traj.eta, eta, rtol=0, atol=1e-12)
    np.testing.assert_allclose(traj.k, risk_centre(tiny_config) + k, rtol=0, atol=1e-12)


def test_actions_are_clipped_to_the_unit_interval(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig
) -> None:
    # Eq. 11's sum, without the idle hurdle (which orders the floor of an idle service itself, the margin held)
    config = replace(tiny_config, estimator=replace(tiny_config.estimator, idle_hurdle=False))
    controller = PicRLController(tiny_predictor, tiny_policy, config, explore=False)
    low = controller.initial_state(np.array([0, 1], np.uint64), np.zeros((2, 8)))
    high = low.take(slice(None))
    for _ in range(200):  # always over-provisioned against zero demand: margin and bias go negative
        low, _ = controller.step(low, np.zeros(2), np.zeros(2, bool))
    raw = low.mu + low.k * low.sigma + low.margin + low.bias
    assert np.all(raw < 0) and np.all(low.action == 0.0)
    for _ in range(200):  # always short: y = a, margin and bias go up to their limits
        high, _ = controller.step(high, high.action, np.ones(2, bool))
    raw = high.mu + high.k * high.sigma + high.margin + high.bias
    assert np.all(raw > 1) and np.all(high.action == 1.0)


def test_controller_cannot_see_demand(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig, diurnal_series: np.ndarray
) -> None:
    assert set(inspect.signature(PicRLController.step).parameters) == {
        "self",
        "state",
        "y",
        "censored",
        "context",
        "missing",
    }  # which y went unobserved: no demand
    demand, history = _segment(diurnal_series, tiny_config.predictor.window)
    first = _run(tiny_predictor, tiny_policy, tiny_config, demand, history)
    assert first.censored.sum() >= 5
    # larger demand exactly where the first run was short: the feedback (y, c) is the same
    hidden = np.where(first.censored, first.demand + 0.3 + first.demand * 2.0, first.demand)
    second = _run(tiny_predictor, tiny_policy, tiny_config, hidden, history)
    np.testing.assert_array_equal(second.censored, first.censored)
    np.testing.assert_array_equal(second.observed, first.observed)
    np.testing.assert_array_equal(second.action, first.action)
    np.testing.assert_array_equal(second.reward, first.reward)


def test_same_seed_same_actions_and_seeds_change_exploration(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig, diurnal_series: np.ndarray
) -> None:
    segment = _segment(diurnal_series, tiny_config.predictor.window)
    a = _run(tiny_predictor, tiny_policy, tiny_config, *segment, seed=3)
    b = _run(tiny_predictor, tiny_policy, tiny_config, *segment, seed=3)
    np.testing.assert_array_equal(a.action, b.action)
    other = _run(tiny_predictor, tiny_policy, tiny_config, *segment, seed=4)
    assert not np.allclose(other.k, a.k)
    assert np.mean(np.abs(other.action - a.action)) > 1e-3
    greedy = [_run(tiny_predictor, tiny_policy, tiny_config, *segment, seed=s, explore=False) for s in (3, 4)]
    np.testing.assert_array_equal(greedy[0].action, greedy[1].action)  # no noise: the seed is irrelevant


@pytest.mark.parametrize("explore", [True, False])
def test_batch_equals_single_service_runs(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig, explore: bool
) -> None:
    demand, history = _many(tiny_config.predictor.window)
    batch = _run(
        tiny_predictor, tiny_policy, tiny_config, demand, history, explore=explore, keys=np.arange(5, dtype=np.uint64)
    )
    for i in range(5):
        single = _run(
            tiny_predictor,
            tiny_policy,
            tiny_config,
            demand[:, i : i + 1],
            history[i : i + 1],
            explore=explore,
            keys=np.array([i], dtype=np.uint64),
        )
        for f in fields(Trajectory):
            np.testing.assert_allclose(
                getattr(single, f.name),
                getattr(batch.column(i), f.name),
                rtol=0,
                atol=1e-6,
                err_msg=f"{f.name} of service {i}",
            )
    assert not np.allclose(batch.action[:, 0], batch.action[:, 1])  # the services really differ


def test_ablation_without_k_sigma_drops_the_buffer(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig, diurnal_series: np.ndarray
) -> None:
    config = replace(tiny_config, ablation=replace(tiny_config.ablation, use_k_sigma=False))
    traj = _run(tiny_predictor, tiny_policy, config, *_segment(diurnal_series, config.predictor.window))
    np.testing.assert_allclose(
        traj.action, np.clip(traj.mu + traj.margin + traj.bias + traj.escape, 0.0, 1.0), rtol=0, atol=1e-12
    )
    assert np.mean(np.abs(traj.k * traj.sigma) > 1e-4) > 0.9  # the buffer it dropped was not zero anyway


def test_ablation_without_uncertainty_pins_sigma(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig, diurnal_series: np.ndarray
) -> None:
    config = replace(tiny_config, ablation=replace(tiny_config.ablation, use_uncertainty=False))
    traj = _run(tiny_predictor, tiny_policy, config, *_segment(diurnal_series, config.predictor.window))
    constant = float(tiny_predictor.head.residual_rms)  # the validation residuals' RMS, set in training
    assert constant > 10 * config.predictor.sigma_min
    np.testing.assert_array_equal(traj.sigma, np.full_like(traj.sigma, constant))
    full = _run(tiny_predictor, tiny_policy, tiny_config, *_segment(diurnal_series, config.predictor.window))
    assert np.all(full.sigma > 10 * config.predictor.sigma_min) and np.ptp(full.sigma) > 0


def test_transition_rewards_are_surrogate_when_censored_and_cost_otherwise(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig, diurnal_series: np.ndarray
) -> None:
    traj = _run(tiny_predictor, tiny_policy, tiny_config, *_segment(diurnal_series, tiny_config.predictor.window))
    c = traj.censored[:, 0]
    assert c.sum() >= 5 and np.any(c[1:] & c[:-1])  # includes censoring streaks longer than one
    streak = np.zeros(T, np.int64)
    for t in range(T):
        streak[t] = (streak[t - 1] + 1 if t else 1) if c[t] else 0
    a, mu, sigma = traj.action[:, 0], traj.mu[:, 0], traj.sigma[:, 0]
    expected = -asymmetric_cost(a, traj.demand[:, 0], tiny_config.cost)
    expected[c] = surrogate_reward(a[c], mu[c], sigma[c], streak[c], tiny_config.cost, tiny_config.reward)
    np.testing.assert_allclose(traj.reward[:, 0], expected, rtol=1e-12, atol=1e-15)


def test_imputed_window_holds_each_shortage_at_its_tobit_expectation_and_uncensored(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig, diurnal_series: np.ndarray
) -> None:
    config = replace(tiny_config, estimator=replace(tiny_config.estimator, impute_window=True))
    demand, history = _segment(diurnal_series, config.predictor.window)
    controller = PicRLController(tiny_predictor, tiny_policy, config)
    state = controller.initial_state(np.zeros(1, np.uint64), history)
    shortages = 0
    for t in range(T):
        y, c = censor(demand[t], state.action)
        new, transition = controller.step(state, y, c)
        expected = (mean_above(state.mu, state.sigma, state.action) if c[0] else y).astype(np.float32)
        assert new.observations[0, -1] == expected[0] and not new.censored[0, -1]  # the E-step, uncensored
        assert transition.censored[0] == c[0]  # the reward and replay still read the censoring flag
        if c[0]:
            assert new.observations[0, -1] > state.action[0]  # above the bound it showed
            shortages += 1
        state = new
    assert shortages >= 5


def test_a_temperature_that_skips_repeats_holds_on_a_repeated_demand_and_steps_elsewhere(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig
) -> None:
    """``calibrator.scale_skips_repeats``: a seen demand equal to the last one seen (the repeat mixture's atom) leaves
    the temperature as it was; a seen demand that moved takes the default's step; a shortage the repeat cannot
    explain (the last demand seen lies below the action) takes it too."""
    _, history = _many(tiny_config.predictor.window)
    keys = np.arange(5, dtype=np.uint64)
    cal = replace(tiny_config.calibrator, online_scale=True, scale_rate=0.25)
    on, off = (
        PicRLController(
            tiny_predictor,
            tiny_policy,
            replace(tiny_config, calibrator=replace(cal, scale_skips_repeats=skips)),
            explore=False,
        )
        for skips in (True, False)
    )
    state = on.initial_state(keys, history)
    assert np.array_equal(state.temperature, off.initial_state(keys, history).temperature)
    y = state.last_seen + np.array([0.0, 0.0, 0.05, -0.05, 0.0])  # rows 0 and 1 repeat the last demand seen
    censored = np.zeros(5, bool)
    censored[4] = True  # row 4: short at its action, which is above the last demand seen (no repeat possible)
    y[4] = state.action[4]
    assert state.action[4] > state.last_seen[4] and np.all(state.censor_streak == 0)
    skipped = on.step(state, y, censored)[0].temperature
    stepped = off.step(state, y, censored)[0].temperature
    expected = track_temperature(state.temperature, y, state.mu, state.sigma, censored, cal)
    np.testing.assert_array_equal(stepped, expected)
    np.testing.assert_array_equal(skipped[:2], state.temperature[:2])
    np.testing.assert_array_equal(skipped[2:], expected[2:])
    assert not np.allclose(expected[:2], state.temperature[:2])  # the default's step does move on a repeat


def test_a_new_service_starts_at_the_validation_levels_or_at_the_papers_zero(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig
) -> None:
    _, history = _many(tiny_config.predictor.window)
    keys = np.arange(5, dtype=np.uint64)
    levels = replace(
        tiny_config.calibrator, online_scale=True, start_from_validation=True, initial_margin=-0.6, initial_scale=0.8
    )
    warm = PicRLController(tiny_predictor, tiny_policy, replace(tiny_config, calibrator=levels)).initial_state(
        keys, history
    )
    cold = PicRLController(
        tiny_predictor, tiny_policy, replace(tiny_config, calibrator=replace(levels, start_from_validation=False))
    ).initial_state(keys, history)
    np.testing.assert_array_equal(cold.margin, 0.0)
    np.testing.assert_array_equal(cold.temperature, 1.0)
    np.testing.assert_array_equal(warm.temperature, 0.8)
    np.testing.assert_allclose(warm.sigma, 0.8 * cold.sigma, rtol=1e-12)  # the forecast's std at its temperature
    np.testing.assert_allclose(warm.margin, -0.6 * warm.sigma, rtol=1e-12)  # the margin in units of that std
    np.testing.assert_allclose(warm.action, (warm.mu + warm.k * warm.sigma + warm.margin).clip(0, 1), rtol=1e-12)


@pytest.mark.parametrize("release", ["halve", "hold", "handover"])
def test_a_seen_demand_releases_the_escape_at_the_new_forecast(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig, release: str
) -> None:
    """A jump far above a flat history starts a censoring streak, the escape searches, and on the first tick whose
    demand is seen the controller releases it by ``calibrator.escape_release`` at the forecast it then makes."""
    config = replace(tiny_config, calibrator=replace(tiny_config.calibrator, escape=True, escape_release=release))
    window = config.predictor.window
    history = np.full((1, window), 0.3)
    demand = np.r_[np.full(5, 0.3), np.full(40, 0.8)]
    controller = PicRLController(tiny_predictor, tiny_policy, config)
    state = controller.initial_state(np.zeros(1, np.uint64), history)
    released = 0
    for d in demand:
        y, c = censor(np.array([d]), state.action)
        new, _ = controller.step(state, y, c)
        if not c[0] and state.escape[0] > 0 and y[0] < state.action[0]:
            halved = 0.5 * state.escape[0]
            above = min(state.escape[0], y[0] - new.mu[0])
            expected = {"halve": halved, "hold": max(halved, above), "handover": max(above, 0.0)}[release]
            assert new.escape[0] == pytest.approx(expected, abs=1e-15)
            released += 1
        state = new
    assert released >= 1


def _states_equal(a: ControllerState, b: ControllerState) -> None:
    for f in fields(ControllerState):
        np.testing.assert_array_equal(getattr(a, f.name), getattr(b, f.name), err_msg=f.name)
        assert getattr(a, f.name).dtype == getattr(b, f.name).dtype, f.name


def test_state_take_and_concat_round_trip(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig
) -> None:
    demand, history = _many(tiny_config.predictor.window)
    controller = PicRLController(tiny_predictor, tiny_policy, tiny_config)
    state = controller.initial_state(np.arange(5, dtype=np.uint64), history)
    for t in range(3):
        state, _ = controller.step(state, *censor(demand[t], state.action))
    assert len(state) == 5
    _states_equal(ControllerState.concat([state.take(slice(0, 2)), state.take(slice(2, 5))]), state)
    order = np.array([3, 0, 4, 1, 2])
    _states_equal(ControllerState.concat([state.take(order[:2]), state.take(order[2:])]), state.take(order))
    part = state.take(np.array([1]))
    part.margin[0] = 123.0
    part.observations[0, 0] = -1.0
    assert state.margin[1] != 123.0 and state.observations[1, 0] != -1.0  # take copies
    # stepping a sub-batch gives the same decisions as stepping the whole batch
    y, c = censor(demand[3], state.action)
    whole, _ = controller.step(state, y, c)
    alone, _ = controller.step(state.take(order[:2]), y[order[:2]], c[order[:2]])
    np.testing.assert_allclose(alone.action, whole.action[order[:2]], rtol=0, atol=1e-6)


def test_bad_shapes_raise_value_error(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig
) -> None:
    controller = PicRLController(tiny_predictor, tiny_policy, tiny_config)
    keys = np.arange(2, dtype=np.uint64)
    with pytest.raises(ValueError, match="history must have shape"):
        controller.initial_state(keys, np.zeros(8))
    with pytest.raises(ValueError, match="history must have shape"):
        controller.initial_state(keys, np.zeros((2, 0)))
    with pytest.raises(ValueError, match="context"):  # this predictor has no context channels
        controller.initial_state(keys, np.zeros((2, 8)), np.zeros((2, 8, 1)))
    state = controller.initial_state(keys, np.full((2, 3), 0.4))  # short history is padded
    assert state.observations.shape == (2, 8)
    with pytest.raises(ValueError, match="context"):
        controller.step(state, np.zeros(2), np.zeros(2, bool), context=np.zeros((2, 1)))
    with pytest.raises(ValueError, match="demand must have shape"):
        simulate(controller, np.zeros(10), np.zeros((1, 8)))

    with_context = replace(tiny_config, predictor=replace(tiny_config.predictor, context_channels=2))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        ctx_controller = PicRLController(GaussianLSTM(with_context.predictor), tiny_policy, with_context)
    with pytest.raises(ValueError, match="history_context is required"):
        ctx_controller.initial_state(keys, np.zeros((2, 8)))
    with pytest.raises(ValueError, match=r"history_context must have shape \(2, 8, 2\)"):
        ctx_controller.initial_state(keys, np.zeros((2, 8)), np.zeros((2, 8, 3)))
    state = ctx_controller.initial_state(keys, np.zeros((2, 8)), np.zeros((2, 8, 2)))
    with pytest.raises(ValueError, match="context is required"):
        ctx_controller.step(state, np.zeros(2), np.zeros(2, bool))
    with pytest.raises(ValueError, match=r"context must have shape \(2, 1, 2\)"):
        ctx_controller.step(state, np.zeros(2), np.zeros(2, bool), context=np.zeros((2, 3)))
    stepped, _ = ctx_controller.step(state, np.zeros(2), np.zeros(2, bool), context=np.ones((2, 2)))
    np.testing.assert_array_equal(stepped.context[:, -1], np.ones((2, 2)))


def test_estimator_threads_give_the_same_states_bit_for_bit(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig
) -> None:
    """``online.estimator_threads`` splits the estimator over threads and runs it beside the predictor: the same
    states as one thread (enough services for both to happen)."""
    rng = np.random.default_rng(5)
    n = 2 * ROWS_PER_THREAD + 7
    history, demand = rng.uniform(0.2, 0.8, (n, 40)), rng.uniform(0.0, 1.0, (6, n))
    # windows that keep their shortages censored (no E-step), so the estimator has censored windows to solve
    single = replace(tiny_config, estimator=replace(tiny_config.estimator, impute_window=False))
    threaded = replace(single, online=replace(single.online, estimator_threads=2))
    runs = []
    for config in (single, threaded):
        controller = PicRLController(tiny_predictor, tiny_policy, config, explore=False)
        state = controller.initial_state(np.arange(n, dtype=np.uint64), history)
        for t in range(demand.shape[0]):
            state, _ = controller.step(state, *censor(demand[t], state.action))
        runs.append(state)
    assert runs[0].censored.any(axis=1).mean() > 0.5  # the estimator had censored windows to solve
    _states_equal(*runs)


@pytest.mark.parametrize("chunk", [128, 8, 1])
def test_decisions_do_not_depend_on_batch_composition(tiny_config: PicRLConfig, chunk: int) -> None:
    """A stream worker steps a service in whatever batch it arrives in; its decision must be the
    simulator's to the bit (networks run in fixed-size chunks, see picrl_core.batching), for any
    fixed chunk size (OnlineConfig.inference_chunk)."""
    torch.manual_seed(0)
    config = replace(tiny_config, online=replace(tiny_config.online, inference_chunk=chunk))
    controller = PicRLController(GaussianLSTM(config.predictor), PolicyNetwork(config.policy), config)
    assert controller.chunk == chunk
    rng = np.random.default_rng(3)
    n = 37
    history = rng.uniform(0.2, 0.8, (n, 40))
    keys = np.arange(n, dtype=np.uint64)
    together = controller.initial_state(keys, history)
    alone = [controller.initial_state(keys[i : i + 1], history[i : i + 1]) for i in range(n)]
    for _ in range(12):
        demand = rng.uniform(0.0, 1.0, n)
        y, censored = np.minimum(demand, together.action), demand > together.action
        together, _ = controller.step(together, y, censored)
        alone = [controller.step(s, y[i : i + 1], censored[i : i + 1])[0] for i, s in enumerate(alone)]
        joined = ControllerState.concat(alone)
        for name in ("action", "mu", "sigma", "eta", "k", "log_prob"):
            assert np.array_equal(getattr(joined, name), getattr(together, name)), name


def test_inference_chunk_must_be_positive(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig
) -> None:
    with pytest.raises(ValueError, match="inference chunk"):
        PicRLController(tiny_predictor, tiny_policy, tiny_config, chunk=0)


def test_a_moved_range_reads_the_predictors_memory_again_from_the_rescaled_window(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig
) -> None:
    """The incremental predictor's (h, c) read the old units; on a moved range the controller starts them again from
    the rescaled window, and leaves every other field as rescale_state carries it and an unmoved service alone."""
    controller = PicRLController(tiny_predictor, tiny_policy, tiny_config, explore=False)
    demand, history = _many(tiny_config.predictor.window, services=3)
    state = controller.initial_state(np.arange(3, dtype=np.uint64), history)
    for t in range(10):
        state, _ = controller.step(state, *censor(demand[t], state.action))
    low, high, new_high = np.zeros(3), np.ones(3), np.array([1.0, 2.0, 1.0])
    moved = controller.rescale(state, low, high, low, new_high)
    carried = rescale_state(state, low, high, low, new_high)
    for field in fields(ControllerState):
        if field.name != "memory":
            np.testing.assert_array_equal(getattr(moved, field.name), getattr(carried, field.name))
    np.testing.assert_array_equal(moved.memory[[0, 2]], state.memory[[0, 2]])
    cold = controller.forecaster.start(moved.observations[1:2], moved.censored[1:2], moved.context[1:2])[2]
    np.testing.assert_array_equal(moved.memory[1], cold[0])
    assert not np.array_equal(moved.memory[1], state.memory[1])
    np.testing.assert_array_equal(controller.rescale(state, low, high, low, high).memory, state.memory)  # none moved
