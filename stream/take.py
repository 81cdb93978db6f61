"""Batches of the events in hand, taken from the agent's channel: Faust's ``Stream.take_events`` without
holding a lone event, and without Faust's per-event stream iteration.

``stream.take_events(max_, within)`` yields a batch when ``max_`` events are in or when ``within`` seconds
have passed, so below ``max_`` every batch waits the whole ``within``: a lone event waits for company that
is not coming, and at a steady moderate load every event waits up to ``within``. :func:`take_ready` yields a
batch as soon as the events already fetched are in it: when the channel's queue is empty and the batch's last
event was the last its partition had at the consumer's last fetch (its highwater: nothing else in hand or
waiting in the broker), when ``max_`` are in, or after ``within`` seconds (a backlog being read: then a batch
fills up as with ``take_events``). Under load the batches grow by themselves: what arrives while one batch is
decided is the next batch (quixstreams and Kafka Streams batch the same way, by what one fetch returns).

The events are those Faust's conductor delivered to the agent's channel (its topic, decoding, flow control
and rebalances are Faust's), taken off the channel's queue a batch at a time. Faust's stream would instead
hand them over one by one, each with a trip through the event loop (``await sleep(0)``), its processors and
its sensors: a third of the worker's CPU (docs/performance.md). What that iteration does for acknowledgements
is done here per event: an event of a stale consumer generation or read while flow control is off (a
rebalance under way) is dropped unacknowledged, as Faust's stream drops it; every other one is tracked as
unacknowledged with the consumer (so a revocation waits for it) until its batch is handled and the caller
acknowledges it (:func:`acknowledge`; its offset commits then, not before)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from faust.types import EventT, StreamT


async def take_ready(stream: StreamT, max_: int, within: float) -> AsyncGenerator[list[EventT], None]:
    """Yield the agent's events in batches of what is in hand (see the module), at most ``max_`` each;
    ``within`` (seconds) bounds how long the first event of a batch waits for the queue to run dry."""
    s: Any = stream
    queue = s.channel.queue
    app = s.app
    consumer = app.consumer
    acking = app.topics.acks_enabled_for
    track = consumer._unacked_messages.add
    flow = app.flow_control
    loop = asyncio.get_running_loop()

    def caught_up(event: EventT) -> bool:
        """Whether the event is the last one its partition had when the consumer last fetched from it."""
        highwater = consumer.highwater(event.message.tp)
        return highwater is None or event.message.offset + 1 >= highwater

    def admit(event: EventT, events: list[EventT]) -> None:
        """Add ``event`` to ``events`` unless Faust's stream would drop it; track it as Faust's stream does."""
        message = event.message
        if not flow.is_active() or message.generation_id != app.consumer_generation_id:
            return  # fetched before a rebalance: Faust seeks back to the committed offset and delivers it again
        if not message.tracked and acking(message.topic):
            message.tracked = True
            track(message)
        events.append(event)

    await s.maybe_start()
    while not s.should_stop:
        events: list[EventT] = []
        try:
            admit(await queue.get(), events)
            first_at = loop.time()
            while events and len(events) < max_:
                if queue._errors:
                    raise queue._errors.popleft()
                if not queue.empty():
                    admit(queue.get_nowait(), events)
                    continue
                left = within - (loop.time() - first_at)
                if caught_up(events[-1]) or left <= 0:
                    break
                try:
                    admit(await asyncio.wait_for(queue.get(), left), events)
                except TimeoutError:
                    break
        except StopAsyncIteration:  # the channel is closing: the agent stops (as Faust's stream ends its iteration)
            return
        if events:
            yield events


def acknowledge(events: Sequence[EventT]) -> None:
    """Mark a batch's events handled: their offsets commit with the next commit (Faust's ``Stream.ack``
    without its sensors)."""
    for event in events:
        event.ack()


def forget(consumer: Any, events: Sequence[EventT]) -> None:
    """Stop tracking events that will not be handled (fetched before a rebalance that has completed since):
    unacknowledged, so their offsets do not commit, and no longer waited for by the next revocation."""
    for event in events:
        consumer._unacked_messages.discard(event.message)
