"""The trainer's settings and its place on the replay topic, without torch: ``picrl up`` reads how far the trainer
is behind the closed loop's replay before it stops it (:func:`untrained_transitions`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from picrl_core.noise import service_key
from stream.records import DecodeError, TransitionRecord, decode_transition
from stream.topics import TopicNames, committed_offsets, records_up_to


@dataclass(frozen=True)
class TrainerSettings:
    """The policy trainer's settings (`picrl trainer` builds them from its options)."""

    bootstrap: str
    prefix: str = "picrl"
    policy_name: str = "default"
    group_id: str = "picrl-trainer"
    update_every: int | None = None  # transitions between slow updates (default: the model's N_update)
    holdout_every: int = 10  # every n-th transition (by service and tick) is held out for validation
    holdout_size: int = 2_048
    max_updates: int | None = None  # stop after publishing this many versions (None: run until stopped)
    # a candidate is published only when KL(candidate || published parent), mean over the held-out states, is at
    # least this and its held-out score beats the parent's; 1e-4 is about a 1.4% shift of the action's mean in
    # units of its std (KL = d^2 / 2), where a no-op update measures ~1e-6
    min_kl: float = 1e-4

    def __post_init__(self) -> None:
        if self.holdout_every < 2 or self.holdout_size < 1:
            raise ValueError("holdout_every must be >= 2 and holdout_size >= 1")
        if self.update_every is not None and self.update_every < 1:
            raise ValueError("update_every must be >= 1")
        if self.min_kl < 0:
            raise ValueError("min_kl must be >= 0")


def is_held_out(record: TransitionRecord, every: int) -> bool:
    """Whether a transition is kept for validation (never trains): every ``every``-th by service and tick."""
    return (service_key(record.service) + record.tick) % every == 0


async def untrained_transitions(settings: TrainerSettings, partitions: int, timeout: float = 30.0) -> int:
    """The training transitions (held-out ones not counted) on ``<prefix>.replay`` past the offsets the trainer's
    group committed: those no candidate has been trained on yet. The trainer commits after each candidate, so
    once it has caught up with the replay fewer than ``update_every`` remain. Read to the last stable offset with
    ``read_committed``, as the trainer reads."""
    topic = TopicNames(settings.prefix).replay
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap, client_id="picrl-up")
    await admin.start()
    try:
        committed = await committed_offsets(admin, settings.group_id, topic)
    finally:
        await admin.close()
    # no group: a consumer in the trainer's group would set its own position from the commit, racing the seek
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await consumer.start()
    left = 0
    try:
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(assigned)
        starts = await consumer.beginning_offsets(assigned)
        ends = await consumer.end_offsets(assigned)
        deadline = time.monotonic() + timeout
        for tp in assigned:
            start = max(committed.get(tp.partition, 0), starts[tp])
            async for message in records_up_to(consumer, tp, start, ends[tp], deadline, timeout):
                try:
                    left += not is_held_out(decode_transition(message.value), settings.holdout_every)
                except DecodeError:
                    continue  # the trainer refuses it too
    finally:
        await consumer.stop()
    return left
