"""From raw usage messages to decoded events and dead letters; nothing a message holds can raise past here.

The worker hands every consumed message to :func:`decode_batch`; what does not decode becomes a
dead letter with the decoder's reason, what the engine refuses (or cannot process) becomes one with
the engine's reason. Every message ends up in exactly one of the two lists; a dead letter whose
service and tick are valid (refused for its value) also goes to the engine as a :class:`BadValue`,
which answers the tick with a hold.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stream.decisions import BadValue, BatchOutcome, DecisionEngine, Incoming
from stream.records import DeadLetter, DecodeError, decode_usage, usage_identity

log = logging.getLogger("picrl.worker")

INTERNAL_ERROR = "internal_error"  # the engine failed on this event alone (a bug): it is set aside, not retried


@dataclass(frozen=True)
class Raw:
    """One consumed message as the worker received it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True)
class Letter:
    """A dead letter and where to send it (the source partition, so it joins that transaction)."""

    partition: int
    key: bytes
    record: DeadLetter
    service: str | None = None  # known when the message decoded (refused by the engine)
    tick: int | None = None


def decode_batch(messages: Sequence[Raw], now: float) -> tuple[list[Incoming | BadValue], list[Letter]]:
    """The engine's input in arrival order (decoded usage events, and the service and tick of records
    refused for their values) and the dead letters of the messages that are not valid usage records."""
    incoming: list[Incoming | BadValue] = []
    letters = []
    for m in messages:
        try:
            incoming.append(Incoming(decode_usage(m.value), m.partition, m.offset))
        except DecodeError as exc:
            raw = bytes(m.value) if isinstance(m.value, (bytes, bytearray, memoryview)) else b""
            identity = usage_identity(raw)
            service, tick = identity if identity is not None else (None, None)
            letters.append(
                Letter(
                    m.partition,
                    m.key or b"",
                    DeadLetter(exc.reason, exc.detail, m.topic, m.partition, m.offset, raw, now),
                    service,
                    tick,
                )
            )
            if identity is not None:
                incoming.append(BadValue(*identity, m.partition, m.offset))
    return incoming, letters


def _letter(item: Incoming, topic: str, reason: str, detail: str, now: float) -> Letter:
    return Letter(
        item.partition,
        item.event.service.encode(),
        DeadLetter(reason, detail, topic, item.partition, item.offset, item.event.to_bytes(), now),
        item.event.service,
        item.event.tick,
    )


def decide(
    engine: DecisionEngine,
    incoming: list[Incoming | BadValue],
    stored: Mapping[str, bytes | None],
    services_held: int,
    topic: str,
    now: float,
) -> tuple[BatchOutcome, list[Letter]]:
    """``engine.process`` on the batch, with refusals as dead letters. Should the engine fail on the
    batch, each event is retried alone and only the ones that still fail are set aside (``internal_error``)."""
    try:
        outcome = engine.process(incoming, stored, services_held)
        return outcome, [_letter(r.incoming, topic, r.reason, r.detail, now) for r in outcome.refused]
    except Exception:
        log.exception("the engine failed on a batch of %d events; retrying them one by one", len(incoming))
    merged, letters, rows = BatchOutcome(), [], dict(stored)
    for item in incoming:
        try:
            one = engine.process([item], {item.service: rows.get(item.service)}, services_held)
        except Exception as exc:
            log.exception("event %s@%d set aside", item.service, item.offset)
            if isinstance(item, Incoming):  # a BadValue is a dead letter already
                letters.append(_letter(item, topic, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}", now))
            continue
        rows.update(one.rows)
        merged.rows.update(one.rows)
        merged.actions += one.actions
        merged.transitions += one.transitions
        merged.redelivered += one.redelivered
        merged.ranges += one.ranges
        merged.missed.update(one.missed)
        letters += [_letter(r.incoming, topic, r.reason, r.detail, now) for r in one.refused]
    return merged, letters
