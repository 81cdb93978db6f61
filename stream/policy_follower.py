"""Policy hot-swap: every worker reads the compacted policy topic and acts with the newest accepted version.

The policy topic has one partition and every worker reads all of it (no consumer group): each
worker must see every version, whatever usage partitions it owns. On start the follower reads the
topic to its end before the first decision, so a restarted worker acts with the version it had.

Guardrails (:class:`PolicyGate`): a version is refused, logged and counted when its weights are not
readable safetensors of the configured network or hold NaN/inf, when its KL to its parent exceeds
``max_kl``, or when its validation score is below its parent's (on the same held-out transitions)
by more than ``score_margin``. A rollback (``picrl policy rollback``) is an operator's decision:
only the weight checks apply to it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiokafka import AIOKafkaConsumer, TopicPartition

from picrl_core.config import PicRLConfig
from stream.records import DecodeError, PolicyVersion, decode_policy

if TYPE_CHECKING:  # torch is loaded by the gate, not by `picrl policy list`, which reads versions only
    from picrl_core.policy import PolicyNetwork

log = logging.getLogger("picrl.policy")

_MAX_FETCH = 16 << 20  # policy messages carry weights


@dataclass(frozen=True)
class Review:
    """The gate's answer on one published version: the network when accepted, else why not."""

    version: int
    policy: PolicyNetwork | None
    reason: str  # "accepted", "unreadable_weights", "kl_above_bound", "score_below_parent"
    detail: str = ""


class PolicyGate:
    """Decides whether a published policy version may act."""

    def __init__(self, config: PicRLConfig, name: str, *, max_kl: float = 0.5, score_margin: float = 0.05) -> None:
        if max_kl <= 0 or score_margin < 0:
            raise ValueError("max_kl must be > 0 and score_margin >= 0")
        self.config = config
        self.name = name
        self.max_kl = max_kl
        self.score_margin = score_margin

    def review(self, record: PolicyVersion) -> Review:
        from picrl_core.artifact import ArtifactError, policy_from_bytes

        try:
            policy = policy_from_bytes(record.weights, self.config)
        except ArtifactError as exc:
            return Review(record.version, None, "unreadable_weights", str(exc))
        refusal = guardrail_refusal(record, self.max_kl, self.score_margin)
        if refusal is not None:
            return Review(record.version, None, *refusal)
        return Review(record.version, policy, "accepted")


def guardrail_refusal(record: PolicyVersion, max_kl: float, score_margin: float) -> tuple[str, str] | None:
    """``(reason, detail)`` when the KL or score guardrail refuses ``record``, else None (a rollback is an
    operator's decision: they do not apply to it). The weights are checked by :meth:`PolicyGate.review`."""
    if record.rollback_of is not None:
        return None
    if record.kl_to_parent > max_kl:
        return "kl_above_bound", f"KL to parent {record.kl_to_parent:.4g} > bound {max_kl:g}"
    if record.parent_score is not None and record.validation_score < record.parent_score - score_margin:
        return "score_below_parent", (
            f"validation score {record.validation_score:.4g} < parent's "
            f"{record.parent_score:.4g} - margin {score_margin:g}"
        )
    return None


async def read_policy_versions(bootstrap: str, topic: str, name: str) -> list[PolicyVersion]:
    """Every decodable version of policy ``name`` on ``topic``, in topic order (read to its current end)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        fetch_max_bytes=_MAX_FETCH,
        max_partition_fetch_bytes=_MAX_FETCH,
    )
    await consumer.start()
    versions = []
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        end = (await consumer.end_offsets([partition]))[partition]
        while await consumer.position(partition) < end:
            for message in (await consumer.getmany(partition, timeout_ms=1000)).get(partition, []):
                record = _decode(message.value)
                if record is not None and record.name == name:
                    versions.append(record)
    finally:
        await consumer.stop()
    return versions


def _decode(value: bytes | None) -> PolicyVersion | None:
    try:
        return decode_policy(value)
    except DecodeError as exc:
        log.warning("policy message refused: %s", exc)
        return None


class PolicyFollower:
    """Reads ``topic`` from the beginning and calls ``adopt(policy, version)`` for each accepted version."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        gate: PolicyGate,
        adopt: Callable[[PolicyNetwork, int], None],
        current: int = 0,
        on_refuse: Callable[[str], None] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.gate = gate
        self.adopt = adopt
        self.current = current
        self.ready = asyncio.Event()  # set once the topic has been read to its end
        self.refused: Counter[str] = Counter()
        self.on_refuse = on_refuse

    async def run(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            fetch_max_bytes=_MAX_FETCH,
            max_partition_fetch_bytes=_MAX_FETCH,
        )
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
                    record = _decode(message.value)
                    if record is not None:
                        self.consider(record)
                if not self.ready.is_set() and await consumer.position(partition) >= end:
                    self.ready.set()
        finally:
            await consumer.stop()

    def consider(self, record: PolicyVersion) -> None:
        """Adopt ``record`` if it is ours, newer than the acting version and passes the gate."""
        if record.name != self.gate.name or record.version <= self.current:
            return
        review = self.gate.review(record)
        if review.policy is None:
            self.refused[review.reason] += 1
            if self.on_refuse is not None:
                self.on_refuse(review.reason)
            log.warning(
                "policy %s version %d refused (%s): %s",
                record.name,
                record.version,
                review.reason,
                review.detail,
                extra={"version": record.version, "reason": review.reason},
            )
            return
        self.current = record.version
        self.adopt(review.policy, record.version)
        log.info(
            "acting with policy %s version %d (parent %s, KL %.4g%s)",
            record.name,
            record.version,
            record.parent,
            record.kl_to_parent,
            "" if record.rollback_of is None else f", rollback to version {record.rollback_of}",
            extra={"version": record.version},
        )
