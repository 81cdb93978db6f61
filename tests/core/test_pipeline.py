"""End to end: Phases 1-2 offline and Phase 3 online on a prepared synthetic series (picrl_core.pipeline)."""

from __future__ import annotations

import math
from dataclasses import fields, replace

import numpy as np
import pytest
import torch

from picrl_core.artifact import ModelArtifact
from picrl_core.config import PicRLConfig
from picrl_core.costs import episode_metrics
from picrl_core.pipeline import (
    SCALE_RATES,
    OnlineRun,
    config_for,
    evaluation_inputs,
    run_online,
    select_scale_rate,
    train_offline,
    validation_run,
)
from picrl_core.series import PreparedSeries, prepare_series
from picrl_core.simulator import Trajectory
from picrl_core.synthetic import diurnal

N_UPDATE = 16


@pytest.fixture(scope="module")
def series() -> PreparedSeries:
    raw = 200.0 + 80.0 * diurnal(1000, period=48, seed=21)  # raw units: prepare_series scales to [0, 1]
    return prepare_series(raw, "synthetic-diurnal")


@pytest.fixture(scope="module")
def artifact(series: PreparedSeries, tiny_config: PicRLConfig) -> ModelArtifact:
    return train_offline(series, tiny_config)


def _phase3(config: PicRLConfig) -> PicRLConfig:
    """Slow update every ``N_UPDATE`` transitions; a batch that small so the first one is not delayed."""
    return replace(config, online=replace(config.online, n_update=N_UPDATE, batch_size=N_UPDATE))


def _expected_updates(steps: int, services: int, n_update: int, batch_size: int) -> list[int]:
    """Transitions seen at each slow update: the runner's rule (every ``n_update`` ticks, whatever the
    number of services), replayed from counts alone."""
    seen, since, marks = 0, 0, []
    for _ in range(steps):
        seen += services
        since += 1
        if since >= n_update and seen >= min(batch_size, 32):
            marks.append(seen)
            since = 0
    return marks


def _assert_finite(trajectory: Trajectory) -> None:
    for f in fields(Trajectory):
        values = getattr(trajectory, f.name)
        assert np.all(np.isfinite(values.astype(np.float64))), f.name


def test_train_offline_builds_a_complete_artifact(
    artifact: ModelArtifact, series: PreparedSeries, tiny_config: PicRLConfig
) -> None:
    rate = artifact.reports["phase3_scale_rate"]["chosen"]  # the online temperature's rate, chosen on validation
    start = artifact.reports["phase3_start"]  # a new service starts at that run's levels (start_from_validation)
    expected = config_for(series, tiny_config)
    assert artifact.config == replace(
        expected,
        calibrator=replace(
            expected.calibrator, scale_rate=rate, initial_margin=start["margin_in_sigma"], initial_scale=start["scale"]
        ),
    )
    assert artifact.config.predictor.context_channels == 0
    assert artifact.scaling["series"] == series.scaler.to_dict() and artifact.scaling["context"] == []
    assert artifact.reports["series"] == "synthetic-diurnal"
    assert 1 <= artifact.reports["phase1"]["epochs_run"] <= tiny_config.predictor.epochs
    assert artifact.reports["phase2"]["iterations"] == tiny_config.pretrain.iterations
    assert all(math.isfinite(v) for v in artifact.reports["phase2"]["value_loss"])


def test_select_scale_rate_keeps_the_rate_of_lowest_validation_regret(
    artifact: ModelArtifact, series: PreparedSeries
) -> None:
    poisoned = replace(series, test=np.full_like(series.test, np.nan))  # the test split is never read
    online = replace(
        artifact,
        config=replace(
            artifact.config, calibrator=replace(artifact.config.calibrator, online_scale=True, select_scale_rate=True)
        ),
    )
    chosen_artifact, selection, run = select_scale_rate(online, poisoned)
    assert selection["rates"] == list(SCALE_RATES)
    assert selection["validation_regret"][SCALE_RATES.index(selection["chosen"])] == min(selection["validation_regret"])
    assert run.regret == min(selection["validation_regret"])
    assert len(set(selection["validation_regret"])) > 1  # the rate matters on this series
    assert chosen_artifact.config.calibrator == replace(online.config.calibrator, scale_rate=selection["chosen"])


def test_start_from_validation_keeps_the_levels_of_the_chosen_validation_run(
    series: PreparedSeries, tiny_config: PicRLConfig
) -> None:
    poisoned = replace(series, test=np.full_like(series.test, np.nan))  # the test split is never read
    assert tiny_config.calibrator.start_from_validation  # the default
    warm = train_offline(poisoned, tiny_config)
    start, cal = warm.reports["phase3_start"], warm.config.calibrator
    assert (cal.initial_margin, cal.initial_scale) == (start["margin_in_sigma"], start["scale"])
    cold = replace(warm, config=replace(warm.config, calibrator=replace(cal, initial_margin=0.0, initial_scale=1.0)))
    run = validation_run(cold, poisoned)  # the chosen rate's run, from the cold start every candidate had
    assert run.regret == min(warm.reports["phase3_scale_rate"]["validation_regret"])
    assert (run.margin, run.scale) == (cal.initial_margin, cal.initial_scale)
    assert cal.initial_margin != 0.0 and cal.scale_min <= cal.initial_scale <= cal.scale_max
    assert cal.initial_scale != 1.0


def test_run_online_single_service(artifact: ModelArtifact, series: PreparedSeries) -> None:
    config = _phase3(artifact.config)
    before = {k: v.clone() for k, v in artifact.policy.state_dict().items()}
    ticks: list[int] = []
    run = run_online(
        artifact, **evaluation_inputs(series, config.predictor.window), config=config, progress=ticks.append
    )
    assert isinstance(run, OnlineRun)
    steps = len(series.test)
    assert run.trajectory.action.shape == (steps, 1)
    np.testing.assert_array_equal(run.trajectory.demand[:, 0], series.test)
    _assert_finite(run.trajectory)
    assert run.metrics == episode_metrics(run.trajectory.action, run.trajectory.demand, config.cost)
    assert run.metrics.steps == steps and 0 < run.metrics.shortage_rate < 1
    assert ticks == list(range(steps))

    marks = [u.transitions_seen for u in run.updates]
    assert marks == list(range(N_UPDATE, steps + 1, N_UPDATE))  # every N_update transitions
    assert marks == _expected_updates(steps, 1, N_UPDATE, N_UPDATE)
    assert [u.update for u in run.updates] == list(range(1, len(marks) + 1))
    assert all(math.isfinite(u.kl_to_parent) and math.isfinite(u.value_loss) for u in run.updates)
    after = artifact.policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the artifact's policy is left alone


def test_run_online_many_services_and_without_slow_updates(artifact: ModelArtifact, series: PreparedSeries) -> None:
    config = _phase3(artifact.config)
    window, services, steps = config.predictor.window, 3, 60
    demand = np.stack([series.test[i * 20 : i * 20 + steps] for i in range(services)], axis=1)
    history = np.stack([series.val[-window - 5 * i : len(series.val) - 5 * i] for i in range(services)])
    run = run_online(artifact, demand, history, config=config)
    _assert_finite(run.trajectory)
    assert run.metrics == episode_metrics(run.trajectory.action, demand, config.cost)
    marks = [u.transitions_seen for u in run.updates]
    assert marks == _expected_updates(steps, services, N_UPDATE, N_UPDATE)
    assert marks[:2] == [48, 96]  # every 16 ticks, each bringing 3 transitions

    frozen = run_online(artifact, demand, history, config=config, slow_updates=False)
    assert frozen.updates == []
    assert frozen.metrics == episode_metrics(frozen.trajectory.action, demand, config.cost)
    # the first update happens after tick 15; before it the two runs act identically
    np.testing.assert_array_equal(frozen.trajectory.action[:17], run.trajectory.action[:17])
    assert not np.array_equal(frozen.trajectory.action[7:], run.trajectory.action[7:])  # then the policy moved


def test_pipeline_with_a_context_channel(tiny_config: PicRLConfig) -> None:
    rng = np.random.default_rng(5)
    duty = np.clip(0.5 + 0.4 * np.sin(2 * np.pi * np.arange(600) / 48) + 0.05 * rng.standard_normal(600), 0, 1)
    raw = 10.0 + 30.0 * duty + rng.standard_normal(600)
    prepared = prepare_series(raw, "with-context", context=duty[:, None], context_names=["duty"])
    artifact = train_offline(prepared, tiny_config)
    assert artifact.config.predictor.context_channels == 1
    assert len(artifact.scaling["context"]) == 1
    inputs = evaluation_inputs(prepared, artifact.config.predictor.window)
    assert inputs["context"].shape == (len(prepared.test), 1, 1)
    run = run_online(artifact, **inputs, config=_phase3(artifact.config))
    _assert_finite(run.trajectory)
    assert run.metrics == episode_metrics(run.trajectory.action, run.trajectory.demand, artifact.config.cost)
    assert len(run.updates) == len(prepared.test) // N_UPDATE
