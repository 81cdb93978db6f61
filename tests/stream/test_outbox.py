"""A decision batch's records join the record batch still waiting for aiokafka's sender instead of waiting for
it to be taken (issue 17: that wait held every partition's sends and the next commit)."""

from __future__ import annotations

import asyncio
from contextlib import nullcontext

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

import stream.outbox as outbox_module
from stream.outbox import Outbox, _join_waiting, send_outbox
from tests.support.kafka import unique


def _records(n: int, size: int = 8) -> list[tuple[bytes, bytes]]:
    return [(b"key", b"%0*d" % (size, i)) for i in range(n)]


def test_records_join_the_waiting_batch_in_order_and_what_does_not_fit_is_left() -> None:
    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", max_batch_size=2_000)  # never started
        waiting = producer.create_batch()
        waiting.append(key=b"key", value=b"first", timestamp=None)
        producer._message_accumulator._append_batch(waiting, TopicPartition("actions", 3))

        assert _join_waiting(producer, "actions", 2, _records(2)) == (None, _records(2))  # nothing waits there

        delivery, left = _join_waiting(producer, "actions", 3, _records(5))
        assert delivery is not None and not delivery.done() and left == []
        assert waiting.record_count() == 6

        delivery, left = _join_waiting(producer, "actions", 3, _records(100, size=100))
        assert delivery is not None and 0 < len(left) < 100
        assert left == _records(100, size=100)[100 - len(left) :]  # the first ones joined, the rest keep their order
        delivery.cancel()

        # once full, a batch is closed, as is one the sender built and put back for a retry: it takes nothing
        waiting._build()
        assert _join_waiting(producer, "actions", 3, _records(2)) == (None, _records(2))

    asyncio.run(run())


def test_consecutive_outboxes_reach_their_partition_complete_and_in_order(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = unique("outbox")
    sent = [[(b"key", f"{batch}-{i}".encode()) for i in range(50)] for batch in range(6)]
    joined: list[int] = []

    def counting(*args):  # type: ignore[no-untyped-def]
        delivery, left = _join_waiting(*args)
        joined.append(len(args[3]) - len(left) if delivery is not None else 0)
        return delivery, left

    monkeypatch.setattr(outbox_module, "_join_waiting", counting)

    async def run() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            deliveries = []
            for records in sent:  # back to back: each finds the previous one still waiting for the sender
                outbox = Outbox()
                for key, value in records:
                    outbox.add(0, topic, 0, key, value)
                deliveries += await send_outbox(outbox, lambda source: (producer, nullcontext()))
            await asyncio.gather(*deliveries)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            values: list[bytes] = []
            while len(values) < 300:
                for messages in (await consumer.getmany(timeout_ms=1_000)).values():
                    values += [m.value for m in messages]
            return values
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == [value for records in sent for _, value in records]
    assert joined[0] == 0 and sum(joined) > 0  # later outboxes joined a batch still waiting for the sender
