"""The picrl stream worker: a Faust app whose usage agent turns censored usage into decisions.

    <prefix>.usage --> usage agent --(DecisionEngine: one controller call per batch)--> <prefix>.actions
                          |  service-state table (changelog-backed, one fixed-size row per service)
                          +--> <prefix>.replay (transitions)     +--> <prefix>.deadletter (refused input)
    <prefix>.policy --> policy follower (every worker reads it all) --> hot-swap of the acting policy

The agent takes the events it has in hand (``stream.take_events``, up to ``batch_max`` within
``batch_within`` seconds) and makes one vectorised controller call per batch. With the
``exactly_once`` guarantee (the default) the outputs of a batch, its table updates and its input
offsets commit in one Kafka transaction per usage partition; Faust routes table writes itself, and
the outputs are sent with the transactional producer of their source partition (Faust would send
them outside any transaction: faust-streaming issue #177).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import faust
from faust.types import EventT

from picrl_core.artifact import ModelArtifact
from picrl_core.policy import PolicyNetwork
from stream.decisions import DecisionEngine, EngineSettings, Incoming
from stream.policy_follower import PolicyFollower, PolicyGate
from stream.records import DeadLetter, DecodeError, decode_usage
from stream.topics import TopicNames

log = logging.getLogger("picrl.worker")

GUARANTEES = ("exactly_once", "at_least_once")


@dataclass(frozen=True)
class WorkerSettings:
    """Where the worker connects and how it batches and commits."""

    bootstrap: str
    prefix: str = "picrl"
    app_id: str = "picrl-worker"
    partitions: int = 8
    guarantee: str = "exactly_once"
    policy_name: str = "default"
    batch_max: int = 1_000
    batch_within: float = 0.005  # seconds to wait for more events before deciding on a batch
    commit_interval: float = 0.1  # seconds between commits (= transactions under exactly_once)
    web_port: int | None = None  # Faust's web server (None: off)
    engine: EngineSettings = field(default_factory=EngineSettings)

    def __post_init__(self) -> None:
        if self.guarantee not in GUARANTEES:
            raise ValueError(f"processing guarantee must be one of {GUARANTEES}; got {self.guarantee!r}")
        if self.batch_max < 1 or self.batch_within < 0 or self.commit_interval <= 0 or self.partitions < 1:
            raise ValueError("batch_max and partitions must be >= 1, batch_within >= 0 and commit_interval > 0")


@dataclass
class WorkerCounters:
    """What the worker has done since it started."""

    events: int = 0
    actions: int = 0
    transitions: int = 0
    redelivered: int = 0
    batches: int = 0
    dead_letters: Counter[str] = field(default_factory=Counter)


class StreamWorker:
    """The Faust app, its table and agent, bound to one :class:`DecisionEngine`."""

    def __init__(self, settings: WorkerSettings, artifact: ModelArtifact) -> None:
        self.settings = settings
        self.topics = TopicNames(settings.prefix)
        self.engine = DecisionEngine(artifact, settings.engine)
        self.counters = WorkerCounters()
        self.follower = PolicyFollower(settings.bootstrap, self.topics.policy,
                                       PolicyGate(artifact.config, settings.policy_name), self._adopt)
        web = {"web_enabled": False} if settings.web_port is None else {"web_port": settings.web_port}
        self.app = faust.App(
            settings.app_id, broker=f"kafka://{settings.bootstrap}", store="memory://",
            processing_guarantee=settings.guarantee, topic_partitions=settings.partitions,
            topic_replication_factor=1, broker_commit_interval=settings.commit_interval,
            producer_max_request_size=8 << 20, **web)
        self.usage = self.app.topic(self.topics.usage, key_type=bytes, value_type=bytes, key_serializer="raw",
                                    value_serializer="raw", partitions=settings.partitions)
        self.states = self.app.Table("service-state", key_type=bytes, value_type=bytes,  # bytes: raw serializer
                                     partitions=settings.partitions, use_partitioner=True)
        self.app.agent(self.usage, name="decide")(self._decide)
        self.app.task(self.follower.run)

    def _adopt(self, policy: PolicyNetwork, version: int) -> None:
        self.engine.set_policy(policy, version)

    async def _decide(self, stream: faust.StreamT) -> None:
        async for events in stream.take_events(self.settings.batch_max, within=self.settings.batch_within):
            await self.follower.ready.wait()
            await self.handle(events)

    async def handle(self, events: Sequence[EventT]) -> None:
        """Decode, decide, store and send one batch of usage events."""
        incoming: list[Incoming] = []
        letters: list[tuple[int, bytes, DeadLetter]] = []
        now = time.time()
        for event in events:
            message = event.message
            try:
                incoming.append(Incoming(decode_usage(message.value), message.partition, message.offset))
            except DecodeError as exc:
                letters.append((message.partition, message.key or b"",
                                DeadLetter(exc.reason, exc.detail, message.topic, message.partition, message.offset,
                                           bytes(message.value or b""), now)))
        partition_of = {item.event.service: item.partition for item in incoming}
        stored = {service: self.states.get(service.encode()) for service in partition_of}
        outcome = self.engine.process(incoming, stored)
        for service, row in outcome.rows.items():
            self.states[service.encode()] = row
        for refusal in outcome.refused:
            item = refusal.incoming
            letters.append((item.partition, item.event.service.encode(),
                            DeadLetter(refusal.reason, refusal.detail, self.topics.usage, item.partition, item.offset,
                                       item.event.to_bytes(), now)))
        sends = [self._send(self.topics.actions, a.service.encode(), a.to_bytes(), partition_of[a.service])
                 for a in outcome.actions]
        sends += [self._send(self.topics.replay, t.service.encode(), t.to_bytes(), partition_of[t.service])
                  for t in outcome.transitions]
        sends += [self._send(self.topics.deadletter, key, letter.to_bytes(), partition)
                  for partition, key, letter in letters]
        await asyncio.gather(*[await send for send in sends])
        counters = self.counters
        counters.batches += 1
        counters.events += len(events)
        counters.actions += len(outcome.actions)
        counters.transitions += len(outcome.transitions)
        counters.redelivered += outcome.redelivered
        counters.dead_letters.update(letter.reason for _, _, letter in letters)
        for _, _, letter in letters:
            log.warning("dead letter (%s) from %s[%d]@%d: %s", letter.reason, letter.topic, letter.partition,
                        letter.offset, letter.detail)

    async def _send(self, topic: str, key: bytes, value: bytes, source_partition: int) -> asyncio.Future:
        """Enqueue one output in the transaction of its source partition (exactly_once) and return
        its delivery future."""
        app = self.app
        transactional_id = None
        if app.in_transaction:
            group = app.assignor.group_for_topic(self.topics.usage)
            transactional_id = f"{app.conf.id}-{group}-{source_partition}"
        return await app.producer.send(topic, key, value, None, None, None, transactional_id=transactional_id)
