"""Each service's native range ``[low, high]``: the controller works in ``[0, 1]`` of it (``picrl_core.scaling``).

The first range comes from the operator (``ServiceOverride.low``/``high``), else from the model artifact
(``scaling="artifact"``) or from the warm-up window widened by ``headroom`` on each side.

Ranges that grow: capacities stay within the service's range, so a service that outgrows it would be short
for ever with the capacity pinned at the top. When a tick is short with the capacity in force at the top of
the range and makes a run of ``grow_after`` short ticks, the range grows upward to ``range_growth`` times its
span (``picrl_core.scaling.next_high``) and the controller state is carried over to it
(the rule's ``rescale``, PIC-RL's :meth:`~picrl_core.controller.PicRLController.rescale`: same native history,
prediction, calibrator offsets and capacity in force, the predictor's memory read again from the rescaled window),
so the next decisions can go above the old top.

Floors that come down: a floor set from busy ticks would hold an idle service's capacity at it. When a tick's usage,
seen in full, lies below the floor and makes a run of ``shrink_after`` such ticks (the row's ``floor_streak``), the
floor comes down to ``floor_share`` times that usage (``picrl_core.scaling.next_low``) and the state is carried over
the same way, so the next decisions can go below the old floor; the top stays, so the day's capacity is still in
range when the demand comes back. The growth protocol of the comparison applies both rules as the worker does
(``picrl_core.methods.growth.run_growth_loop``). An operator's range is carried over at the service's next event
and never moves otherwise. Each change is reported as a :class:`stream.batch.RangeChange`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np

from picrl_core.controller_state import ControllerState
from picrl_core.scaling import floor_streak, next_high, next_low, window_range
from picrl_core.series import MinMaxScaler
from stream.batch import Incoming, RangeChange, RangeReason
from stream.engine_settings import EngineSettings

Rescale = Callable[[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray], Any]  # (state, low, high, new_low, new_high)


class RangeKeeper:
    """Sets, follows and moves the ranges of a batch's services (their rows' ``low``, ``high`` and ``floor_streak``)."""

    def __init__(self, settings: EngineSettings, series: MinMaxScaler | None, rescale: Rescale) -> None:
        if settings.scaling == "artifact" and series is None:
            raise ValueError("scaling 'artifact' needs a model whose artifact records its series range")
        self.settings = settings
        self.series = series  # the model's series range ("artifact" scaling)
        self.rescale = rescale  # how the deployed rule carries a state to a new range

    def first(self, warm_usage: np.ndarray, items: list[Incoming]) -> tuple[np.ndarray, np.ndarray]:
        """The first ranges: the operator's, else the model's (``scaling="artifact"``) or the window's."""
        if self.settings.scaling == "artifact":
            assert self.series is not None
            n = warm_usage.shape[0]
            low, high = np.full(n, self.series.low), np.full(n, self.series.high)
        else:
            low, high = window_range(warm_usage, self.settings.headroom)
        return self._operators(items, low, high)

    def follow_operator(
        self, sub: np.ndarray, state: ControllerState, items: list[Incoming], changes: list[RangeChange]
    ) -> ControllerState:
        """Carry ``state`` (the rows ``sub``) over to the operator's ranges where they differ from the rows'."""
        low, high = self._operators(items, sub["low"], sub["high"])
        return _move(sub, state, low, high, items, np.full(len(items), "operator"), changes, self.rescale)

    def move(
        self,
        sub: np.ndarray,
        before: ControllerState,
        after: ControllerState,
        short: np.ndarray,
        censored: np.ndarray,
        usage: np.ndarray,
        items: list[Incoming],
        changes: list[RangeChange],
    ) -> ControllerState:
        """Grow the ranges the tick just observed (``short``, with ``before.action`` in force) shows outgrown, lower
        the floors its ``usage`` (native; not ``censored``, a coupled shortage included) has stayed below, except
        an operator's, and carry the stepped state ``after`` over to them."""
        settings = self.settings
        low, high = sub["low"].copy(), sub["high"].copy()
        operators = np.array(
            [getattr(settings.overrides.get(item.service), "low", None) is not None for item in items]
        )  # an operator's range stays
        new_high = next_high(
            low,
            high,
            before.action,
            short,
            after.censor_streak,
            after=settings.grow_after,
            factor=settings.range_growth,
            fixed=operators,
        )
        new_low, sub["floor_streak"] = next_low(
            low,
            usage,
            floor_streak(sub["floor_streak"], usage, low, censored),
            after=settings.shrink_after,
            share=settings.floor_share,
            fixed=operators,
        )
        reasons = np.where(new_high != high, "outgrown", "underused")
        return _move(sub, after, new_low, new_high, items, reasons, changes, self.rescale)

    def _operators(self, items: list[Incoming], low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(low, high)`` with the operator's range where one is set."""
        low, high = low.copy(), high.copy()
        for j, item in enumerate(items):
            override = self.settings.overrides.get(item.service)
            if override is not None and override.low is not None:
                low[j], high[j] = override.low, override.high
        return low, high


def _move(
    sub: np.ndarray,
    state: ControllerState,
    new_low: np.ndarray,
    new_high: np.ndarray,
    items: list[Incoming],
    reasons: np.ndarray,
    changes: list[RangeChange],
    rescale: Rescale,
) -> ControllerState:
    """Carry ``state`` over to the new ranges (identical ones are left exactly as they are); ``reasons`` says why
    each service's range moved."""
    low, high = sub["low"].copy(), sub["high"].copy()
    moved = (new_low != low) | (new_high != high)
    if not moved.any():
        return state
    for j in np.flatnonzero(moved):
        changes.append(
            RangeChange(
                items[j].service,
                int(items[j].event.tick),
                cast(RangeReason, str(reasons[j])),
                float(low[j]),
                float(high[j]),
                float(new_low[j]),
                float(new_high[j]),
            )
        )
    sub["low"], sub["high"] = new_low, new_high
    return rescale(state, low, high, new_low, new_high)
