"""Policy hot-swap: every worker reads the compacted policy topic and acts with the newest accepted version.

The policy topic has one partition and every worker reads all of it (no consumer group): each
worker must see every version, whatever usage partitions it owns. On start the follower reads the
topic to its end before the first decision, so a restarted worker acts with the version it had.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition

from picrl_core.artifact import ArtifactError, policy_from_bytes
from picrl_core.config import PicRLConfig
from picrl_core.policy import PolicyNetwork
from stream.records import DecodeError, PolicyVersion, decode_policy

log = logging.getLogger("picrl.policy")


@dataclass(frozen=True)
class Review:
    """The gate's answer on one published version: the network when accepted, else why not."""

    version: int
    policy: PolicyNetwork | None
    reason: str


class PolicyGate:
    """Decides whether a published policy version may act (readable, finite weights that fit the network)."""

    def __init__(self, config: PicRLConfig, name: str) -> None:
        self.config = config
        self.name = name

    def review(self, record: PolicyVersion) -> Review:
        try:
            policy = policy_from_bytes(record.weights, self.config)
        except ArtifactError as exc:
            return Review(record.version, None, str(exc))
        return Review(record.version, policy, "accepted")


class PolicyFollower:
    """Reads ``topic`` from the beginning and calls ``adopt(policy, version)`` for each accepted version."""

    def __init__(self, bootstrap: str, topic: str, gate: PolicyGate, adopt: Callable[[PolicyNetwork, int], None],
                 current: int = 0) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.gate = gate
        self.adopt = adopt
        self.current = current
        self.ready = asyncio.Event()  # set once the topic has been read to its end
        self.refused: list[Review] = []

    async def run(self) -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                    isolation_level="read_committed", auto_offset_reset="earliest",
                                    fetch_max_bytes=16 << 20, max_partition_fetch_bytes=16 << 20)
        await consumer.start()
        try:
            partition = TopicPartition(self.topic, 0)
            consumer.assign([partition])
            await consumer.seek_to_beginning(partition)
            end = (await consumer.end_offsets([partition]))[partition]
            if end == 0:
                self.ready.set()
            while True:
                batch = await consumer.getmany(partition, timeout_ms=500)
                for message in batch.get(partition, []):
                    self._consider(message.key, message.value)
                if not self.ready.is_set() and await consumer.position(partition) >= end:
                    self.ready.set()
        finally:
            await consumer.stop()

    def _consider(self, key: bytes | None, value: bytes | None) -> None:
        if key != self.gate.name.encode():
            return
        try:
            record = decode_policy(value)  # type: ignore[arg-type]
        except DecodeError as exc:
            log.warning("policy message refused: %s", exc)
            return
        if record.version <= self.current:  # already acting with it or with a newer one
            return
        review = self.gate.review(record)
        if review.policy is None:
            self.refused.append(review)
            log.warning("policy %s version %d refused: %s", record.name, record.version, review.reason)
            return
        self.current = record.version
        self.adopt(review.policy, record.version)
        log.info("acting with policy %s version %d (parent %s, KL %.4g)", record.name, record.version,
                 record.parent, record.kl_to_parent)
