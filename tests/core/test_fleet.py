"""A fleet of services on one time grid (``--datasets pods``): split and scaled together, trained on
windows and rollouts that never straddle two services, run as N services of one loop, scored per service."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from picrl_core.config import PicRLConfig
from picrl_core.methods import REGISTRY
from picrl_core.methods.conformal import split_residuals
from picrl_core.methods.evaluation import run_on_test_split
from picrl_core.pipeline import evaluation_inputs, phase1_predictor
from picrl_core.pretrain import chunk_starts
from picrl_core.series import PreparedSeries, development_series, prepare_fleet, segment_starts
from picrl_core.synthetic import diurnal


def fleet_values(services: int = 3, ticks: int = 400) -> np.ndarray:
    """``(ticks, services)`` of different levels and phases, so a straddling window would show a jump."""
    return np.column_stack([diurnal(ticks, seed=s) * (1.0 + s) + 3.0 * s for s in range(services)])


@pytest.fixture(scope="module")
def fleet() -> PreparedSeries:
    return prepare_fleet(fleet_values(), "fleet")


def test_segment_starts_keep_each_slice_inside_one_segment() -> None:
    np.testing.assert_array_equal(segment_starts(20, 1, 3, 4), np.arange(3, 17))
    starts = segment_starts(30, 3, 2, 5)
    assert starts.size == 3 * (10 - 2 - 5 + 1)
    assert np.all((starts - 2) // 10 == (starts + 5 - 1) // 10)  # first and last point in the same segment
    with pytest.raises(ValueError, match="equal segments"):
        segment_starts(31, 3, 0, 1)


def test_a_fleet_is_split_at_the_same_ticks_and_scaled_on_every_training_part(fleet: PreparedSeries) -> None:
    raw = fleet_values()
    assert fleet.services == 3 and fleet.by_service("train").shape == (3, 240)
    assert fleet.by_service("test").shape == (3, 80)
    assert fleet.scaler.low == pytest.approx(raw[:240].min()) and fleet.scaler.high == pytest.approx(raw[:240].max())
    np.testing.assert_allclose(fleet.by_service("val")[2], fleet.scaler.transform(raw[240:320, 2]))
    dev = development_series(fleet)
    assert dev.services == 3 and dev.by_service("train").shape == (3, 180) and dev.by_service("val").shape == (3, 60)
    np.testing.assert_array_equal(dev.by_service("val")[1], fleet.by_service("train")[1, 180:])


def test_evaluation_inputs_give_every_service_its_own_demand_and_history(fleet: PreparedSeries) -> None:
    test = evaluation_inputs(fleet, 8, "test")
    np.testing.assert_array_equal(test["demand"], fleet.by_service("test").T)
    np.testing.assert_array_equal(test["history"], fleet.by_service("val")[:, -8:])
    val = evaluation_inputs(fleet, 8, "val")
    np.testing.assert_array_equal(val["demand"], fleet.by_service("val").T)
    np.testing.assert_array_equal(val["history"], fleet.by_service("train")[:, -8:])
    one = prepare_fleet(fleet_values()[:, :1], "one")
    single = evaluation_inputs(one, 8, "test")
    assert single["demand"].shape == (80, 1) and single["history"].shape == (1, 8)


def test_rollout_chunks_of_a_fleet_stay_in_one_service(fleet: PreparedSeries) -> None:
    starts, length = chunk_starts(fleet.train, 3, 8, 64, "Phase 2")
    assert length == 64
    first, last = (starts - 8) // 240, (starts + length - 1) // 240
    np.testing.assert_array_equal(first, last)
    with pytest.raises(ValueError, match="steps per service"):
        chunk_starts(fleet.train, 3, 8 * 30, 64, "Phase 2")


def test_conformal_calibrates_each_service_on_its_own_residuals(
    fleet: PreparedSeries, tiny_config: PicRLConfig
) -> None:
    model = phase1_predictor(fleet, tiny_config)
    pooled = split_residuals(model, fleet.val, None, tiny_config, 40, services=3)
    assert pooled.shape == (3, 40)
    for j in range(3):
        alone = split_residuals(model, fleet.by_service("val")[j], None, tiny_config, 40)
        np.testing.assert_allclose(pooled[j], alone, atol=1e-6)


def test_a_fleet_run_scores_the_mean_over_services(fleet: PreparedSeries, tiny_config: PicRLConfig) -> None:
    """The oracle (a per-service rule) on the fleet equals the mean of its runs on each service alone."""
    run = run_on_test_split(REGISTRY["oracle"], fleet, tiny_config, 60.0)
    assert run.actions.shape == run.demand.shape == (80, 3)
    alone = [
        run_on_test_split(
            REGISTRY["oracle"],
            replace(
                fleet,
                services=1,
                train=fleet.by_service("train")[j],
                val=fleet.by_service("val")[j],
                test=fleet.by_service("test")[j],
            ),
            tiny_config,
            60.0,
        )
        for j in range(3)
    ]
    for j, single in enumerate(alone):
        np.testing.assert_allclose(run.actions[:, j], single.actions)
    assert run.metrics.regret == pytest.approx(np.mean([s.metrics.regret for s in alone]))
    assert run.metrics.steps == 80
