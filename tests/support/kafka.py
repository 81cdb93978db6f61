"""Small aiokafka helpers shared by the integration tests (real broker only)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from stream.topics import committed_offsets, end_offsets
from tests.support.processes import Started, tail


def unique(prefix: str) -> str:
    """A topic or app name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def create_topics(bootstrap: str, partitions: dict[str, int]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, n, 1) for name, n in partitions.items()])
    finally:
        await admin.close()


async def consume(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    timeout: float = 60.0,
    isolation_level: str = "read_committed",
    **kwargs: Any,
) -> list[ConsumerRecord]:
    """Read ``count`` records of ``topic`` from the beginning (fewer if ``timeout`` runs out)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level=isolation_level,
        **kwargs,
    )
    await consumer.start()
    records: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    try:
        while len(records) < count and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for messages in batch.values():
                records.extend(messages)
    finally:
        await consumer.stop()
    return records


async def wait_until(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(interval)
    return predicate()


def produce(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    """Send ``(key, value)`` messages to ``topic`` and wait until all are acknowledged (the idempotent
    producer keeps each partition's order)."""

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            await asyncio.gather(*[await producer.send(topic, value, key=key) for key, value in messages])
        finally:
            await producer.stop()

    asyncio.run(send())


def usage_json(
    service: str, tick: int, usage: object, capacity: float, censored: bool = False, **changes: object
) -> bytes:
    """A usage record as a producer would write it (``changes`` override or add fields, e.g. ``schema``)."""
    obj = {
        "schema": 1,
        "type": "usage",
        "service": service,
        "tick": tick,
        "usage": usage,
        "censored": censored,
        "capacity": capacity,
        **changes,
    }
    return json.dumps(obj).encode()


def committed_everything(
    bootstrap: str,
    group: str,
    topic: str,
    partitions: int,
    worker: Started,
    log: Path,
    stall_after: float = 60.0,
) -> None:
    """Wait until ``group`` has committed every record of ``topic``; fail (naming the partitions behind) when
    no offset moves for ``stall_after`` seconds or the worker dies."""

    async def wait() -> None:
        end = await end_offsets(bootstrap, topic, partitions)
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            last, moved = None, time.monotonic()
            while True:
                assert worker.poll() is None, tail(log)
                committed = await committed_offsets(admin, group, topic)
                if all(committed.get(p, 0) >= offset for p, offset in end.items()):
                    return
                if committed != last:
                    last, moved = committed, time.monotonic()
                assert time.monotonic() - moved < stall_after, f"no commit for {stall_after:.0f} s; behind: " + str(
                    {p: f"{committed.get(p, 0)}/{offset}" for p, offset in end.items() if committed.get(p, 0) < offset}
                )
                await asyncio.sleep(0.5)
        finally:
            await admin.close()

    asyncio.run(wait())
