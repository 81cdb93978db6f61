"""Min-max scaling between a service's native unit and the controller's ``[0, 1]`` (Sec. 4.1.1).

The paper scales each series with the minimum and maximum of its training part and clips to
``[0, 1]``; actions live in ``[0, 1]`` too. These vectorised forms take one ``(low, high)`` per
service, so a stream worker can scale a batch of services with different ranges at once.

A range fixed from a service's first ticks caps its capacity at ``high``: a service that outgrows it
is short on every tick with the capacity pinned at the top, and what it reveals (``y = a``) never
says by how much. :func:`outgrown` detects that and :func:`grown_high` widens the range;
:func:`rescale_state` carries a controller state over to a new range.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from picrl_core.controller import ControllerState

# A range narrower than this fraction of its magnitude (or than 1e-9 absolute) is widened to it.
_MIN_RELATIVE_SPAN = 1e-3


def to_unit(x: np.ndarray, low: np.ndarray | float, high: np.ndarray | float) -> np.ndarray:
    """``clip((x - low) / (high - low), 0, 1)``."""
    return np.clip((np.asarray(x, dtype=np.float64) - low) / (np.asarray(high) - low), 0.0, 1.0)


def from_unit(a: np.ndarray, low: np.ndarray | float, high: np.ndarray | float) -> np.ndarray:
    """The native value of ``a`` in ``[0, 1]``: ``a * (high - low) + low``."""
    return np.asarray(a, dtype=np.float64) * (np.asarray(high) - low) + low


def window_range(values: np.ndarray, headroom: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-service ``(low, high)`` from a first window of native values ``(B, W)``.

    A window is short, so its range is widened by ``headroom`` times its span on each side (never
    below zero: usage is non-negative); a flat window gets a span of 0.1% of its level.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[1] < 1:
        raise ValueError(f"values must have shape (services, steps >= 1); got {values.shape}")
    if headroom < 0:
        raise ValueError(f"headroom must be >= 0; got {headroom}")
    low, high = values.min(axis=1), values.max(axis=1)
    span = np.maximum(high - low, np.maximum(_MIN_RELATIVE_SPAN * np.abs(high), 1e-9))
    return np.maximum(low - headroom * span, 0.0), high + headroom * span


def outgrown(action_in_force: np.ndarray, censored: np.ndarray, censor_streak: np.ndarray, after: int) -> np.ndarray:
    """Services whose range has been outgrown: the tick just observed was short with the capacity in force
    at the top of the range (``action == 1``), and it makes a run of at least ``after`` short ticks."""
    return np.asarray(censored, bool) & (np.asarray(action_in_force) >= 1.0) & (np.asarray(censor_streak) >= after)


def grown_high(low: np.ndarray, high: np.ndarray, factor: float) -> np.ndarray:
    """The top of a range grown upward to ``factor`` times its span (the bottom stays)."""
    if factor <= 1.0:
        raise ValueError(f"a range grows by a factor > 1; got {factor}")
    return np.asarray(low, dtype=np.float64) + factor * (np.asarray(high, dtype=np.float64) - low)


# How each ControllerState field moves with the range: levels are affine in the native unit, spreads
# (standard deviations, calibrator offsets) scale with the span, the rest does not depend on it (the
# features and the policy sample stay as the decision saw them: the replay transition is built from them).
LEVEL_FIELDS = ("observations", "action", "mu", "est_mean", "last_seen")
SPREAD_FIELDS = ("sigma", "margin", "bias", "est_std", "escape")
# estimates may lie outside [0, 1], and the last seen demand is compared with the next one as it comes; a moved range
# clips observations and actions
_UNCLIPPED_LEVELS = ("mu", "est_mean", "last_seen")
UNIT_FREE_FIELDS = ("keys", "tick", "censored", "context", "censor_streak", "over_streak", "eta", "k", "pre",
                    "log_prob", "features", "memory", "temperature", "repeat_share")
# ``memory`` (the incremental predictor's LSTM state) is not rescaled: no affine map carries an LSTM's hidden
# state to other units. Its mu stays anchored on the rescaled newest observation (mu = y_last + head(h)),
# and the state adapts over the next ticks as the LSTM's forget gates let it.


def rescale_state(state: ControllerState, low: np.ndarray, high: np.ndarray, new_low: np.ndarray,
                  new_high: np.ndarray) -> ControllerState:
    """``state`` (per service, in ``[low, high]``) expressed in ``[new_low, new_high]``: the same native
    history, prediction, calibrator offsets and capacity in force. The observations and the action of a service
    whose range moves are clipped to ``[0, 1]`` (the new range may be narrower); a service whose range stays is
    left as it is, bit for bit, whatever else is in the batch (its window may hold an imputed demand above 1,
    ``controller.impute_shortage``)."""
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    new_low, new_high = np.asarray(new_low, np.float64), np.asarray(new_high, np.float64)
    ratio = (high - low) / (new_high - new_low)
    shift = (low - new_low) / (new_high - new_low)
    stays = (low == new_low) & (high == new_high)
    changes = {}
    for name in LEVEL_FIELDS:
        value = getattr(state, name)
        per_service = (slice(None),) + (None,) * (value.ndim - 1)
        moved = value * ratio[per_service] + shift[per_service]
        if name not in _UNCLIPPED_LEVELS:
            moved = np.where(stays[per_service], value, np.clip(moved, 0.0, 1.0))
        changes[name] = moved.astype(value.dtype)
    for name in SPREAD_FIELDS:
        value = getattr(state, name)
        changes[name] = (value * ratio).astype(value.dtype)
    return replace(state, **changes)
