"""The engine's checks of a well-formed usage event: why it cannot be decided (a :class:`Refusal`, dead-lettered
by the worker), or that it was already applied (an at-least-once redelivery, skipped silently)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from stream.batch import Incoming, Refusal
from stream.records import MAX_ID_LENGTH, ResourceUsageEvent

Redelivered = Literal["redelivered"]


def check_tick(
    row: np.void, item: Incoming, max_tick_gap: int, context_names: Sequence[str]
) -> Refusal | Redelivered | None:
    """Whether ``item`` follows its service's ``row``: the expected tick or a later one within ``max_tick_gap``,
    with every context channel the model reads (None: it does)."""
    event, expected = item.event, int(row["expected_tick"])
    if event.tick < expected and item.offset <= row["last_offset"]:
        return "redelivered"
    if abs(event.tick - expected) > max_tick_gap:
        return Refusal(
            item,
            "tick_out_of_range",
            f"tick {event.tick} of {event.service!r} is more than {max_tick_gap} ticks from the expected {expected}",
        )
    if event.tick < expected:
        return Refusal(
            item,
            "duplicate_tick",
            f"tick {event.tick} of {event.service!r} was already applied; expected tick {expected}",
        )
    missing = context_names and set(context_names) - set(event.context or {})  # extras are ignored
    if missing:
        return Refusal(
            item,
            "missing_context",
            f"context channel(s) {sorted(missing)} absent; the model reads {list(context_names)}",
        )
    return None


def beyond_cap(item: Incoming, max_services: int | None) -> Refusal:
    """A new service the worker has no room for (``EngineSettings.max_services``)."""
    return Refusal(
        item, "service_limit", f"new service {item.event.service!r} beyond the cap of {max_services} services"
    )


def check_resources(item: Incoming, names: list[str]) -> Refusal | None:
    """Why a record cannot be decided as the resources ``names`` (None: it can; the details show ``names`` as a
    list)."""
    event = item.event
    given = list(event.resources) if isinstance(event, ResourceUsageEvent) else []
    if not given:
        return Refusal(
            item,
            "missing_resource",
            f"{event.service!r} sent a single-resource record (schema 1); "
            f"this worker decides {names} per service (schema 2)",
        )
    if set(given) - set(names):
        return Refusal(
            item,
            "unknown_resource",
            f"resource(s) {sorted(set(given) - set(names))} of {event.service!r}: this worker decides {names}",
        )
    if set(names) - set(given):
        return Refusal(
            item,
            "missing_resource",
            f"resource(s) {sorted(set(names) - set(given))} absent from "
            f"{event.service!r}'s record; the model decides {names}",
        )
    if len(event.service) + 1 + max(map(len, names)) > MAX_ID_LENGTH:
        return Refusal(
            item,
            "resource_id_too_long",
            f"{event.service[:40]!r}...: a resource's row id <service>/<resource> must fit {MAX_ID_LENGTH} characters",
        )
    return None
