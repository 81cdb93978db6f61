"""Batches of the events in hand: Faust's ``Stream.take_events`` without holding a lone event.

``stream.take_events(max_, within)`` yields a batch when ``max_`` events are in or when ``within`` seconds
have passed, so below ``max_`` every batch waits the whole ``within``: a lone event waits for company that
is not coming, and at a steady moderate load every event waits up to ``within`` (the worker's p99 latency
had ``batch_within`` in it). :func:`take_ready` yields a batch as soon as the events already fetched are
in it: after an event, when the stream's queue is empty and the event was the last its partition had at the
consumer's last fetch (its highwater: nothing else in hand or waiting in the broker), when ``max_`` are in, or
after ``within`` seconds (a backlog being read: then a batch fills up as with ``take_events``). Under load the
batches grow by themselves: what arrives while one batch is decided is the next batch (quixstreams and
Kafka Streams batch the same way, by what one fetch returns). Everything else is ``take_events``'s: the
events come through the agent's stream (its processors, sensors and flow control), are acknowledged
after the batch is handled, and the stream is consumed passively in the background.
"""
from __future__ import annotations

import asyncio
from asyncio import CancelledError
from collections.abc import AsyncGenerator
from typing import Any

from faust.types import EventT, StreamT
from mode.utils.aiter import aiter
from mode.utils.futures import notify


async def take_ready(stream: StreamT, max_: int, within: float) -> AsyncGenerator[list[EventT], None]:
    """Yield the stream's events in batches of what is in hand (see the module), at most ``max_`` each;
    ``within`` (seconds) bounds how long the first event of a batch waits for the queue to run dry."""
    s: Any = stream  # Faust's Stream internals (as take_events uses them)
    events: list[EventT] = []
    ready = asyncio.Event()
    consumed = asyncio.Event()
    consuming: asyncio.Future | None = None
    queue = s.channel.queue
    consumer = s.app.consumer
    enable_acks = s.enable_acks
    loop = asyncio.get_running_loop()
    first_at: float | None = None

    def caught_up(event: EventT) -> bool:
        """Whether the event is the last one its partition had when the consumer last fetched from it."""
        highwater = consumer.highwater(event.message.tp)
        return highwater is None or event.message.offset + 1 >= highwater

    async def add_to_batch(value: Any) -> Any:
        nonlocal consuming, first_at
        try:
            if consuming is not None:
                try:
                    await consuming
                finally:
                    consuming = None
            event = s.current_event
            if event is None:
                raise RuntimeError("take_ready found current_event is None")
            events.append(event)
            if len(events) == 1:
                first_at = loop.time()
            if len(events) >= max_:
                ready.set()
                consumed.clear()
                await s.wait(consumed)  # never more than max_ in a batch
            elif (queue.empty() and caught_up(event)) or loop.time() - first_at >= within:  # type: ignore[operator]
                ready.set()
        except CancelledError:  # pragma: no cover
            raise
        except Exception as exc:
            s.log.exception("Error adding to take_ready batch: %r", exc)
            await s.crash(exc)
        return value

    s.enable_acks = False  # acknowledged here, after the batch is handled
    s.add_processor(add_to_batch)
    s._enable_passive(aiter(s.channel))
    try:
        while not s.should_stop:
            await s.wait_for_stopped(ready, timeout=within or None)  # events that stop coming wait no longer
            if events:
                consuming = loop.create_future()  # the drainer adds nothing while the batch is handled
                try:
                    yield list(events)
                finally:
                    for event in events:
                        await s.ack(event)
                    events.clear()
                    first_at = None
                    notify(consuming)
                    ready.clear()
                    consumed.set()
            else:
                ready.clear()
    finally:
        s.enable_acks = enable_acks
        s._processors.remove(add_to_batch)
