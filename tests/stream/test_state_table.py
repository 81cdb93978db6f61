"""The worker's service-state table against a real broker: rows read in bulk from the changelog, and the changelog
records Faust's recovery hands over afterwards."""

from __future__ import annotations

import asyncio
import uuid
from typing import cast

import faust
from aiokafka import AIOKafkaProducer
from faust.types import TP, Message

from stream.state_table import ServiceStateTable
from stream.transport import WorkerApp
from tests.support.kafka import create_topics


def _record(app: faust.App, topic: str, partition: int, offset: int, key: bytes, value: bytes) -> faust.Event:
    """A changelog record as Faust's recovery loop hands it to the table."""
    message = Message(topic, partition, offset, 0.0, 0, {}, key, value, None)
    return faust.Event(app, key, value, {}, message)


def test_records_older_than_the_rows_read_in_bulk_are_not_applied(kafka_bootstrap: str) -> None:
    """After a rebalance, Faust can apply a partition's standby records, fetched before it, once the partition has
    become active and its rows have been read in bulk: they would set those rows back (a service decided from a
    state that misses ticks, its watermark unchanged). The table applies only records past the offset its rows
    were read to, for a partition active here, and every record of the others (standbys)."""
    app = WorkerApp(
        f"state-{uuid.uuid4().hex[:8]}", broker=f"kafka://{kafka_bootstrap}", store="memory://", Table=ServiceStateTable
    )
    table = cast(ServiceStateTable, app.Table("service-state", key_type=bytes, value_type=bytes, partitions=2))
    topic = table.changelog_topic.get_topic_name()
    table.bootstrap = kafka_bootstrap

    async def run() -> None:
        await create_topics(kafka_bootstrap, {topic: 2})
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=topic)
        await producer.start()
        try:
            async with producer.transaction():  # offsets 0-2, then the commit marker
                for key, value in [(b"a", b"1"), (b"a", b"2"), (b"b", b"1")]:
                    await producer.send(topic, value, key=key, partition=0)
        finally:
            await producer.stop()
        table._actives = {TP(topic, 0)}  # as on_rebalance leaves it: partition 0 active here, 1 a standby
        assert await table.reload(0) == 4
        assert table.persisted_offset(TP(topic, 0)) == 3 and table.persisted_offset(TP(topic, 1)) is None

    asyncio.run(run())
    assert table.row(b"a") == b"2"
    table.apply_changelog_batch(
        [
            _record(app, topic, 0, 0, b"a", b"1"),  # older than the rows: a standby's record, applied late
            _record(app, topic, 0, 5, b"b", b"3"),  # written after the bulk read
            _record(app, topic, 1, 0, b"c", b"1"),  # a standby partition's
        ]
    )
    assert (table.row(b"a"), table.row(b"b"), table.row(b"c")) == (b"2", b"3", b"1")
