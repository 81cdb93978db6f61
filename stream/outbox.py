"""One decision batch's output, sent per source partition as one aiokafka record batch per topic partition.

Faust sends every record on its own (``app.producer.send``: a Python call chain, a future and, here, an
acknowledgement awaited per record), and table writes go through its producer buffer, a background task
that sends them one by one. A batch of ``n`` events made ``3n`` such sends (action, transition, state
row): 28% of the worker's CPU, plus a quarter of its time waiting for the deliveries
(docs/performance.md, "Stream worker"). Here the records of a batch are grouped by the usage partition
they come from, then by destination topic partition, appended to aiokafka ``BatchBuilder``\\ s
(``create_batch``) and handed over with ``send_batch``: one call and one future per topic partition.

Each source partition's records go through the producer that commits that partition's offsets: under
``exactly_once`` its transactional producer (``<app id>-<group>-<partition>``, the one Faust's transaction
manager started for it), so the batch's actions, transitions, dead letters, state rows and watermark commit
or abort together with its input offsets (faust-streaming issue #177: Faust itself would send them outside
any transaction). A destination partition is the one Kafka's default partitioner gives the key (murmur2,
as aiokafka's ``send`` without a partition), so every record lands where it did before.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from contextlib import AbstractAsyncContextManager, nullcontext
from functools import lru_cache

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import murmur2
from faust.exceptions import ProducerSendError

log = logging.getLogger("picrl.worker")

Records = list[tuple[bytes, bytes]]  # (key, value)


@lru_cache(maxsize=1 << 18)  # a worker's services come back every tick: 0.1 us instead of murmur2's 3.5 us in Python
def key_partition(key: bytes, partitions: int) -> int:
    """Kafka's default partition of ``key`` among ``partitions`` (aiokafka's ``DefaultPartitioner``)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class Outbox:
    """The records of one batch, by source partition, then by destination (topic, partition)."""

    def __init__(self) -> None:
        self.by_source: defaultdict[int, defaultdict[tuple[str, int], Records]] = defaultdict(lambda: defaultdict(list))
        self.records = 0

    def add(self, source: int, topic: str, partition: int, key: bytes, value: bytes) -> None:
        self.by_source[source][topic, partition].append((key, value))
        self.records += 1


def _consume_failure(future: asyncio.Future) -> None:
    """Retrieve a failed delivery's exception (the transaction's commit reports it; no asyncio warning)."""
    if not future.cancelled() and future.exception() is not None:
        log.debug("a batch delivery failed: %r", future.exception())


def _join_waiting(
    producer: AIOKafkaProducer,
    topic: str,
    partition: int,
    records: Records,
) -> tuple[asyncio.Future | None, Records]:
    """Append what fits of ``records`` to the record batch still waiting for the sender in ``(topic, partition)``,
    if there is one; (its delivery, the records left over).

    aiokafka's ``send_batch`` waits until the topic partition's previous batch has been taken by the sender
    (``MessageAccumulator.add_batch``), and a transactional producer's sender holds a batch back until its
    partition has joined the transaction: right after a commit the broker answers ``ConcurrentTransactions``
    while the previous transaction's markers are written, and the sender retries after a backoff. Under
    the worker's batch lock that wait held every partition's sends and the next commit (the lock waited up to
    495 ms at 1,000 events/s on 8 partitions, docs/performance.md). The waiting batch is not built
    yet, so the records join it, in order, as aiokafka's own ``send`` joins a record to it; nothing awaits."""
    accumulator = producer._message_accumulator
    waiting = accumulator._batches.get(TopicPartition(topic, partition))
    if not waiting or accumulator._exception is not None or accumulator._closed:
        return None, records
    batch = waiting[-1]  # a batch put back for a retry is built already: its builder is closed and takes nothing
    for i, (key, value) in enumerate(records):
        if batch._builder.append(timestamp=None, key=key, value=value, headers=[]) is None:  # full or closed
            return (asyncio.shield(batch.future) if i else None), records[i:]
    return asyncio.shield(batch.future), []


async def send_outbox(outbox: Outbox, producer_for: ProducerFor) -> list[asyncio.Future]:
    """Hand every record of ``outbox`` to the producer of its source partition, one ``send_batch`` per
    destination topic partition (more when a batch fills up; none where the partition's previous batch still
    waits for the sender: the records join it, :func:`_join_waiting`), and return the delivery futures."""
    futures: list[asyncio.Future] = []
    for source, groups in outbox.by_source.items():
        producer, lock = producer_for(source)
        async with lock:
            for (topic, partition), records in groups.items():
                joined, records = _join_waiting(producer, topic, partition, records)
                if joined is not None:
                    futures.append(joined)
                if not records:
                    continue
                batch = producer.create_batch()
                for key, value in records:
                    if batch.append(key=key, value=value, timestamp=None) is None:  # full: send it, start another
                        futures.append(await producer.send_batch(batch, topic, partition=partition))
                        batch = producer.create_batch()
                        batch.append(key=key, value=value, timestamp=None)  # a batch always takes its first record
                futures.append(await producer.send_batch(batch, topic, partition=partition))
    for future in futures:
        future.add_done_callback(_consume_failure)
    return futures


class ProducerFor:
    """The aiokafka producer (and the lock Faust holds around its use) for a source partition's output.

    Under ``exactly_once``: the transactional producer Faust's transaction manager started for that usage
    partition, and Faust's per-transaction lock (its commits take it too). Otherwise Faust's one producer."""

    def __init__(self, app, source_topic: str) -> None:  # app: faust.App (untyped: Faust's driver internals)
        self.app = app
        self.source_topic = source_topic

    def __call__(self, source: int) -> tuple[AIOKafkaProducer, AbstractAsyncContextManager]:
        faust_producer = self.app.producer
        if not self.app.in_transaction:
            return faust_producer._ensure_producer(), nullcontext()
        group = self.app.assignor.group_for_topic(self.source_topic)
        transactional_id = f"{self.app.conf.id}-{group}-{source}"
        producer = faust_producer._transaction_producers.get(transactional_id)
        if producer is None:
            raise ProducerSendError(f"No transaction producer found for : {transactional_id}")
        return producer, faust_producer._trn_locks[transactional_id]
