"""Smoke tests against the real broker: aiokafka round trips and Faust apps run in-process."""

from __future__ import annotations

import asyncio
import collections

import faust
import orjson
from aiokafka import AIOKafkaProducer

from tests.support.kafka import consume, create_topics, unique, wait_until


def test_produce_consume_keeps_keys_headers_and_per_partition_order(kafka_bootstrap: str) -> None:
    topic = unique("smoke")
    keys = [f"svc-{i}" for i in range(5)]

    async def scenario() -> list:
        await create_topics(kafka_bootstrap, {topic: 3})
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            for seq in range(40):
                key = keys[seq % len(keys)]
                await producer.send(
                    topic,
                    key=key.encode(),
                    value=orjson.dumps({"key": key, "seq": seq}),
                    headers=[("schema", b"1"), ("seq", str(seq).encode())],
                )
            await producer.flush()
        finally:
            await producer.stop()
        return await consume(kafka_bootstrap, topic, 40)

    records = asyncio.run(scenario())
    assert len(records) == 40
    partition_of_key: dict[str, set[int]] = collections.defaultdict(set)
    seqs_of_key: dict[str, list[int]] = collections.defaultdict(list)
    for record in records:
        value = orjson.loads(record.value)
        assert record.key.decode() == value["key"]
        headers = dict(record.headers)
        assert headers["schema"] == b"1" and int(headers["seq"]) == value["seq"]
        partition_of_key[value["key"]].add(record.partition)
        seqs_of_key[value["key"]].append(value["seq"])
    assert all(len(parts) == 1 for parts in partition_of_key.values()), "a key must always land on one partition"
    assert len({p for parts in partition_of_key.values() for p in parts}) > 1, "keys should spread over partitions"
    for key, seqs in seqs_of_key.items():
        assert seqs == sorted(seqs) and len(seqs) == 8, f"order of {key} broken: {seqs}"


def _counting_app(bootstrap: str, guarantee: str) -> tuple[faust.App, str, str]:
    """A Faust app whose agent counts events per key in a changelog-backed table and emits the count."""
    src, dst = unique("src"), unique("dst")
    app = faust.App(
        unique("smoke-app"),
        broker=f"kafka://{bootstrap}",
        store="memory://",
        web_enabled=False,
        topic_partitions=2,
        topic_replication_factor=1,
        processing_guarantee=guarantee,
    )
    source = app.topic(src, value_serializer="json")
    sink = app.topic(dst, value_serializer="json")
    counts = app.Table("counts", default=int, partitions=2)

    @app.agent(source)
    async def count(stream: faust.StreamT) -> None:
        async for event in stream:
            counts[event["service"]] += 1
            await sink.send(
                key=event["service"],
                value={"service": event["service"], "count": counts[event["service"]], "tick": event["tick"]},
            )

    app.finalize()
    return app, src, dst


async def _run_counting_app(bootstrap: str, guarantee: str, events: int) -> tuple[list, dict]:
    app, src, dst = _counting_app(bootstrap, guarantee)
    await create_topics(bootstrap, {src: 2, dst: 2})
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for tick in range(events):
            service = "a" if tick % 3 else "b"
            await producer.send(src, key=service.encode(), value=orjson.dumps({"service": service, "tick": tick}))
        await producer.flush()
    finally:
        await producer.stop()
    table = app.tables["counts"]
    await app.start()
    try:
        expected = {"a": sum(1 for t in range(events) if t % 3), "b": sum(1 for t in range(events) if not t % 3)}
        assert await wait_until(lambda: dict(table) == expected, timeout=60), f"table holds {dict(table)}"
        records = await consume(bootstrap, dst, events)
    finally:
        await app.stop()
    return records, dict(table)


def test_faust_agent_updates_table_and_writes_topic(kafka_bootstrap: str) -> None:
    records, table = asyncio.run(_run_counting_app(kafka_bootstrap, "at_least_once", 12))
    assert table == {"a": 8, "b": 4}
    by_service: dict[str, list[int]] = collections.defaultdict(list)
    for record in records:
        value = orjson.loads(record.value)
        by_service[value["service"]].append(value["count"])
    assert by_service == {"a": list(range(1, 9)), "b": list(range(1, 5))}


def test_exactly_once_output_is_visible_to_read_committed_and_aborts_are_not(kafka_bootstrap: str) -> None:
    records, table = asyncio.run(_run_counting_app(kafka_bootstrap, "exactly_once", 9))
    assert table == {"a": 6, "b": 3}
    assert len(records) == 9
    assert sorted(orjson.loads(r.value)["tick"] for r in records) == list(range(9))

    async def aborted_write_is_hidden() -> tuple[int, int]:
        topic = unique("txn")
        await create_topics(kafka_bootstrap, {topic: 1})
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=unique("txn-producer"))
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(topic, b"committed")
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"aborted")
            await producer.abort_transaction()
            async with producer.transaction():
                await producer.send_and_wait(topic, b"committed-too")
        finally:
            await producer.stop()
        committed = await consume(kafka_bootstrap, topic, 3, timeout=5)
        uncommitted = await consume(kafka_bootstrap, topic, 3, timeout=5, isolation_level="read_uncommitted")
        assert [r.value for r in committed] == [b"committed", b"committed-too"]
        return len(committed), len(uncommitted)

    assert asyncio.run(aborted_write_is_hidden()) == (2, 3)
