"""The operator / statistical rows of Tables 2-3 (picrl_core.methods.operators) under the PIC loop.

Every method: fits without reading the test split (except the hindsight references), acts in [0, 1], is
deterministic under the seed, and reacts only to the censored feedback. Then one behavioural check per
family that fails if the mechanism is wrong.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from picrl_core.config import PicRLConfig
from picrl_core.controller import PicRLController
from picrl_core.costs import asymmetric_cost, episode_metrics
from picrl_core.methods.autopilot import AutopilotProvisioner
from picrl_core.methods.base import Method, Provisioner, run_pic_loop
from picrl_core.methods.censored_sgd import CensoredSGDProvisioner
from picrl_core.methods.conformal import fit_conformal
from picrl_core.methods.naive import fit_naive
from picrl_core.methods.newsvendor import GaussianNewsvendor, KaplanMeierNewsvendor, fit_tobit
from picrl_core.methods.operators import METHODS
from picrl_core.methods.oracle import HindsightProvisioner, fit_oracle_mu, hindsight_buffer
from picrl_core.methods.selection import CANDIDATES, select_on_validation
from picrl_core.methods.spo import spo_plus_loss
from picrl_core.methods.thompson import GaussianThompson, fit_thompson
from picrl_core.methods.vpa import VPAProvisioner
from picrl_core.pipeline import config_for, evaluation_inputs, train_phase1
from picrl_core.policy import PolicyNetwork
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.rules.conformal import conformal_quantile
from picrl_core.rules.kaplan_meier import KM_TAIL_STEP, kaplan_meier_quantile
from picrl_core.rules.vpa import VPA_OOM_BUMP_RATIO
from picrl_core.series import PreparedSeries, prepare_series
from picrl_core.synthetic import stationary_gaussian
from picrl_core.training_memo import shared_training

RATIO = 2.0 / 3.0  # c_under / (c_under + c_over) for the default 2:1 prices
NAMES = [m.name for m in METHODS]
HINDSIGHT = {m.name for m in METHODS if m.group == "hindsight"}


def by_name(name: str) -> Method:
    return next(m for m in METHODS if m.name == name)


@pytest.fixture(scope="module")
def series(diurnal_series: np.ndarray) -> PreparedSeries:
    return prepare_series(diurnal_series, "diurnal")


@pytest.fixture(scope="module")
def fitted(series: PreparedSeries, tiny_config: PicRLConfig) -> dict[str, Provisioner]:
    return {m.name: m.fit(series, tiny_config) for m in METHODS}


def two_services(series: PreparedSeries, window: int, oracle: bool) -> dict[str, np.ndarray]:
    """The test split for two services: a copy and a scaled copy (two copies for a hindsight reference,
    which replays the test split)."""
    demand = series.test[:, None] * np.array([1.0, 1.0 if oracle else 0.8])
    history = series.val[None, -window:] * np.array([[1.0], [1.0 if oracle else 0.8]])
    return {"demand": demand, "history": history}


def test_every_group_and_name_is_listed() -> None:
    assert sorted(NAMES) == sorted(
        [
            "conformal",
            "conformal-fi",
            "conformal-coupled",
            "thompson",
            "spo",
            "autopilot",
            "vpa",
            "tobit",
            "kaplan-meier",
            "sgd",
            "sgd-residual",
            "naive",
            "oracle",
            "oracle-mu",
        ]
    )
    groups = {m.name: m.group for m in METHODS}
    assert groups["conformal"] == "phase-3" and groups["thompson"] == "phase-2+3"
    assert groups["spo"] == groups["autopilot"] == "full" and HINDSIGHT == {"oracle", "oracle-mu"}
    assert {groups[n] for n in ("vpa", "tobit", "kaplan-meier", "sgd", "sgd-residual", "naive")} == {"operator"}
    assert groups["conformal-fi"] == "reference" and groups["conformal-coupled"] == "multi-resource"
    assert [m.name for m in METHODS if m.multi_resource_only] == ["conformal-coupled"]
    assert [m.name for m in METHODS if not m.censoring] == ["conformal-fi"]
    assert all(m.reference and m.label for m in METHODS)


@pytest.mark.parametrize("name", NAMES)
def test_fit_is_seeded_never_reads_the_test_split_and_acts_in_unit_range(
    name: str, series: PreparedSeries, tiny_config: PicRLConfig, fitted: dict[str, Provisioner]
) -> None:
    inputs = two_services(series, tiny_config.predictor.window, name in HINDSIGHT)
    first = run_pic_loop(fitted[name], **inputs)
    assert first.actions.shape == inputs["demand"].shape
    assert np.all((first.actions >= 0.0) & (first.actions <= 1.0))
    # a second fit, on a series whose test split is unreadable (except for a hindsight reference), acts the same
    blind = series if name in HINDSIGHT else replace(series, test=np.full_like(series.test, np.nan))
    second = run_pic_loop(by_name(name).fit(blind, tiny_config), **inputs)
    np.testing.assert_array_equal(first.actions, second.actions)


@pytest.mark.parametrize("name", NAMES)
def test_actions_depend_on_the_censored_feedback_only(
    name: str, series: PreparedSeries, tiny_config: PicRLConfig, fitted: dict[str, Provisioner]
) -> None:
    inputs = two_services(series, tiny_config.predictor.window, name in HINDSIGHT)
    run = run_pic_loop(fitted[name], **inputs)
    assert run.censored.any()
    # raise demand wherever it was censored: (y, c) = (a, 1) is unchanged there, so must be every action
    # (the provisioner is reused: start() must reset all of its state)
    hidden = np.where(run.censored, np.minimum(inputs["demand"] + 0.3, 1.5), inputs["demand"])
    again = run_pic_loop(fitted[name], hidden, inputs["history"])
    np.testing.assert_array_equal(run.actions, again.actions)
    np.testing.assert_array_equal(run.observed, again.observed)


# --- Kaplan-Meier and Tobit newsvendors, naive learner (Proposition 1) ---


def test_kaplan_meier_quantile_is_the_empirical_quantile_without_censoring() -> None:
    y = np.random.default_rng(0).random((6, 32))
    quantile, identified = kaplan_meier_quantile(y, np.zeros_like(y, dtype=bool), RATIO)
    assert identified.all()
    np.testing.assert_array_equal(quantile, np.quantile(y, RATIO, axis=1, method="inverted_cdf"))


def test_kaplan_meier_quantile_accounts_for_censoring_and_flags_an_open_tail() -> None:
    y = np.array([[1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    censored = np.array([[False, False, True, False, False], [False, False, False, True, True]])
    quantile, identified = kaplan_meier_quantile(y, censored, 0.5)
    # row 0: S = 0.8, 0.6, (censored), 0.3 -> F reaches 0.5 at 4 (the empirical median would be 3)
    assert identified[0] and quantile[0] == 4.0
    # row 1: F = 0.6 at 3, above that only censored mass: the 0.7 quantile is not identified
    assert not kaplan_meier_quantile(y, censored, 0.7)[1][1]
    km = KaplanMeierNewsvendor(5, 0.7)
    km.start(np.full((1, 5), 0.3), None)
    for value in (0.1, 0.2, 0.3, 0.4, 0.4):
        action = km.act(np.array([value]), np.array([value == 0.4]), None)
    assert action[0] == pytest.approx(0.4 + KM_TAIL_STEP)  # steps above the largest (censored) value


def test_tobit_recovers_a_censored_normal_where_the_naive_fit_does_not(tiny_config: PicRLConfig) -> None:
    rng = np.random.default_rng(3)
    services, window, threshold = 4, 400, 0.5
    tobit = GaussianNewsvendor(window, RATIO, tiny_config.estimator, tiny_config.reward)
    naive = GaussianNewsvendor(window, RATIO, tiny_config.estimator, tiny_config.reward, read_censored_as_demand=True)
    history = np.full((services, 1), threshold)
    tobit.start(history, None)
    naive.start(history, None)
    for d in rng.normal(0.5, 0.1, (window, services)):
        y, c = np.minimum(d, threshold), d > threshold
        a_tobit, a_naive = tobit.act(y, c, None), naive.act(y, c, None)
    target = 0.5 + 0.1 * 0.4307  # mu + sigma * Phi^-1(2/3)
    np.testing.assert_allclose(a_tobit, target, atol=0.025)
    assert np.all(a_naive < target - 0.045)  # mean and spread of min(d, 0.5) are both biased down


def test_naive_learner_spirals_down_under_censoring_while_tobit_does_not(
    series: PreparedSeries, tiny_config: PicRLConfig
) -> None:
    config = replace(tiny_config, estimator=replace(tiny_config.estimator, window=32))
    demand = stationary_gaussian(1200, 0.5, 0.1, seed=2)[:, None]
    history = stationary_gaussian(32, 0.5, 0.1, seed=4)[None, :]
    naive = run_pic_loop(fit_naive(series, config), demand, history)
    tobit = run_pic_loop(fit_tobit(series, config), demand, history)
    blocks = naive.actions[:400, 0].reshape(4, -1).mean(axis=1)
    assert np.all(np.diff(blocks[:3]) < 0)  # it slides down ...
    assert naive.actions[:32].mean() > naive.actions[-600:].mean() + 0.06
    assert naive.actions[-600:].mean() < 0.45  # ... to well below E[D] = 0.5
    assert naive.censored.mean() > 0.65
    assert tobit.actions[-600:].mean() == pytest.approx(0.543, abs=0.02)
    assert tobit.censored.mean() < 0.42


# --- operators: VPA and Autopilot ---


def test_vpa_bumps_the_limit_after_a_shortage() -> None:
    vpa = VPAProvisioner(half_life=100)
    calm = vpa.start(np.full((2, 50), 0.3) + np.linspace(0, 0.05, 50), None)
    bumped = vpa.act(np.array([calm[0], 0.3]), np.array([True, False]), None)
    assert bumped[0] >= VPA_OOM_BUMP_RATIO * calm[0] - 1e-12
    assert bumped[1] <= calm[1] + 1e-12  # no shortage, no bump
    # the bump is a floor for the restart, the p90 of the history still rules afterwards
    later = [vpa.act(np.array([0.3, 0.3]), np.array([False, False]), None) for _ in range(3)]
    assert later[-1][0] < bumped[0]


def test_autopilot_max_recommendation_covers_the_window_peak_with_margin_and_forgets_it() -> None:
    pilot = AutopilotProvisioner(window=16, half_life=8)
    history = np.random.default_rng(5).uniform(0.2, 0.4, (3, 16))
    history[:, 3] = 0.6  # a spike inside the window
    peak = pilot.start(history, None)
    assert np.all(peak >= 1.1 * history.max(axis=1) - 1e-12)
    assert np.all(peak <= 1.1 * (history.max(axis=1) + 1.0 / 400) + 1e-12)
    for _ in range(3):  # the spike is now the oldest sample of the window
        action = pilot.act(np.full(3, 0.25), np.zeros(3, dtype=bool), None)
    np.testing.assert_array_equal(action, peak)
    action = pilot.act(np.full(3, 0.25), np.zeros(3, dtype=bool), None)
    assert np.all(action < 1.1 * 0.41)
    p98 = AutopilotProvisioner(window=16, half_life=8, statistic="p98").start(history, None)
    assert np.all((p98 >= 1.1 * 0.2) & (p98 <= peak))
    with pytest.raises(ValueError, match="statistic"):
        AutopilotProvisioner(window=16, half_life=8, statistic="peak")


# --- conformal, Thompson sampling, SPO+ ---


def test_conformal_quantile_covers_exchangeable_residuals_and_censoring_raises_it() -> None:
    rng = np.random.default_rng(0)
    n, alpha = 199, 1.0 - RATIO
    calibration = rng.standard_normal((2000, n))
    q = conformal_quantile(calibration, np.full(2000, alpha))
    coverage = np.mean(rng.standard_normal(2000) <= q)
    assert 1 - alpha - 0.03 <= coverage <= 1 - alpha + 1.0 / (n + 1) + 0.03
    censored = np.where(calibration > 1.0, np.inf, calibration)  # lower bounds read as +inf
    assert np.all(conformal_quantile(censored, np.full(2000, alpha)) >= q)
    assert np.isinf(conformal_quantile(np.zeros((1, 5)), np.array([0.1]))).all()  # rank 6 > n = 5


def test_conformal_shortage_rate_tracks_the_newsvendor_miscoverage(
    series: PreparedSeries, tiny_config: PicRLConfig, fitted: dict[str, Provisioner]
) -> None:
    run = run_pic_loop(fitted["conformal"], **evaluation_inputs(series, tiny_config.predictor.window))
    assert run.censored.mean() == pytest.approx(1.0 - RATIO, abs=0.05)


def test_predictor_based_methods_reuse_a_given_phase1_predictor(
    series: PreparedSeries, tiny_config: PicRLConfig, tiny_predictor: GaussianLSTM
) -> None:
    for fit in (fit_conformal, fit_thompson):
        provisioner = fit(series, tiny_config, predictor=tiny_predictor)
        assert getattr(provisioner, "rule", provisioner).model is tiny_predictor  # a deployed rule holds it
        run = run_pic_loop(provisioner, **evaluation_inputs(series, tiny_config.predictor.window))
        assert np.all((run.actions >= 0.0) & (run.actions <= 1.0))


def test_gaussian_thompson_settles_on_the_better_arm() -> None:
    rng = np.random.default_rng(7)
    bandit = GaussianThompson.empty(1, 2)
    chosen, rewards = [], []
    for _ in range(400):
        arm = bandit.sample(np.zeros(1, dtype=np.int64), rng)
        reward = rng.normal([-0.05, -0.10][arm[0]], 0.02, 1)
        bandit.update(np.zeros(1, dtype=np.int64), arm, reward)
        chosen.append(arm[0])
        rewards.append(reward[0])
    assert np.mean(np.array(chosen[-200:]) == 0) > 0.9
    assert bandit.pulls.sum() == 400 and bandit.scale()[0] == pytest.approx(np.var(rewards))


def test_spo_plus_bound_is_tight_and_training_targets_the_critical_fractile(
    series: PreparedSeries, tiny_config: PicRLConfig, fitted: dict[str, Provisioner]
) -> None:
    cost = tiny_config.cost
    w = np.linspace(0.0, 1.0, 2001)
    rng = np.random.default_rng(1)
    for p, d in rng.random((20, 2)):  # max_w {l(w, d) - 2 l(w, p)} + 2 z*(p) - z*(d) = l(p, d) on [0, 1]
        bound = np.max(asymmetric_cost(w, d, cost) - 2.0 * asymmetric_cost(w, p, cost))
        assert bound == pytest.approx(float(asymmetric_cost(p, d, cost)), abs=2e-3)
        loss = spo_plus_loss(torch.tensor([p]), torch.tensor([d]), cost).item()
        assert loss == pytest.approx(float(asymmetric_cost(p, d, cost)), rel=1e-6)
    # offline on the uncensored test split, the trained predictor is short about 1 - 2/3 of the time
    spo = fitted["spo"]
    window = tiny_config.predictor.window
    actions = [spo.start(series.test[None, t - window : t], None)[0] for t in range(window, len(series.test))]
    shortage = np.mean(series.test[window:] > np.array(actions))
    assert 0.2 < shortage < 0.45


# --- the hindsight references ---


@pytest.mark.parametrize("seed", range(4))
def test_hindsight_buffer_beats_every_buffer_of_a_fine_grid(seed: int) -> None:
    """On any base forecast (here a noisy one, with demand and actions clipped at both ends), ``b*`` costs no more
    than any buffer of a brute-force grid, and its cost is the grid's minimum to within the grid's step."""
    rng = np.random.default_rng(seed)
    demand = np.clip(0.5 + np.cumsum(rng.normal(0, 0.08, 300)), 0, 1)
    base = demand + rng.normal(0.05, 0.1, 300)
    cost = replace(PicRLConfig().cost, c_under=float(rng.uniform(1, 4)), c_over=float(rng.uniform(0.5, 2)))
    b = hindsight_buffer(base, demand, cost)
    grid = np.linspace(-1.5, 1.5, 30_001)

    def total(buffers: np.ndarray) -> np.ndarray:
        return asymmetric_cost(np.clip(base[None, :] + buffers[:, None], 0, 1), demand, cost).sum(axis=1)

    best, on_grid = total(np.array([b]))[0], total(grid)
    assert best <= on_grid.min() + 1e-9
    slope = (cost.c_under + cost.c_over) * demand.size
    assert best >= on_grid.min() - slope * (grid[1] - grid[0])
    assert best < on_grid.max()  # not a flat function: the minimum means something


def test_the_replay_of_b_star_has_the_lowest_regret_of_any_constant_buffer(
    series: PreparedSeries, tiny_config: PicRLConfig, fitted: dict[str, Provisioner]
) -> None:
    """Run under the PIC loop, the fitted reference beats the same base with any other buffer."""
    reference = fitted["oracle-mu"]
    assert isinstance(reference, HindsightProvisioner)
    inputs = evaluation_inputs(series, tiny_config.predictor.window)

    def regret(buffer: float) -> float:
        replay = HindsightProvisioner(reference.demand, reference.base, np.array([buffer]), reference.history_end)
        return episode_metrics(run_pic_loop(replay, **inputs).actions, inputs["demand"], tiny_config.cost).regret

    chosen = regret(float(reference.buffer[0]))
    assert all(chosen <= regret(float(reference.buffer[0]) + shift) + 1e-9 for shift in (-0.05, -0.01, 0.01, 0.05))


def test_oracle_mu_reads_pic_rls_predictor_as_its_controller_does_on_the_true_history(
    series: PreparedSeries, tiny_config: PicRLConfig, tiny_policy: PolicyNetwork
) -> None:
    """``m_t`` is the ``mu_t`` PIC-RL's controller forecasts for tick ``t`` when fed the true demand, uncensored."""
    with shared_training():
        reference = fit_oracle_mu(series, tiny_config)
        predictor = train_phase1(series, config_for(series, tiny_config))[0]
    controller = PicRLController(predictor, tiny_policy, tiny_config)
    inputs = evaluation_inputs(series, tiny_config.predictor.window)
    state = controller.initial_state(np.zeros(1, dtype=np.uint64), inputs["history"])
    mu = [state.mu[0]]
    for d in inputs["demand"][:-1]:
        state, _ = controller.step(state, d, np.zeros(1, dtype=bool))
        mu.append(state.mu[0])
    np.testing.assert_allclose(reference.base[:, 0], mu, atol=1e-5)


@pytest.mark.parametrize("name", sorted(HINDSIGHT))
def test_a_hindsight_reference_refuses_demand_that_is_not_the_test_split(
    name: str, series: PreparedSeries, tiny_config: PicRLConfig, fitted: dict[str, Provisioner]
) -> None:
    inputs = evaluation_inputs(series, tiny_config.predictor.window)
    shifted = inputs["demand"] + np.where(np.arange(len(series.test)) == 40, -0.2, 0.0)[:, None]
    with pytest.raises(ValueError, match="not series.test's"):
        run_pic_loop(fitted[name], np.clip(shifted, 0, 1), inputs["history"])
    with pytest.raises(ValueError, match="validation split"):
        run_pic_loop(fitted[name], inputs["demand"], inputs["history"] + 0.1)
    validation = evaluation_inputs(series, tiny_config.predictor.window, "val")
    with pytest.raises(ValueError, match="replays the test split"):
        run_pic_loop(fitted[name], validation["demand"], validation["history"])
    with pytest.raises(ValueError, match="the loop ran longer"):
        run_pic_loop(fitted[name], np.concatenate([inputs["demand"], inputs["demand"][:5]]), inputs["history"])


def test_persistence_with_its_hindsight_buffer_beats_every_method_on_a_random_walk(tiny_config: PicRLConfig) -> None:
    """Where persistence is the best forecast, no method learns a better rule than its best constant buffer."""
    rng = np.random.default_rng(4)
    steps = rng.normal(0.0, 0.02, 2400)
    walk = np.empty(2400)
    level = 0.5
    for t, step in enumerate(steps):  # reflected random walk: persistence is the best forecast
        level = level + step
        level = -level if level < 0 else (2 - level if level > 1 else level)
        walk[t] = level
    walk_series = prepare_series(walk, "walk")
    inputs = evaluation_inputs(walk_series, tiny_config.predictor.window)
    regret = {
        m.name: episode_metrics(
            run_pic_loop(m.fit(walk_series, tiny_config), **inputs).actions, inputs["demand"], tiny_config.cost
        ).regret
        for m in METHODS
        if m.name == "oracle" or m.name not in HINDSIGHT
    }
    assert all(regret["oracle"] < value for name, value in regret.items() if name != "oracle"), regret


# --- the censored SGD newsvendor, validation selection, full information ---


def test_censored_sgd_steps_on_the_cost_subgradient_and_settles_at_the_critical_fractile() -> None:
    cost = PicRLConfig().cost
    sgd = CensoredSGDProvisioner(0.01, cost, 0.5)
    assert sgd.start(np.full((1, 4), 0.2), None)[0] == 0.5
    assert sgd.act(np.array([0.5]), np.array([True]), None)[0] == pytest.approx(0.5 + 0.01 * cost.c_under)
    assert sgd.act(np.array([0.3]), np.array([False]), None)[0] == pytest.approx(0.52 - 0.01 * cost.c_over)
    rng = np.random.default_rng(3)
    demand = rng.uniform(0.2, 0.8, (6000, 50))
    run = run_pic_loop(CensoredSGDProvisioner(0.002, cost, 0.5), demand, np.full((50, 4), 0.5))
    assert run.censored[3000:].mean() == pytest.approx(1.0 - RATIO, abs=0.02)


def test_validation_selection_picks_the_lowest_validation_regret_and_never_reads_test(
    series: PreparedSeries, tiny_config: PicRLConfig
) -> None:
    poisoned = replace(series, test=np.full_like(series.test, np.nan))
    selection = select_on_validation(
        (0.001, 0.01, 0.1),
        lambda step: CensoredSGDProvisioner(step, tiny_config.cost, float(np.quantile(series.train, RATIO))),
        poisoned,
        tiny_config,
    )
    assert np.isfinite(selection.validation_regret).all()  # a NaN would mean the test split was read
    assert selection.chosen == selection.candidates[int(np.argmin(selection.validation_regret))]
    assert len(set(selection.validation_regret)) == 3  # the steps make a difference
    with pytest.raises(ValueError, match="candidates"):
        select_on_validation(
            tuple(range(CANDIDATES + 1)),
            lambda _: CensoredSGDProvisioner(0.01, tiny_config.cost, 0.5),
            series,
            tiny_config,
        )


def test_full_information_loop_reveals_demand_and_records_shortages(
    series: PreparedSeries, tiny_config: PicRLConfig, tiny_predictor: GaussianLSTM
) -> None:
    conformal = fit_conformal(series, tiny_config, predictor=tiny_predictor)
    inputs = evaluation_inputs(series, tiny_config.predictor.window)
    run = run_pic_loop(conformal, **inputs, censoring=False)
    np.testing.assert_array_equal(run.observed, inputs["demand"])
    np.testing.assert_array_equal(run.censored, inputs["demand"] > run.actions)
    assert np.isfinite(conformal.state.residuals).all()  # no residual was censored to +inf
    assert run.censored.mean() == pytest.approx(1.0 - RATIO, abs=0.08)
