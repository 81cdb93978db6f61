"""Range growth rules and the carry-over of a controller state to a new range (picrl_core.scaling)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from picrl_core.controller_state import LEVEL_FIELDS, SPREAD_FIELDS, UNIT_FREE_FIELDS, ControllerState, rescale_state
from picrl_core.scaling import from_unit, grown_high, outgrown


def _state(services: int = 3, window: int = 4, seed: int = 0) -> ControllerState:
    rng = np.random.default_rng(seed)
    unit = lambda *shape: rng.random(shape)  # noqa: E731
    return ControllerState(
        keys=np.arange(services, dtype=np.uint64),
        tick=np.full(services, 40, np.int64),
        observations=unit(services, window).astype(np.float32),
        censored=unit(services, window) < 0.3,
        context=np.zeros((services, window, 0), np.float32),
        margin=0.1 * unit(services) - 0.05,
        bias=0.02 * unit(services),
        censor_streak=np.array([0, 4, 7])[:services],
        over_streak=np.zeros(services, np.int64),
        action=unit(services),
        mu=unit(services),
        sigma=0.1 * unit(services),
        eta=unit(services),
        k=unit(services),
        pre=unit(services, 2).astype(np.float32),
        log_prob=unit(services).astype(np.float32),
        features=unit(services, 5).astype(np.float32),
        est_mean=unit(services) + 0.5,
        est_std=0.1 * unit(services),
        memory=unit(services, 6).astype(np.float32),
        temperature=unit(services),
        escape=0.05 * unit(services),
        repeat_share=unit(services),
        last_seen=unit(services),
    )


def test_every_controller_state_field_says_how_it_moves_with_the_range() -> None:
    classified = [*LEVEL_FIELDS, *SPREAD_FIELDS, *UNIT_FREE_FIELDS]
    assert sorted(classified) == sorted(f.name for f in fields(ControllerState)) and len(set(classified)) == len(
        classified
    ), "a new ControllerState field needs a place in picrl_core/scaling.py"


def test_a_state_carried_to_a_wider_range_keeps_its_native_values() -> None:
    state = _state()
    low, high = np.array([10.0, 0.0, 5.0]), np.array([70.0, 1.0, 6.0])
    new_low, new_high = np.array([10.0, 0.0, 2.0]), np.array([130.0, 3.0, 9.0])
    moved = rescale_state(state, low, high, new_low, new_high)
    for name in LEVEL_FIELDS:
        old, new = getattr(state, name), getattr(moved, name)
        column = (slice(None),) + (None,) * (old.ndim - 1)
        np.testing.assert_allclose(
            from_unit(new, new_low[column], new_high[column]), from_unit(old, low[column], high[column]), rtol=1e-6
        )
    for name in SPREAD_FIELDS:
        np.testing.assert_allclose(getattr(moved, name) * (new_high - new_low), getattr(state, name) * (high - low))
    for name in UNIT_FREE_FIELDS:
        assert np.array_equal(getattr(moved, name), getattr(state, name)), name


def test_an_unchanged_range_leaves_the_state_bit_for_bit() -> None:
    state = _state()
    low, high = np.array([10.0, 0.0, 5.0]), np.array([70.0, 1.0, 6.0])
    moved = rescale_state(state, low, high, low.copy(), high.copy())
    for f in fields(ControllerState):
        assert np.array_equal(getattr(moved, f.name), getattr(state, f.name)), f.name


def test_a_service_whose_range_stays_keeps_an_imputed_observation_above_1_whatever_else_moves() -> None:
    """The window's E-step can put a demand above the range's top; clipping it only because another service of the
    batch moved its range would make a service's decisions depend on the batch it was stepped in."""
    state = _state()
    state.observations[0, -1] = np.float32(1.03)
    low, high = np.array([10.0, 0.0, 5.0]), np.array([70.0, 1.0, 6.0])
    new_high = high.copy()
    new_high[1] = 2.0  # only service 1's range grows
    moved = rescale_state(state, low, high, low.copy(), new_high)
    alone = rescale_state(state.take(slice(0, 1)), low[:1], high[:1], low[:1].copy(), high[:1].copy())
    assert moved.observations[0, -1] == np.float32(1.03)
    for f in fields(ControllerState):
        assert np.array_equal(getattr(moved, f.name)[0], getattr(alone, f.name)[0]), f.name
    assert moved.observations[1].max() <= 1.0 and not np.array_equal(moved.observations[1], state.observations[1])


def test_a_range_is_outgrown_after_a_run_of_short_ticks_ending_at_its_top() -> None:
    action = np.array([1.0, 1.0, 0.97, 1.0])
    censored = np.array([True, True, True, False])
    streak = np.array([3, 2, 9, 0])
    assert outgrown(action, censored, streak, after=3).tolist() == [True, False, False, False]
    assert grown_high(np.array([10.0]), np.array([70.0]), 2.0).tolist() == [130.0]
    with pytest.raises(ValueError):
        grown_high(np.array([0.0]), np.array([1.0]), 1.0)
