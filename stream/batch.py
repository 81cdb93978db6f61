"""What a batch brings to the decision engine (decoded usage events) and what it gets back.

:class:`stream.decisions.DecisionEngine` takes a batch of :class:`Incoming` events (and :class:`BadValue`
stand-ins for records the decoder refused for their values) and answers with one :class:`BatchOutcome`:
the services' new rows, the records to send, and what it refused or moved (:class:`Refusal`,
:class:`RangeChange`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from stream.records import Action, ResourceAction, ResourceUsageEvent, TransitionRecord, UsageEvent

# Why the worker refuses a well-formed event (on top of the decoder's reasons in stream.records).
RefusalReason = Literal[
    "duplicate_tick",
    "tick_out_of_range",
    "missing_context",
    "service_limit",
    "unknown_resource",
    "missing_resource",
    "resource_id_too_long",
]
REFUSAL_REASONS: frozenset[str] = frozenset(get_args(RefusalReason))


@dataclass(frozen=True)
class Incoming:
    """A decoded usage event (one resource, or several: a schema-2 record) and where it came from."""

    event: UsageEvent | ResourceUsageEvent
    partition: int
    offset: int

    @property
    def service(self) -> str:
        return self.event.service


@dataclass(frozen=True)
class BadValue:
    """A usage record refused for its values (already a dead letter) whose service and tick are valid."""

    service: str
    tick: int
    partition: int
    offset: int


@dataclass(frozen=True)
class Refusal:
    incoming: Incoming
    reason: RefusalReason
    detail: str


# Why a range moved: its top outgrown, its floor underused (usage below it), the operator's range set.
RangeReason = Literal["outgrown", "underused", "operator"]


@dataclass(frozen=True)
class RangeChange:
    """A service's range moved from ``[low, high]`` to ``[new_low, new_high]`` at ``tick``."""

    service: str
    tick: int
    reason: RangeReason
    low: float
    high: float
    new_low: float
    new_high: float


@dataclass
class BatchOutcome:
    """What one batch produced: updated rows per service, records to send, events refused."""

    rows: dict[str, bytes] = field(default_factory=dict)
    actions: list[Action | ResourceAction] = field(default_factory=list)
    transitions: list[TransitionRecord] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    redelivered: int = 0  # events already applied (at-least-once redelivery), skipped silently
    ranges: list[RangeChange] = field(default_factory=list)
    missed: dict[str, tuple[int, int]] = field(default_factory=dict)  # service: (tick expected, tick applied)
