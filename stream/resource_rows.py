"""Services provisioned several resources (``picrl_core.resources``): each schema-2 usage record becomes one
controller row per resource, keyed ``<service>/<resource>``, and the rows' outputs are gathered back into one
record per service and tick.

The rows of a record move in lock-step (same ticks, same offsets) and are decided together, learning from
the coupled observations of :func:`couple`: a hard resource that ran short censors every resource of the tick.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from picrl_core.controller_state import ControllerState
from picrl_core.resources import Resource, coupled_flags, impute_served_share, unobserved
from stream.batch import BadValue, BatchOutcome, Incoming, Refusal
from stream.records import Action, ResourceAction, ResourceDecision, ResourceUsageEvent, UsageEvent
from stream.refusals import check_resources


@dataclass(frozen=True)
class ResourcePart(Incoming):
    """One resource's row of a schema-2 usage record (``event`` is that resource's observation, keyed
    ``<service>/<resource>``): the record it came from and the resource's place in the engine's list."""

    origin: Incoming | None = None
    parent: str = ""
    resource: int = 0


def row_keys(service: str, resources: Sequence[Resource]) -> list[str]:
    """The keys of a service's controller rows: the service itself, or ``<service>/<resource>`` for each of
    ``resources``."""
    return [f"{service}/{r.name}" for r in resources] if resources else [service]


def split_records(
    batch: Sequence[Incoming | BadValue], resources: Sequence[Resource]
) -> tuple[list[Incoming | BadValue], list[Refusal]]:
    """Each record of ``batch`` as one part per resource, in resource order, and the records refused as
    they are (:func:`stream.refusals.check_resources`)."""
    names = [r.name for r in resources]
    parts: list[Incoming | BadValue] = []
    refused: list[Refusal] = []
    for item in batch:
        if isinstance(item, BadValue):
            parts += [
                BadValue(key, item.tick, item.partition, item.offset) for key in row_keys(item.service, resources)
            ]
            continue
        refusal = check_resources(item, names)
        if refusal is not None:
            refused.append(refusal)
            continue
        event = item.event
        assert isinstance(event, ResourceUsageEvent)
        for r, (name, key) in enumerate(zip(names, row_keys(event.service, resources))):
            usage = event.resources[name]
            parts.append(
                ResourcePart(
                    UsageEvent(
                        key, event.tick, usage.usage, usage.censored, usage.capacity, event.context, event.produced_at
                    ),
                    item.partition,
                    item.offset,
                    origin=item,
                    parent=event.service,
                    resource=r,
                )
            )
    return parts, refused


def split_rows(
    stored: Mapping[str, bytes | None], resources: Sequence[Resource], width: int
) -> dict[str, bytes | None]:
    """The services' stored rows (``width`` bytes per resource, in resource order) keyed by resource row."""
    split: dict[str, bytes | None] = {}
    for service, raw in stored.items():
        if raw is not None and len(raw) != width * len(resources):
            raise ValueError(f"stored state has {len(raw)} bytes, this model's rows have {width * len(resources)}")
        for r, key in enumerate(row_keys(service, resources)):
            split[key] = None if raw is None else raw[r * width : (r + 1) * width]
    return split


def gather(inner: BatchOutcome, refused: list[Refusal], resources: Sequence[Resource]) -> BatchOutcome:
    """One output per service and tick from the resources' rows: the table row (the rows in resource
    order), one :class:`ResourceAction`, each refusal once; transitions and range changes stay per row."""
    names = [r.name for r in resources]
    outcome = BatchOutcome(
        transitions=inner.transitions,
        ranges=inner.ranges,
        redelivered=inner.redelivered // len(names),
        missed={key.rpartition("/")[0]: ticks for key, ticks in inner.missed.items()},
    )
    for service in dict.fromkeys(key.rpartition("/")[0] for key in inner.rows):
        keys = row_keys(service, resources)
        if all(key in inner.rows for key in keys):
            outcome.rows[service] = b"".join(inner.rows[key] for key in keys)
    seen: set[int] = set()
    outcome.refused = refused
    for refusal in inner.refused:
        origin = refusal.incoming.origin if isinstance(refusal.incoming, ResourcePart) else refusal.incoming
        assert origin is not None
        if id(origin) not in seen:
            seen.add(id(origin))
            outcome.refused.append(
                Refusal(
                    origin,
                    refusal.reason,
                    refusal.detail.replace(f"{refusal.incoming.service!r}", f"{origin.service!r}"),
                )
            )
    grouped: dict[tuple[str, int], dict[str, Action]] = {}
    for action in inner.actions:
        assert isinstance(action, Action)  # each row is one resource's: its engine decides single-resource actions
        service, _, name = action.service.rpartition("/")
        grouped.setdefault((service, action.tick), {})[name] = action
    for (service, tick), parts in grouped.items():
        first = next(iter(parts.values()))
        outcome.actions.append(
            ResourceAction(
                service,
                tick,
                {
                    name: ResourceDecision(
                        a.capacity,
                        a.capacity_norm,
                        a.mu,
                        a.sigma,
                        a.k,
                        a.eta,
                        a.margin,
                        a.bias,
                        a.censor_streak,
                        a.k_sigma,
                        a.clipped,
                        a.escape,
                    )
                    for name, a in sorted(parts.items(), key=lambda kv: names.index(kv[0]))
                },
                first.policy_version,
                first.advisory,
                first.decided_at,
                first.source_produced_at,
                first.phase,
            )
        )
    return outcome


def couple(
    items: list[Incoming],
    state: ControllerState,
    y: np.ndarray,
    own: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    resources: Sequence[Resource],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The observations and flags a service's resources learn from (``picrl_core.resources``): a hard
    resource that ran short censors every resource of the tick (:func:`coupled_flags`), and behind it each
    soft observation is lifted by the served share the forecast expects (:func:`impute_served_share`); and
    which rows went unobserved (a hard shortage that killed the pod, :func:`unobserved`)."""
    column: dict[str, int] = {}
    groups = np.empty((len(resources), len(items) // len(resources)), dtype=np.int64)
    for j, item in enumerate(items):
        assert isinstance(item, ResourcePart)  # the rows of one record move together: all are here
        groups[item.resource, column.setdefault(item.parent, len(column))] = j
    flags = coupled_flags(own[groups], resources)
    missing = np.zeros(y.shape, dtype=bool)
    missing[groups] = unobserved(y[groups], flags, state.action[groups], resources)
    lifted, censored = impute_served_share(
        y[groups],
        flags,
        state.action[groups],
        state.mu[groups],
        state.sigma[groups],
        resources,
        ranges=(low[groups], high[groups]),
    )
    y, own = y.copy(), own.copy()
    y[groups], own[groups] = lifted, censored
    return y, own, missing
