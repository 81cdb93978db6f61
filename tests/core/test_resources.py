"""Multi-resource coupled censoring (picrl_core.resources): the observation rule against a direct
per-entry reference, what the calibrator and conformal read from a lower bound below the capacity, the
coupled loop and its metrics."""

from __future__ import annotations

import numpy as np
import pytest

from picrl_core.calibrator import feedback
from picrl_core.config import CostConfig, PicRLConfig
from picrl_core.methods import REGISTRY
from picrl_core.methods.base import Provisioner
from picrl_core.methods.coupled import resource_metrics, run_coupled_loop
from picrl_core.methods.evaluation import run_on_test_split
from picrl_core.policy import PolicyNetwork
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.resources import GPU_POD, Resource, impute_served_share, killing, observe
from picrl_core.series import prepare_resource_fleet
from picrl_core.synthetic import diurnal


def reference(demand: np.ndarray, action: np.ndarray, resources: tuple[Resource, ...]):
    """The rule written out for one service at a time, in plain Python."""
    y, coupled, own = np.zeros_like(demand), np.zeros(demand.shape, bool), np.zeros(demand.shape, bool)
    for j in range(demand.shape[1]):
        served = 1.0
        for i, res in enumerate(resources):
            if res.hard and demand[i, j] > action[i, j]:
                served = min(served, 0.0 if res.kills else action[i, j] / demand[i, j])
        failed = served < 1.0
        for i, res in enumerate(resources):
            load = demand[i, j] if res.hard else served * demand[i, j]
            y[i, j] = min(load, action[i, j])
            own[i, j] = load > action[i, j]
            coupled[i, j] = demand[i, j] > action[i, j] or failed
    return y, coupled, own


def test_the_rule_matches_a_direct_reference_on_random_fleets() -> None:
    rng = np.random.default_rng(0)
    three = (*GPU_POD, Resource("host_mem", hard=True, weight=1.5))
    one_kills = (*GPU_POD, Resource("host_mem", hard=True, weight=1.5, kills=True))  # memory fails requests, host kills
    for resources in (GPU_POD, three, killing(GPU_POD), killing(three), one_kills):
        demand = rng.uniform(0.0, 1.0, (len(resources), 500))
        action = rng.uniform(0.0, 1.0, (len(resources), 500))
        action[:, :20] = demand[:, :20]  # exactly met: no shortage
        y, coupled, own, short = observe(demand, action, resources)
        expected = reference(demand, action, resources)
        np.testing.assert_allclose(y, expected[0], rtol=0, atol=1e-15)
        np.testing.assert_array_equal(coupled, expected[1])
        np.testing.assert_array_equal(own, expected[2])
        np.testing.assert_array_equal(short, demand > action)


def test_a_memory_shortage_hides_compute_demand_and_only_the_coupled_flag_says_so() -> None:
    demand = np.array([[1.0, 0.5], [0.8, 0.8]])  # gpu_mem, gpu_compute for two services
    action = np.array([[0.5, 0.6], [0.6, 0.6]])
    y, coupled, own, short = observe(demand, action, GPU_POD)
    # service 0: half its requests fail on memory, so compute serves 0.4 of its 0.8 (below its 0.6)
    np.testing.assert_allclose(y[:, 0], [0.5, 0.4])
    assert coupled[:, 0].all() and own[:, 0].tolist() == [True, False] and short[:, 0].all()
    # service 1: memory fits, compute throttles on its own
    np.testing.assert_allclose(y[:, 1], [0.5, 0.6])
    assert coupled[:, 1].tolist() == own[:, 1].tolist() == short[:, 1].tolist() == [False, True]


def test_a_memory_shortage_that_kills_the_pod_leaves_compute_unobserved_and_nothing_to_lift() -> None:
    demand = np.array([[1.0, 0.5], [0.8, 0.8]])
    action = np.array([[0.5, 0.6], [0.6, 0.6]])
    y, coupled, own, short = observe(demand, action, killing(GPU_POD))
    np.testing.assert_allclose(y[:, 0], [0.5, 0.0])  # killed: none of its compute load was served
    assert coupled[:, 0].all() and own[:, 0].tolist() == [True, False]  # a per-resource monitor reads compute 0 as idle
    np.testing.assert_allclose(y[:, 1], [0.5, 0.6])  # memory fits: as without kills
    imputed, flags = impute_served_share(
        y, coupled, action, np.full((2, 2), 0.5), np.full((2, 2), 0.1), killing(GPU_POD)
    )
    np.testing.assert_array_equal(imputed, y)  # a killed tick served no share to lift by: a lower bound it stays
    np.testing.assert_array_equal(flags, coupled)
    with pytest.raises(ValueError, match="only a hard resource"):
        Resource("gpu_compute", hard=False, weight=1.0, kills=True)


def test_a_lower_bound_below_the_capacity_is_neither_short_nor_over() -> None:
    short, over = feedback(
        np.array([0.4, 0.6, 0.5, 0.3]), np.array([0.6, 0.6, 0.6, 0.6]), np.array([True, True, False, False])
    )
    assert short.tolist() == [False, True, False, False]
    assert over.tolist() == [False, False, True, True]


def test_bad_resource_lists_and_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="distinct"):
        observe(np.zeros((2, 1)), np.zeros((2, 1)), (GPU_POD[0], GPU_POD[0]))
    with pytest.raises(ValueError, match="shape"):
        observe(np.zeros((3, 1)), np.zeros((3, 1)), GPU_POD)
    with pytest.raises(ValueError, match="positive weight"):
        Resource("gpu_mem", hard=True, weight=0.0)


class Fixed(Provisioner):
    """Always the same actions; records what it was told."""

    def __init__(self, action: np.ndarray) -> None:
        self.action, self.seen = action, []

    def start(self, history: np.ndarray, history_context: np.ndarray | None) -> np.ndarray:
        return self.action

    def act(self, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        self.seen.append((y.copy(), censored.copy()))
        return self.action


def test_the_coupled_loop_feeds_the_chosen_flags_and_scores_each_resource() -> None:
    demand = np.tile([1.0, 0.5, 0.8, 0.8], (3, 1))  # (T, R * N): gpu_mem of 2 services, then gpu_compute
    action = np.array([0.5, 0.6, 0.6, 0.6])
    for coupled in (True, False):
        provisioner = Fixed(action)
        loop = run_coupled_loop(provisioner, demand, np.zeros((4, 2)), GPU_POD, coupled=coupled)
        y, flags = provisioner.seen[0]
        np.testing.assert_allclose(y, [0.5, 0.5, 0.4, 0.6])
        assert flags.tolist() == ([True, False, True, True] if coupled else [True, False, False, True])
        np.testing.assert_array_equal(loop.censored[0], demand[0] > action)
    cost = CostConfig()
    metrics, extra = resource_metrics(loop.actions, demand, GPU_POD, cost)
    mem = 3 * (2.0 * 0.5 + 1.0 * 0.1) / 2  # per service: service 0 short 0.5, service 1 over 0.1, each tick
    compute = 3 * (2.0 * 0.2 + 2.0 * 0.2) / 2
    assert extra["regret_gpu_mem"] == pytest.approx(mem) and extra["regret_gpu_compute"] == pytest.approx(compute)
    assert metrics.regret == pytest.approx(2.0 * mem + 1.0 * compute)
    assert extra["soft_short_with_hard_short"] == 1.0 and extra["soft_short_otherwise"] == 1.0


def test_a_resource_fleet_is_scaled_per_resource_and_run_in_the_coupled_loop(tiny_config: PicRLConfig) -> None:
    memory = np.column_stack([diurnal(400, seed=s) * 1e10 for s in range(3)])
    duty = np.column_stack([diurnal(400, seed=10 + s) * 100.0 for s in range(3)])
    fleet = prepare_resource_fleet([memory, duty], GPU_POD, "tiny")
    assert fleet.services == 6 and fleet.resources == GPU_POD
    rows = fleet.by_service("train")
    assert rows[:3].max() == pytest.approx(1.0) and rows[3:].max() == pytest.approx(1.0)  # each on its own range
    run = run_on_test_split(REGISTRY["naive"], fleet, tiny_config, 60.0)
    assert run.actions.shape == (80, 6)
    per_resource = [run.extra[f"regret_{r.name}"] for r in GPU_POD]
    assert run.metrics.regret == pytest.approx(2.0 * per_resource[0] + per_resource[1])
    with pytest.raises(ValueError, match="value matrices"):
        prepare_resource_fleet([memory, duty[:, :2]], GPU_POD, "bad")


def test_the_joint_learner_recovers_the_soft_demand_behind_a_hard_shortage() -> None:
    """Service 0: memory short (its forecast sure of the demand), compute served on 80% of the load;
    service 1: the same, but compute short itself once the load is lifted back; service 2: no memory
    shortage; service 3: compute at its own capacity behind a memory shortage; service 4: an idle
    compute at a capacity of 0 behind a memory shortage (the coupled flag marks it, but it is not short)."""
    demand = np.array([[0.5, 0.5, 0.3, 0.5, 0.5], [0.4, 0.4, 0.4, 0.9, 0.0]])
    action = np.array([[0.4, 0.4, 0.4, 0.4, 0.4], [0.5, 0.35, 0.3, 0.5, 0.0]])
    y, coupled, _, _ = observe(demand, action, GPU_POD)
    assert coupled[1, 4]
    mu, sigma = np.array([[0.5] * 5, [0.4] * 5]), np.full((2, 5), 1e-4)
    imputed, flags = impute_served_share(y, coupled, action, mu, sigma, GPU_POD)
    np.testing.assert_array_equal(imputed[0], y[0])
    np.testing.assert_array_equal(flags[0], coupled[0])  # the hard rows are as observed
    assert imputed[1, 0] == pytest.approx(0.4, rel=1e-3) and not flags[1, 0]  # the demand behind the failed 20%
    assert imputed[1, 1] == 0.35 and flags[1, 1]  # lifted past its capacity: short itself
    assert imputed[1, 2] == y[1, 2] == 0.3 and flags[1, 2]  # its own shortage, no memory shortage: untouched
    assert imputed[1, 3] == 0.5 and flags[1, 3]  # at its capacity: censored there
    assert imputed[1, 4] == 0.0 and not flags[1, 4]  # nothing to lift: an observed 0, not a shortage


def test_the_imputed_share_follows_the_tobit_expectation_of_the_hard_demand() -> None:
    """A vague forecast expects the memory demand further above the capacity, so it lifts more."""
    action = np.array([[0.4], [0.9]])
    y, flags = np.array([[0.4], [0.3]]), np.array([[True], [True]])
    lifted = [
        impute_served_share(y, flags, action, np.array([[0.4], [0.3]]), np.array([[s], [0.1]]), GPU_POD)[0][1, 0]
        for s in (0.01, 0.1)
    ]
    expected = 0.4 + 0.1 * np.sqrt(2 / np.pi)  # E[d | d > mu] = mu + sigma lambda(0)
    assert lifted[1] == pytest.approx(0.3 * expected / 0.4) and lifted[0] < lifted[1]


@pytest.mark.parametrize("compute_capacity", [0.6, 0.0])
def test_a_killed_ticks_compute_is_kept_as_the_forecast_and_teaches_nothing_else(
    tiny_predictor: GaussianLSTM, tiny_policy: PolicyNetwork, tiny_config: PicRLConfig, compute_capacity: float
) -> None:
    """``unobserved`` marks the soft rows of ticks a killing hard shortage took down; the controller's window keeps
    its pending forecast there (uncensored), its calibrator, streaks and temperature hold (even at a capacity of
    0, where the observed 0 reaches the capacity), and its reward is the forecast's expected cost."""
    from picrl_core.controller import PicRLController
    from picrl_core.repeats import mean_above_or_repeat
    from picrl_core.resources import unobserved
    from picrl_core.reward import expected_cost

    demand = np.array([[0.9, 0.3], [0.5, 0.5]])  # pod 0's memory short (killed), pod 1's fine
    action = np.array([[0.6, 0.6], [compute_capacity, 0.6]])
    y, coupled, _, _ = observe(demand, action, killing(GPU_POD))
    missing = unobserved(y, coupled, action, killing(GPU_POD))
    assert missing.tolist() == [[False, False], [True, False]]
    assert not unobserved(y, coupled, action, GPU_POD).any()  # failed requests leave compute observed
    controller = PicRLController(tiny_predictor, tiny_policy, tiny_config)
    window = tiny_config.predictor.window
    state = controller.initial_state(np.arange(4, dtype=np.uint64), np.full((4, window), 0.5))
    state.action = action.ravel().copy()
    state.censor_streak = np.array([0, 0, 2, 0])
    kept, transition = controller.step(state, y.ravel(), coupled.ravel(), None, missing.ravel())
    plain, _ = controller.step(state, y.ravel(), coupled.ravel())
    assert kept.observations[2, -1] == np.float32(state.mu[2]) and not kept.censored[2, -1]
    if compute_capacity:  # below the capacity the coupled flag's bound, as observed
        assert plain.observations[2, -1] == 0.0 and plain.censored[2, -1]
    else:  # at a capacity of 0 the unseen 0 reads as a shortage, and the window would take its E-step above it
        expected = mean_above_or_repeat(
            state.mu[2:3], state.sigma[2:3], np.zeros(1), state.repeat_share[2:3], state.last_seen[2:3]
        )
        assert plain.observations[2, -1] == np.float32(expected[0])
        assert not plain.censored[2, -1]
    assert (
        kept.margin[2],
        kept.bias[2],
        kept.censor_streak[2],
        kept.temperature[2],
        kept.repeat_share[2],
        kept.last_seen[2],
    ) == (state.margin[2], state.bias[2], 2, state.temperature[2], state.repeat_share[2], state.last_seen[2])
    assert transition.reward[2] == -expected_cost(compute_capacity, state.mu[2], state.sigma[2], tiny_config.cost)
    others = [0, 1, 3]
    assert np.array_equal(kept.observations[others], plain.observations[others])
    for name in ("margin", "bias", "censor_streak", "temperature", "repeat_share", "last_seen"):
        assert np.array_equal(getattr(kept, name)[others], getattr(plain, name)[others]), name
