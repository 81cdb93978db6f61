"""picrl's Kafka topics: names, partition counts and the retention/compaction each one needs.

| topic              | key          | partitions | kept                                            |
|--------------------|--------------|------------|-------------------------------------------------|
| ``<p>.usage``      | service id   | N          | 7 days (telemetry replays and recovery)          |
| ``<p>.actions``    | service id   | N          | 7 days (schedulers and audits read it)           |
| ``<p>.replay``     | service id   | N          | bounded: 1 day and 256 MiB per partition         |
| ``<p>.policy``     | name@version | 1          | compacted: every version once (lineage, rollback) |
| ``<p>.deadletter`` | service id   | N          | 14 days and 64 MiB per partition                 |

Usage, actions, replay and dead letters share one partition count so that a service's events,
decisions and transitions live on the same partition number (Faust tables need the changelog
partitions to match the source topic's).

Every topic picrl creates, and the worker's table changelog that Faust creates (stream/worker.py), gets
the same replication (:class:`Replication`): by default min(3, brokers) replicas and ``min.insync.replicas``
one less (1 on a single broker). Every producer writes with acks=all, so a record acknowledged is on at
least ``min.insync.replicas`` brokers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, NodeNotReadyError

log = logging.getLogger("picrl.topics")

DAY_MS = 86_400_000
MIB = 1 << 20


@dataclass(frozen=True)
class TopicSpec:
    """One topic: its name, partition count and topic-level configs."""

    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)
    purpose: str = ""


@dataclass(frozen=True)
class TopicNames:
    """The topic names of one deployment (``<prefix>.usage`` ...)."""

    prefix: str = "picrl"

    @property
    def usage(self) -> str:
        return f"{self.prefix}.usage"

    @property
    def actions(self) -> str:
        return f"{self.prefix}.actions"

    @property
    def replay(self) -> str:
        return f"{self.prefix}.replay"

    @property
    def policy(self) -> str:
        return f"{self.prefix}.policy"

    @property
    def deadletter(self) -> str:
        return f"{self.prefix}.deadletter"


class TopicMismatchError(ValueError):
    """An existing topic differs from what picrl needs (e.g. fewer partitions)."""


@dataclass(frozen=True)
class Replication:
    """Replicas per partition (``factor``) and ``min.insync.replicas`` of the topics picrl and Faust create.

    With acks=all a write is acknowledged once ``min_insync`` replicas hold it: with ``min_insync`` >= 2 the loss
    of one broker loses no acknowledged record, and writes go on while ``factor - min_insync`` brokers are down."""

    factor: int = 1
    min_insync: int = 1

    def __post_init__(self) -> None:
        if self.factor < 1 or not 1 <= self.min_insync <= self.factor:
            raise ValueError(
                f"replication needs a factor >= 1 and min.insync.replicas from 1 to the factor; got "
                f"factor {self.factor}, min.insync.replicas {self.min_insync}"
            )

    @classmethod
    def for_brokers(cls, brokers: int, factor: int | None = None, min_insync: int | None = None) -> Replication:
        """``factor`` (default min(3, brokers)) and ``min_insync`` (default factor - 1 where the factor is >= 2,
        else 1)."""
        factor = min(3, max(1, brokers)) if factor is None else factor
        return cls(factor, (factor - 1 if factor >= 2 else 1) if min_insync is None else min_insync)

    @property
    def config(self) -> dict[str, str]:
        """The topic config it sets besides the replication factor."""
        return {"min.insync.replicas": str(self.min_insync)}


async def live_brokers(admin: AIOKafkaAdminClient, tries: int = 5) -> int:
    """How many brokers the cluster has registered and running (DescribeCluster). The admin client sends it to a
    node of its metadata at random; a node killed a moment ago is listed until the controller fences it, and a
    request to it fails at once with ``NodeNotReadyError``: asked again (another node) up to ``tries`` times."""
    for _ in range(tries - 1):
        try:
            return len((await admin.describe_cluster())["brokers"])
        except NodeNotReadyError:
            await asyncio.sleep(0.2)
    return len((await admin.describe_cluster())["brokers"])


async def cluster_brokers(bootstrap: str) -> int:
    """:func:`live_brokers` of the cluster at ``bootstrap``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="picrl-topics")
    await admin.start()
    try:
        return await live_brokers(admin)
    finally:
        await admin.close()


def topic_specs(prefix: str = "picrl", partitions: int = 8) -> list[TopicSpec]:
    """The five topics of a picrl deployment (see the module table)."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1; got {partitions}")
    delete = {"cleanup.policy": "delete"}
    names = TopicNames(prefix)
    return [
        TopicSpec(
            names.usage,
            partitions,
            {**delete, "retention.ms": str(7 * DAY_MS)},
            "per-tick censored usage events, keyed by service",
        ),
        TopicSpec(
            names.actions,
            partitions,
            {**delete, "retention.ms": str(7 * DAY_MS)},
            "provisioning decisions with their breakdown, keyed by service",
        ),
        TopicSpec(
            names.replay,
            partitions,
            {**delete, "retention.ms": str(DAY_MS), "retention.bytes": str(256 * MIB)},
            "transitions for the slow policy trainer (bounded)",
        ),
        TopicSpec(
            names.policy,
            1,
            {
                "cleanup.policy": "compact",
                "min.compaction.lag.ms": "0",
                "segment.ms": str(3_600_000),
                "max.message.bytes": str(8 * MIB),
            },
            "versioned policy weights, compacted per policy name",
        ),
        TopicSpec(
            names.deadletter,
            partitions,
            {**delete, "retention.ms": str(14 * DAY_MS), "retention.bytes": str(64 * MIB)},
            "rejected input with a machine-readable reason",
        ),
    ]


def changelog_spec(name: str, partitions: int) -> TopicSpec:
    """A Faust table's changelog topic as Faust creates it (compacted, a partition per source partition), for the
    worker to create before Faust starts: on a cluster of several brokers a changelog Faust created at start was
    not yet in the metadata its partition assignor read, and that first assignment left it out."""
    return TopicSpec(name, partitions, {"cleanup.policy": "compact"}, "the worker's table changelog (Faust)")


async def ensure_topics(
    bootstrap: str, specs: list[TopicSpec], replication: Replication | None = None
) -> dict[str, str]:
    """Create the missing topics with ``replication`` (default: :meth:`Replication.for_brokers` of the live
    brokers); check existing ones have enough partitions.

    Returns ``{name: "created" | "exists"}``; raises :class:`TopicMismatchError` when an existing topic has
    fewer partitions than its spec (adding partitions would move keys between them), or when missing topics
    would need more replicas than the cluster has brokers. An existing topic with fewer replicas than asked is
    kept as it is, with a warning (adding replicas is a partition reassignment, an operator's decision).
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="picrl-topics")
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing:
            brokers = await live_brokers(admin)
            created = replication or Replication.for_brokers(brokers)
            if created.factor > brokers:
                raise TopicMismatchError(
                    f"cannot create {', '.join(s.name for s in missing)} with replication factor {created.factor}: "
                    f"the cluster has {brokers} live broker(s); lower --replication-factor or start the brokers"
                )
            await admin.create_topics(
                [
                    NewTopic(s.name, s.partitions, created.factor, topic_configs={**created.config, **s.config})
                    for s in missing
                ]
            )
            await _until_led(admin, [s.name for s in missing])
        present = [s for s in specs if s.name in existing]
        if present:
            # a node that has just started may answer before it has caught up with the topics' metadata (no
            # partitions yet): wait for it rather than report a topic of 0 partitions
            described = {t["topic"]: t["partitions"] for t in await _until_led(admin, [s.name for s in present])}
            for spec in present:
                partitions = described.get(spec.name, [])
                if len(partitions) < spec.partitions:
                    raise TopicMismatchError(
                        f"topic {spec.name} exists with {len(partitions)} partition(s) but picrl needs "
                        f"{spec.partitions}; recreate it, or run with --partitions {len(partitions)}"
                    )
                replicas = min((len(p["replicas"]) for p in partitions), default=0)
                if replication is not None and replicas < replication.factor:
                    log.warning(
                        "topic %s exists with %d replica(s) per partition, fewer than the %d asked; it is "
                        "kept so (reassign its partitions to add replicas)",
                        spec.name,
                        replicas,
                        replication.factor,
                    )
    finally:
        await admin.close()
    return {s.name: ("created" if s in missing else "exists") for s in specs}


async def _until_led(admin: AIOKafkaAdminClient, names: list[str], timeout: float = 30.0) -> list[dict[str, Any]]:
    """Wait until the broker's metadata has every topic of ``names`` with a leader for each partition; the topics as
    then described.

    CreateTopics answers once the controller has the topics; a client that asks the broker at once may not see
    them yet (``picrl up``'s closed loop once found no actions topic, a second after they were created). A node
    restarted a moment ago may likewise describe existing topics without their partitions."""
    deadline = time.monotonic() + timeout
    while True:
        described = await admin.describe_topics(names)
        if all(
            t["error_code"] == 0 and t["partitions"] and all(p["leader"] >= 0 for p in t["partitions"])
            for t in described
        ):
            return described
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics {names} still without a leader for every partition after {timeout:.0f} s")
        await asyncio.sleep(0.1)


async def end_offsets(
    bootstrap: str, topic: str, partitions: int, isolation_level: str = "read_uncommitted"
) -> dict[int, int]:
    """The offset the next record of each partition of ``topic`` will get (``{partition: offset}``); with
    ``read_committed``, the last stable offset (an open transaction's first offset, if one is open)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation_level)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    finally:
        await consumer.stop()
    return {tp.partition: offset for tp, offset in ends.items()}


async def committed_offsets(admin: AIOKafkaAdminClient, group: str, topic: str) -> dict[int, int]:
    """The offsets consumer group ``group`` committed on ``topic`` (``{}`` before its first commit)."""
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    except KafkaError:  # the group (or the offsets topic) does not exist yet
        return {}
    return {tp.partition: max(0, meta.offset) for tp, meta in offsets.items() if tp.topic == topic}


async def records_up_to(
    consumer: AIOKafkaConsumer, tp: TopicPartition, start: int, end: int, deadline: float, timeout: float
) -> AsyncIterator[ConsumerRecord]:
    """The records of ``tp``, assigned to ``consumer``, from offset ``start`` until its position reaches ``end`` (the
    last stable offset, under ``read_committed``); ``TimeoutError`` past ``deadline`` (``timeout`` s after the read
    began)."""
    consumer.seek(tp, start)
    while await consumer.position(tp) < end:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{tp.topic}[{tp.partition}] not read to its end ({end}) within {timeout:.0f} s")
        for message in (await consumer.getmany(tp, timeout_ms=500, max_records=10_000)).get(tp, []):
            yield message


async def read_partition(
    bootstrap: str, topic: str, partition: int, timeout: float = 60.0
) -> tuple[dict[bytes, bytes | None], int]:
    """The last committed value of every key of one partition of ``topic`` (None: deleted), read from its start to
    its end (the last stable offset) with ``read_committed``, and that end offset."""
    tp = TopicPartition(topic, partition)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    latest: dict[bytes, bytes | None] = {}
    try:
        consumer.assign([tp])
        start = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        # A position set here, not a reset requested: a reset to the start asked for after the assignment's own
        # reset (to the end, while the offsets above were asked for) left the position at the end, and nothing
        # was read (every row reload came back empty).
        async for message in records_up_to(consumer, tp, start, end, time.monotonic() + timeout, timeout):
            latest[message.key] = message.value
    finally:
        await consumer.stop()
    return latest, end
