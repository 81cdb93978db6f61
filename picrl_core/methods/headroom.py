"""The rule operators write by hand: the recent maximum plus headroom (VPA-like, without VPA's histogram).

``A_{t+1} = (1 + h) max(Y_{t-W+1}, ..., Y_t)`` in native units, ``Y`` the observed usage (the capacity
itself on a short tick, so a run of shortages raises the capacity by ``1 + h`` per tick). ``W`` is one hour
of ticks (a common default); ``h`` is chosen on the validation split among :data:`HEADROOMS`
(:mod:`picrl_core.methods.selection`). The rule (:mod:`picrl_core.rules.recent_max`, what a worker deploys) keeps
its window in native units, so under the growth protocol it carries over to a grown range exactly.
"""

from __future__ import annotations

import math

from picrl_core.config import PicRLConfig
from picrl_core.methods.base import Method
from picrl_core.methods.deployed import RuleProvisioner
from picrl_core.methods.selection import select_on_validation
from picrl_core.rules.recent_max import RecentMaxRule
from picrl_core.series import PreparedSeries

WINDOW_SECONDS = 3600.0  # W: the last hour of observations
HEADROOMS = (0.02, 0.05, 0.1, 0.2, 0.3)  # candidate h, chosen on validation (h = 0 never leaves a shortage)


class RecentMaxProvisioner(RuleProvisioner):
    """The deployable :class:`~picrl_core.rules.recent_max.RecentMaxRule` for services in ``[low, high]``."""

    def __init__(self, window: int, headroom: float, low: float, high: float) -> None:
        super().__init__(RecentMaxRule(window, headroom), low, high)


def fit_recent_max(series: PreparedSeries, config: PicRLConfig, *, step_seconds: float = 60.0) -> RecentMaxProvisioner:
    """The rule with ``W`` one hour of ticks and ``h`` of lowest validation regret (ties: the smaller)."""
    window = max(1, math.ceil(WINDOW_SECONDS / step_seconds))
    low, high = series.scaler.low, series.scaler.high
    chosen = select_on_validation(
        HEADROOMS, lambda h: RecentMaxProvisioner(window, h, low, high), series, config
    ).chosen
    return RecentMaxProvisioner(window, chosen, low, high)


METHOD = Method(
    "recent-max",
    "Recent max + headroom",
    "The hand-written operator rule: (1 + h) times the maximum of the last hour's usage, h chosen on validation",
    "operator",
    fit_recent_max,
    timed=True,
    deployable=True,
)
