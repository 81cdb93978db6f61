"""Statistical properties and reproducibility of the synthetic generators (picrl_core.synthetic)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from picrl_core.series import chronological_split
from picrl_core.synthetic import (
    diurnal,
    exponential_growth,
    heavy_tailed_bursts,
    idle_nights,
    intermittent,
    night_ticks,
    shared_load_pods,
    stationary_gaussian,
)

GENERATORS: list[Callable[..., np.ndarray]] = [
    stationary_gaussian,
    diurnal,
    heavy_tailed_bursts,
    exponential_growth,
    intermittent,
    idle_nights,
]


def acf(x: np.ndarray, lag: int) -> float:
    return float(np.corrcoef(x[:-lag], x[lag:])[0, 1])


def kurtosis(x: np.ndarray) -> float:
    centred = x - x.mean()
    return float((centred**4).mean() / (centred**2).mean() ** 2)


@pytest.mark.parametrize("generator", GENERATORS)
def test_output_is_float64_in_unit_interval(generator: Callable[..., np.ndarray]) -> None:
    x = generator(5000, seed=1)
    assert x.dtype == np.float64 and x.shape == (5000,)
    assert x.min() >= 0.0 and x.max() <= 1.0


@pytest.mark.parametrize("generator", GENERATORS)
def test_same_seed_same_output_different_seed_different_output(generator: Callable[..., np.ndarray]) -> None:
    np.testing.assert_array_equal(generator(3000, seed=7), generator(3000, seed=7))
    assert not np.array_equal(generator(3000, seed=7), generator(3000, seed=8))


def test_gaussian_moments_match_parameters() -> None:
    x = stationary_gaussian(100_000, mean=0.4, std=0.08, seed=3)
    assert x.mean() == pytest.approx(0.4, abs=0.002)  # standard error 0.00025
    assert x.std() == pytest.approx(0.08, abs=0.002)
    assert abs(acf(x, 1)) < 0.02  # i.i.d.


def test_diurnal_correlates_at_the_period_and_anticorrelates_at_half() -> None:
    period = 1440
    x = diurnal(4 * period, period=period, seed=2)
    assert acf(x, period) > 0.9
    assert acf(x, period // 2) < -0.9
    assert x.mean() == pytest.approx(0.45, abs=0.01)


def test_bursts_are_heavy_tailed() -> None:
    x = heavy_tailed_bursts(100_000, seed=4)
    assert kurtosis(x) > 10.0  # a Gaussian has 3
    gaussian = stationary_gaussian(100_000, mean=x.mean(), std=x.std(), seed=4)
    assert np.quantile(x, 0.999) - np.median(x) > 2 * (np.quantile(gaussian, 0.999) - np.median(gaussian))


def test_burst_onsets_occur_at_burst_rate() -> None:
    # With little noise every onset raises the load by at least burst_scale; count those jumps.
    rate, scale = 0.02, 0.1
    x = heavy_tailed_bursts(100_000, noise=0.005, burst_rate=rate, burst_scale=scale, seed=5)
    onsets = np.mean(np.diff(x) > scale / 2)
    assert onsets == pytest.approx(rate, rel=0.15)  # ~2000 expected, Poisson sd ~2 %
    assert heavy_tailed_bursts(10_000, noise=0.0, burst_rate=0.0, seed=5) == pytest.approx(0.3)


def test_invalid_parameters_are_rejected() -> None:
    with pytest.raises(ValueError, match="positive"):
        stationary_gaussian(0)
    with pytest.raises(ValueError, match="period"):
        diurnal(100, period=1)
    with pytest.raises(ValueError, match="probability"):
        heavy_tailed_bursts(100, burst_rate=1.5)
    with pytest.raises(ValueError, match="decay"):
        heavy_tailed_bursts(100, decay=1.0)
    with pytest.raises(ValueError, match="start < end"):
        exponential_growth(100, start=0.5, end=0.4)
    with pytest.raises(ValueError, match="idle shares"):
        intermittent(100, idle_share=(0.2, 1.0))


def test_growth_outgrows_each_earlier_split() -> None:
    x = exponential_growth(1440, seed=5)
    train, val, test = (x[part] for part in chronological_split(x.size))
    assert train.max() < val.max() < test.max()
    assert np.mean(test > train.max()) > 0.9  # the test part lies above the training range


def test_intermittent_idles_at_zero_in_stretches_at_the_shares_asked() -> None:
    x = intermittent(40_000, idle_share=(0.1, 0.6), busy_length=40, seed=3)
    idle = x == 0.0
    assert np.mean(idle[:4000]) == pytest.approx(0.125, abs=0.06)
    assert np.mean(idle[-4000:]) == pytest.approx(0.575, abs=0.08)
    busy_runs = np.diff(np.flatnonzero(np.diff(np.r_[1, idle.astype(int), 1]) != 0))[::2]  # lengths of busy runs
    assert busy_runs.mean() == pytest.approx(40, rel=0.25)
    assert np.all(x[~idle] > 0.0)


def test_shared_load_pods_run_memory_and_compute_on_one_load() -> None:
    memory, compute = shared_load_pods(1440, pods=6, seed=3)
    assert memory.shape == compute.shape == (1440, 6) and memory.dtype == np.float64
    assert memory.min() >= 0.0 and compute.max() <= 1.0
    again = shared_load_pods(1440, pods=6, seed=3)
    assert np.array_equal(memory, again[0]) and np.array_equal(compute, again[1])
    # one load under both: memory's peaks are compute's (what lets a memory shortage hide busy compute)
    assert min(np.corrcoef(memory[:, j], compute[:, j])[0, 1] for j in range(6)) > 0.9
    assert (compute > 0.1).mean() > 0.9  # busy, unlike the bundled pods' compute on its test split
    assert not np.array_equal(memory[:, 0], memory[:, 1])  # each pod its own phase and surges
    with pytest.raises(ValueError, match="at least one pod"):
        shared_load_pods(100, pods=0)


def test_idle_nights_are_busy_through_the_history_and_idle_after_it() -> None:
    demand = idle_nights(1440, seed=3)
    night = night_ticks(1440)
    train, _, test = chronological_split(1440)
    history, later = demand[train], demand[test]
    assert history.min() > 0.4  # the nights of the history stay on the wave: the floor is the day's trough
    assert np.median(later[night[test]]) == pytest.approx(0.06, abs=0.01)  # 10% of the level
    assert np.all(later[~night[test]] > 0.4)
    assert np.all(idle_nights(1440, idle=0.0, seed=3)[test][night[test]] == 0.0)  # scale to zero
