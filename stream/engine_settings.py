"""How a worker's decision engine treats its services: scaling, warm-up, bounds, range rules and the operator's
per-service overrides (``picrl worker`` builds them from its settings, ``picrl.settings``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np

from picrl_core.resources import Resource, check_resources

Scaling = Literal["window", "artifact"]


@dataclass(frozen=True)
class ServiceOverride:
    """An operator's bounds on one service's capacity (native unit), or a frozen capacity."""

    min_capacity: float | None = None
    max_capacity: float | None = None
    freeze: float | None = None  # hold exactly this capacity; PIC-RL keeps learning but does not act
    low: float | None = None  # the service's range [low, high], set by the operator (it never grows)
    high: float | None = None

    def __post_init__(self) -> None:
        values = [v for v in (self.min_capacity, self.max_capacity, self.freeze, self.low, self.high) if v is not None]
        if any(not np.isfinite(v) or v < 0 for v in values):
            raise ValueError("override capacities must be finite and >= 0")
        if self.min_capacity is not None and self.max_capacity is not None and self.min_capacity > self.max_capacity:
            raise ValueError(f"min_capacity {self.min_capacity} > max_capacity {self.max_capacity}")
        if (self.low is None) != (self.high is None) or (
            self.low is not None and self.high is not None and self.low >= self.high
        ):
            raise ValueError(f"a range needs both low and high with low < high; got [{self.low}, {self.high}]")

    def apply(self, capacity: float) -> float:
        if self.freeze is not None:
            return self.freeze
        low = -np.inf if self.min_capacity is None else self.min_capacity
        high = np.inf if self.max_capacity is None else self.max_capacity
        return float(min(max(capacity, low), high))


@dataclass(frozen=True)
class EngineSettings:
    """How the worker scales services and treats their first ticks."""

    scaling: Scaling = "window"  # per-service range from the first window, or the artifact's range for all
    headroom: float = 0.5  # "window" scaling: range widened by this many spans on each side
    warmup_bump: float = 0.5  # warm-up: capacity raised by this fraction after a shortage
    max_tick_gap: int = 1_000  # a tick further ahead or behind than this is refused (lost clock, bad producer)
    max_services: int | None = None  # new services beyond this many are refused (None: no cap)
    advisory: bool = False  # label actions advisory (recommend mode)
    overrides: Mapping[str, ServiceOverride] = field(default_factory=dict)  # per service id
    range_growth: float = 2.0  # an outgrown range grows to this many times its span (1: ranges never grow)
    grow_after: int = 3  # short ticks in a row, the last at the top of the range, before it grows
    shrink_after: int = 3  # ticks in a row seen below the floor before it comes down (0: floors never come down)
    floor_share: float = 0.5  # a floor comes down to this share of the usage of that tick
    # several resources per service (picrl_core.resources): usage records carry a ``resources`` map (schema 2) and
    # each resource is a row ``<service>/<resource>`` (the key of its overrides and of its replay transitions)
    resources: tuple[Resource, ...] = ()
    method: str | None = None  # the method the model must serve (picrl_core.deployable); None: whichever it serves

    def __post_init__(self) -> None:
        if self.resources:
            check_resources(self.resources)
        if self.scaling not in get_args(Scaling):
            raise ValueError(f"scaling must be one of {get_args(Scaling)}; got {self.scaling!r}")
        if self.headroom < 0 or self.warmup_bump < 0 or self.max_tick_gap < 1:
            raise ValueError("headroom and warmup_bump must be >= 0 and max_tick_gap >= 1")
        if self.range_growth < 1 or self.grow_after < 1:
            raise ValueError("range_growth must be >= 1 (1: never) and grow_after >= 1")
        if self.shrink_after < 0 or not 0 <= self.floor_share <= 1:
            raise ValueError("shrink_after must be >= 0 (0: never) and floor_share in [0, 1]")
        if self.max_services is not None and self.max_services < 1:
            raise ValueError("max_services must be >= 1 (or None for no cap)")
