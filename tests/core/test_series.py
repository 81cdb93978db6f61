"""Validation, splitting, scaling and statistics of demand series (picrl_core.series)."""

from __future__ import annotations

import numpy as np
import pytest

from picrl_core.series import (
    MinMaxScaler,
    PreparedSeries,
    UnusableSeriesError,
    chronological_split,
    describe_series,
    native_splits,
    prepare_series,
    validate_context,
    validate_series,
)


def ramp(n: int = 300) -> np.ndarray:
    return np.sin(np.arange(n) / 7.0) + 2.0


# --- validate_series ---------------------------------------------------------------------------


def test_clean_series_is_returned_unchanged_without_notes() -> None:
    x = ramp()
    filled, notes = validate_series(x, "clean")
    np.testing.assert_array_equal(filled, x)
    assert notes == []
    assert filled is not x


def test_interior_gaps_are_filled_linearly_and_reported() -> None:
    x = np.linspace(0.0, 299.0, 300)
    holey = x.copy()
    holey[[10, 11, 12]] = np.nan
    holey[[50]] = np.nan
    holey[[100, 101, 102]] = np.nan
    filled, notes = validate_series(holey, "holey")
    np.testing.assert_allclose(filled, x)  # a straight line is reproduced exactly
    assert notes == ["filled 3 gaps (7 points) by linear interpolation"]


def test_edge_gaps_take_the_nearest_value() -> None:
    x = ramp()
    holey = x.copy()
    holey[:2] = np.nan
    holey[-1] = np.nan
    filled, notes = validate_series(holey, "edges")
    assert filled[0] == filled[1] == x[2]
    assert filled[-1] == x[-2]
    assert notes == ["filled 2 gaps (3 points) at the series ends with the nearest value"]


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        (np.ones(50), "has 50 points; at least 200"),
        (np.full(300, np.nan), "every entry is missing"),
        (np.concatenate([ramp(100), [np.inf], ramp(199)]), "infinite value (first at index 100)"),
        (np.full(300, 4.0), "is constant (every value is 4)"),
        (np.concatenate([ramp(100), np.full(6, np.nan), ramp(194)]), "gap of 6 consecutive missing values"),
        (np.ones((20, 20)), "one-dimensional"),
    ],
)
def test_unusable_series_are_rejected_with_their_name(values: np.ndarray, fragment: str) -> None:
    with pytest.raises(UnusableSeriesError, match="'demand-x'") as info:
        validate_series(values, "demand-x")
    assert fragment in str(info.value)


def test_gap_limits_are_configurable() -> None:
    x = ramp()
    x[100:106] = np.nan
    filled, _ = validate_series(x, "s", max_gap=6)
    assert np.isfinite(filled).all()
    validate_series(ramp(50), "short", min_length=50)


def test_unusable_series_error_is_a_value_error() -> None:
    assert issubclass(UnusableSeriesError, ValueError)


# --- validate_context --------------------------------------------------------------------------


def test_context_channels_are_filled_and_named_in_notes() -> None:
    ctx = np.column_stack([ramp(), np.cos(np.arange(300.0))])
    holey = ctx.copy()
    holey[5, 1] = np.nan
    filled, notes = validate_context(holey, ("a", "b"))
    np.testing.assert_allclose(filled[5, 1], (ctx[4, 1] + ctx[6, 1]) / 2)
    assert notes == ["context 'b': filled 1 gap (1 point) by linear interpolation"]


def test_context_rejects_constant_channel_and_wrong_names() -> None:
    ctx = np.column_stack([ramp(), np.zeros(300)])
    with pytest.raises(UnusableSeriesError, match="context channel 'flat' is constant"):
        validate_context(ctx, ("ok", "flat"))
    with pytest.raises(UnusableSeriesError, match="2 channels but 1 names"):
        validate_context(ctx, ("ok",))


# --- chronological_split -----------------------------------------------------------------------


def test_split_is_consecutive_and_covers_everything() -> None:
    train, val, test = chronological_split(1000)
    assert (train, val, test) == (slice(0, 600), slice(600, 800), slice(800, 1000))
    train, val, test = chronological_split(1441)
    assert train.start == 0 and train.stop == val.start and val.stop == test.start and test.stop == 1441
    assert abs(train.stop - 0.6 * 1441) <= 0.5 and abs(test.stop - test.start - 0.2 * 1441) <= 1


def test_split_rejects_bad_fractions_and_tiny_series() -> None:
    with pytest.raises(ValueError, match="summing to 1"):
        chronological_split(100, (0.5, 0.2, 0.2))
    with pytest.raises(ValueError, match="three positive"):
        chronological_split(100, (1.0, 0.0, 0.0))
    with pytest.raises(UnusableSeriesError, match="too few"):
        chronological_split(2)


# --- MinMaxScaler -----------------------------------------------------------------------------


def test_scaler_maps_training_range_to_unit_interval_and_clips() -> None:
    scaler = MinMaxScaler.fit(np.array([2.0, 4.0, 6.0]))
    assert (scaler.low, scaler.high) == (2.0, 6.0)
    np.testing.assert_allclose(scaler.transform(np.array([2.0, 3.0, 6.0, 10.0, -1.0])), [0, 0.25, 1, 1, 0])
    np.testing.assert_allclose(scaler.inverse(np.array([0.0, 0.5, 1.0])), [2.0, 4.0, 6.0])


def test_scaler_round_trips_through_dict() -> None:
    scaler = MinMaxScaler(-1.5, 3.25)
    assert MinMaxScaler.from_dict(scaler.to_dict()) == scaler
    with pytest.raises(ValueError, match="'low' and 'high'"):
        MinMaxScaler.from_dict({"low": 0.0, "hi": 1.0})
    with pytest.raises(ValueError, match="low < high"):
        MinMaxScaler(1.0, 1.0)


def test_scaler_rejects_constant_training_part() -> None:
    with pytest.raises(UnusableSeriesError, match="constant"):
        MinMaxScaler.fit(np.full(10, 7.0))


# --- prepare_series ---------------------------------------------------------------------------


def test_prepare_uses_training_statistics_only() -> None:
    # Rising series: val/test exceed the training maximum and must clip to 1.
    x = np.linspace(0.0, 10.0, 1000)
    prepared = prepare_series(x, "rising")
    assert isinstance(prepared, PreparedSeries)
    assert (prepared.train.size, prepared.val.size, prepared.test.size) == (600, 200, 200)
    assert prepared.scaler == MinMaxScaler(0.0, x[599])
    np.testing.assert_allclose(prepared.train, x[:600] / x[599])
    assert np.all(prepared.val == 1.0) and np.all(prepared.test == 1.0)
    assert prepared.train_ctx is None and prepared.context_scalers == ()
    assert prepared.notes == (
        "100% of the validation part lies outside the training range [0, 5.996] and is clipped to [0, 1]",
        "100% of the test part lies outside the training range [0, 5.996] and is clipped to [0, 1]",
    )


def test_native_splits_are_the_prepared_parts_before_scaling_and_clipping() -> None:
    x = np.linspace(0.0, 10.0, 1000)
    x[700] = np.nan  # a gap, filled as prepare_series fills it
    prepared = prepare_series(x, "rising")
    train, val, test = native_splits(x, "rising")
    assert (train.shape, val.shape, test.shape) == ((600, 1), (200, 1), (200, 1))
    assert val[100, 0] == pytest.approx(7.007, abs=1e-3) and test.max() == 10.0  # filled, not clipped
    for native, part in ((train, prepared.train), (val, prepared.val), (test, prepared.test)):
        np.testing.assert_allclose(prepared.scaler.transform(native[:, 0]), part)
    fleet = native_splits(np.column_stack([x, 2 * x]), "fleet")[2]
    np.testing.assert_allclose(fleet, np.column_stack([test[:, 0], 2 * test[:, 0]]))


def test_prepare_scales_each_context_channel_on_train() -> None:
    n = 500
    x = ramp(n)
    ctx = np.column_stack([np.arange(n, dtype=float), 100.0 + 10.0 * np.cos(np.arange(n) / 5.0)])
    ctx[3, 0] = np.nan
    prepared = prepare_series(x, "with-ctx", ctx, ("idx", "wave"))
    assert prepared.train_ctx is not None and prepared.val_ctx is not None and prepared.test_ctx is not None
    assert prepared.train_ctx.shape == (300, 2) and prepared.test_ctx.shape == (100, 2)
    assert prepared.context_scalers[0] == MinMaxScaler(0.0, 299.0)
    np.testing.assert_allclose(prepared.train_ctx[:, 0], np.arange(300) / 299.0)
    assert np.all(prepared.val_ctx[:, 0] == 1.0)
    wave = ctx[:300, 1]
    np.testing.assert_allclose(prepared.test_ctx[:, 1], np.clip((ctx[400:, 1] - wave.min()) / np.ptp(wave), 0, 1))
    assert prepared.notes == ("context 'idx': filled 1 gap (1 point) by linear interpolation",)


def test_prepare_rejects_mismatched_context() -> None:
    with pytest.raises(UnusableSeriesError, match="300 points but its context has 299 rows"):
        prepare_series(ramp(), "s", np.ones((299, 1)) * np.arange(299)[:, None], ("c",))
    with pytest.raises(UnusableSeriesError, match="without a context matrix"):
        prepare_series(ramp(), "s", None, ("c",))


def test_prepare_rejects_constant_training_part() -> None:
    x = np.concatenate([np.full(600, 1.0), ramp(400)])
    with pytest.raises(UnusableSeriesError, match="training part is constant"):
        prepare_series(x, "flat-start")


# --- describe_series --------------------------------------------------------------------------


def test_describe_matches_direct_formulas() -> None:
    rng = np.random.default_rng(3)
    x = 5.0 + np.sin(np.arange(3000) * 2 * np.pi / 60) + 0.1 * rng.standard_normal(3000)
    stats = describe_series(x, step_seconds=60.0)
    z = (x - x.min()) / (x.max() - x.min())
    assert stats["length"] == 3000 and stats["duration_hours"] == pytest.approx(50.0)
    assert stats["pmr"] == pytest.approx(x.max() / x.mean())
    assert stats["cv"] == pytest.approx(x.std() / x.mean())
    assert stats["mm_pmr"] == pytest.approx(1 / z.mean())
    assert stats["mm_cv"] == pytest.approx(z.std() / z.mean())
    assert stats["acf_lag1"] == pytest.approx(np.corrcoef(x[:-1], x[1:])[0, 1])
    assert stats["acf_1h"] == pytest.approx(np.corrcoef(x[:-60], x[60:])[0, 1])
    assert stats["acf_1h"] > 0.9  # lag 1 h = one full period of the sine
    assert stats["acf_1d"] == pytest.approx(np.corrcoef(x[:-1440], x[1440:])[0, 1])


def test_describe_day_lag_defined_only_for_long_enough_series() -> None:
    x = ramp(1500)
    assert np.isfinite(describe_series(x, 60.0)["acf_1d"])
    assert np.isnan(describe_series(x[:1442], 60.0)["acf_1d"])
    assert np.isfinite(describe_series(x[:1443], 60.0)["acf_1d"])
    unknown_step = describe_series(x, float("nan"))
    assert np.isnan(unknown_step["acf_1h"]) and np.isnan(unknown_step["duration_hours"])
