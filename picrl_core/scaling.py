"""Min-max scaling between a service's native unit and the controller's ``[0, 1]`` (Sec. 4.1.1).

The paper scales each series with the minimum and maximum of its training part and clips to
``[0, 1]``; actions live in ``[0, 1]`` too. These vectorised forms take one ``(low, high)`` per
service, so a stream worker can scale a batch of services with different ranges at once.

A range fixed from a service's first ticks caps its capacity at ``high``: a service that outgrows it
is short on every tick with the capacity pinned at the top, and what it reveals (``y = a``) never
says by how much. :func:`outgrown` detects that and :func:`grown_high` widens the range (:func:`next_high`
is the rule of one tick, as the stream and the growth protocol of the comparison apply it);
:meth:`~picrl_core.controller.PicRLController.rescale` carries a controller state over to a new range.

A floor fixed from a busy history holds the capacity at ``low`` however little the service uses: a service
that idles at night is paid at its day's floor. :func:`next_low` is the rule that brings the floor down, of one
tick too. With ``u_t = min(d_t, A_t)`` the usage seen (native) and ``s_t`` the run of ticks seen in full below the
floor (a per-service counter the worker keeps in its row and the growth loop beside it):

* ``s_t = s_{t-1} + 1`` when ``u_t < L_t`` and the tick was not short, else ``0`` (:func:`floor_streak`);
* ``L_{t+1} = rho u_t`` when ``s_t >= m``, else ``L_t`` (``m = shrink_after``, ``rho = floor_share``), and the
  run restarts (``s_t = 0``) on a lowered floor.

The top stays, so a morning that needs the day's capacity again finds it within the range: the controller
raises its action in ``[0, 1]`` of the wider range, with no range change. ``m = 0``: floors never come down.
"""

from __future__ import annotations

import numpy as np

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


def next_high(
    low: np.ndarray,
    high: np.ndarray,
    action_in_force: np.ndarray,
    short: np.ndarray,
    censor_streak: np.ndarray,
    *,
    after: int,
    factor: float,
    fixed: np.ndarray | None = None,
) -> np.ndarray:
    """The tops of the ranges after a tick: ``low + factor (high - low)`` where the tick shows the range
    :func:`outgrown` (``short`` with ``action_in_force == 1``, the ``after``-th short tick in a row or later),
    ``high`` elsewhere and where ``fixed`` (an operator's range). ``factor`` 1: ranges never grow."""
    high = np.asarray(high, dtype=np.float64)
    if factor <= 1.0:
        return high
    grow = outgrown(action_in_force, short, censor_streak, after)
    if fixed is not None:
        grow &= ~np.asarray(fixed, dtype=bool)
    return np.where(grow, grown_high(low, high, factor), high)


def floor_streak(streak: np.ndarray, usage: np.ndarray, low: np.ndarray, short: np.ndarray) -> np.ndarray:
    """The run of ticks in a row seen in full below the floor: ``streak + 1`` where ``usage < low`` on a tick that
    was not ``short``, else 0."""
    below = (np.asarray(usage, dtype=np.float64) < low) & ~np.asarray(short, dtype=bool)
    return np.where(below, np.asarray(streak) + 1, 0)


def next_low(
    low: np.ndarray,
    usage: np.ndarray,
    streak: np.ndarray,
    *,
    after: int,
    share: float,
    fixed: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The floors after a tick and the runs below them: ``share * usage`` where ``streak`` (:func:`floor_streak`
    of this tick) reaches ``after``, with the run restarted at 0; ``low`` and ``streak`` elsewhere and where
    ``fixed`` (an operator's range). ``after`` 0: floors never come down."""
    low = np.asarray(low, dtype=np.float64)
    streak = np.asarray(streak)
    if after == 0:
        return low, streak
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"a floor comes down to a share in [0, 1] of the usage; got {share}")
    shrink = streak >= after
    if fixed is not None:
        shrink &= ~np.asarray(fixed, dtype=bool)
    return np.where(shrink, share * np.asarray(usage, dtype=np.float64), low), np.where(shrink, 0, streak)
