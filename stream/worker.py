"""The picrl stream worker: a Faust app whose usage agent turns censored usage into decisions.

    <prefix>.usage --> usage agent --(DecisionEngine: one controller call per batch)--> <prefix>.actions
                          |  service-state table (changelog-backed, one fixed-size row per service)
                          +--> <prefix>.replay (transitions)     +--> <prefix>.deadletter (refused input)
    <prefix>.policy --> policy follower (every worker reads it all) --> hot-swap of the acting policy

The agent takes the events it has in hand (:func:`stream.take.take_ready`: what was fetched, up to
``batch_max``; a batch fills for at most ``batch_within`` seconds while a backlog is read, and a lone event is
not held) and makes one vectorised controller call per batch. With the ``exactly_once`` guarantee (the
default) the outputs of a batch, its table updates and its input offsets commit in one Kafka transaction
per usage partition: the batch's actions, transitions, dead letters and changelog rows are encoded in one
pass and handed to the transactional producer of their source partition as one aiokafka record batch per
topic partition (stream/outbox.py; Faust would send outputs outside any transaction: faust-streaming issue
#177), and the commit, not the batch, waits for their delivery. Commits run between batches, never within
one: the agent decides batches while a commit may be under way and queues them (up to ``SEND_AHEAD`` batches'
worth of events) for a sender task that hands each to the producers between commits and acknowledges its events
(under ``at_least_once``, once its records are delivered, while the next batches go on). The worker's
collaborators each hold one concern: the commits clock themselves (stream/commit_clock.py: one starts as soon as
the previous one has ended and something has been acknowledged since, at most one per ``commit_interval``, so a
transaction holds what arrived while the last one committed, small under a light load and large under a heavy
one, and no queue builds up behind a fixed commit rate); the rebalance guard (stream/rebalance_guard.py) keeps
records out until Faust has seeked to the committed offsets (faust-streaming issue #596), holds a partition whose
restored rows fall short of its committed offsets (a watermark row per partition says how far they go) and
rejoins the group for a stalled partition; the observer (stream/observer.py) keeps the metrics and the recent
decisions. Faust's app here (stream/transport.py) restores tables up to the broker's end
offsets (faust-streaming issue #158), starts fresh transactional producers at every rebalance, and makes a
worker whose transaction failed (fenced by another) rejoin its group instead of crashing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import faust
from faust.transport.drivers import aiokafka as driver
from faust.types import EventT
from mode.types.signals import SignalHandlerT

from picrl_core.artifact import ModelArtifact
from picrl_core.policy import PolicyNetwork
from stream.commit_clock import CommitClock
from stream.decisions import BadValue, BatchOutcome, DecisionEngine, EngineSettings, Incoming
from stream.heap import freeze_heap
from stream.intake import Letter, Raw, decide, decode_batch
from stream.membership import GroupLog
from stream.metrics import WorkerMetrics
from stream.observer import BatchObserver
from stream.outbox import Outbox, ProducerFor, key_partition, send_outbox
from stream.policy_follower import PolicyFollower, PolicyGate
from stream.rebalance_guard import RebalanceGuard
from stream.records import encode_all
from stream.state_table import ServiceStateTable
from stream.take import acknowledge, forget, take_ready
from stream.topics import Replication, TopicNames
from stream.transport import TRANSACTION_ERRORS, HoldingConsumer, RawRecords, WorkerApp
from stream.views import Health, add_views, service_view

log = logging.getLogger("picrl.worker")

GUARANTEES = ("exactly_once", "at_least_once")
OUTPUT_BATCH_BYTES = 512 << 10  # record batch size: a decision batch's records for one topic partition in one or a few
FAUST_COMMITS_OFF = 1 << 30  # Faust's own periodic commits (seconds, events): the worker commits between batches
SEND_AHEAD = 8  # the agent waits while this many batch_max's of decided events wait for the sender (a commit runs)
HEARTBEAT = 0.5  # seconds between heartbeats: the others see a worker leave (a rebalance) this soon


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
    commit_interval: float = 0.05  # least seconds from one commit (= transaction under exactly_once) to the next
    session_timeout: float = 6.0  # a worker silent this long (killed, not restarted) loses its partitions
    instance_id: str | None = None  # static group membership (stream.membership); None: a dynamic member
    stall_timeout: float = 30.0  # records waiting on a partition and nothing committed this long: rejoin (0: never)
    web_port: int | None = None  # web server: /metrics, /healthz, /services/<id> (None: off)
    capacity_gauge: int = 0  # export each service's decided capacity on /metrics for up to this many services
    replication: Replication = field(default_factory=Replication)  # of the table changelog Faust creates
    max_policy_kl: float = 0.5  # guardrail: refuse versions further than this from their parent
    policy_score_margin: float = 0.05  # guardrail: refuse versions scoring this much below their parent
    engine: EngineSettings = field(default_factory=EngineSettings)

    def __post_init__(self) -> None:
        if self.guarantee not in GUARANTEES:
            raise ValueError(f"processing guarantee must be one of {GUARANTEES}; got {self.guarantee!r}")
        if self.batch_max < 1 or self.batch_within < 0 or self.commit_interval <= 0 or self.partitions < 1:
            raise ValueError("batch_max and partitions must be >= 1, batch_within >= 0 and commit_interval > 0")
        if self.stall_timeout < 0:
            raise ValueError("stall_timeout must be >= 0 (0: never rejoin for a stalled partition)")
        if not 6.0 <= self.session_timeout <= 300.0:
            raise ValueError("session_timeout must be within the broker's default bounds, 6 to 300 seconds")


@dataclass
class PreparedBatch:
    """A decided batch, its records encoded and waiting to be sent."""

    events: Sequence[EventT]
    incoming: list[Incoming | BadValue]
    outcome: BatchOutcome
    letters: list[Letter]
    outbox: Outbox


class StreamWorker:
    """The Faust app, its table and agent, bound to one :class:`DecisionEngine`."""

    def __init__(self, settings: WorkerSettings, artifact: ModelArtifact) -> None:
        self.settings = settings
        self.topics = TopicNames(settings.prefix)
        self.engine = DecisionEngine(artifact, settings.engine)
        self.observer = BatchObserver(self.usage_partitions, settings.capacity_gauge)
        gate = PolicyGate(
            artifact.config,
            settings.policy_name,
            max_kl=settings.max_policy_kl,
            score_margin=settings.policy_score_margin,
        )
        self.follower = PolicyFollower(
            settings.bootstrap,
            self.topics.policy,
            gate,
            self._adopt,
            on_refuse=lambda reason: self.metrics.policy_refusals.labels(reason).inc(),
        )
        web = {"web_enabled": False} if settings.web_port is None else {"web_port": settings.web_port}
        self.app = WorkerApp(
            settings.app_id,
            broker=f"kafka://{settings.bootstrap}",
            store="memory://",
            processing_guarantee=settings.guarantee,
            topic_partitions=settings.partitions,
            topic_replication_factor=settings.replication.factor,
            topic_disable_leader=True,
            producer_acks="all",
            broker_commit_interval=FAUST_COMMITS_OFF,
            broker_commit_every=FAUST_COMMITS_OFF,
            broker_session_timeout=settings.session_timeout,
            broker_heartbeat_interval=min(HEARTBEAT, settings.session_timeout / 3),
            consumer_group_instance_id=settings.instance_id,
            producer_max_request_size=8 << 20,
            producer_max_batch_size=OUTPUT_BATCH_BYTES,
            Table=ServiceStateTable,
            **web,
        )
        self.usage = self.app.topic(self.topics.usage, schema=RawRecords(), partitions=settings.partitions)
        self.states = cast(
            ServiceStateTable,
            self.app.Table(  # bytes: raw serializer
                "service-state",
                key_type=bytes,
                value_type=bytes,
                partitions=settings.partitions,
                use_partitioner=True,
                extra_topic_configs=settings.replication.config,
            ),
        )
        self.states.bootstrap = settings.bootstrap  # newly active partitions are read in bulk (ServiceStateTable)
        self.app.agent(self.usage, name="decide")(self._decide)
        self._producer_for = ProducerFor(self.app, self.topics.usage)
        self._partitions: dict[str, int] = {}
        self.commits = CommitClock(lambda: self.app.consumer.commit(), settings.commit_interval)
        self._outgoing: asyncio.Queue[PreparedBatch] = asyncio.Queue()  # decided, in order, to be sent
        self._ahead = 0  # events in self._outgoing
        self._room = asyncio.Event()  # set when the sender has taken a batch from self._outgoing
        self._acknowledged: asyncio.Future | None = (
            None  # at_least_once: the last batch's acknowledgement, once delivered
        )
        self.app.task(self.commits.run)
        self.guard = RebalanceGuard(
            self.app,
            self.states,
            self.metrics,
            bootstrap=settings.bootstrap,
            group=settings.app_id,
            usage=self.topics.usage,
            partitions=settings.partitions,
            stall_timeout=settings.stall_timeout,
            assigned=self.usage_partitions,
        )
        self.guard.connect()
        self.app.on_rebalance_complete.connect(cast(SignalHandlerT, freeze_heap))  # cast: see RebalanceGuard.connect
        group_log = GroupLog(settings.app_id, settings.instance_id, self.usage_partitions)
        self.app.on_rebalance_complete.connect(cast(SignalHandlerT, group_log.on_rebalance_complete))
        self.app.task(self._send_decided)
        self.app.task(self.follower.run)
        if settings.web_port is not None:
            add_views(self.app, self)

    @property
    def metrics(self) -> WorkerMetrics:
        """The worker's Prometheus metrics (``GET /metrics``)."""
        return self.observer.metrics

    def usage_partitions(self) -> set[int]:
        """The usage partitions assigned to this worker now."""
        return {tp.partition for tp in self.app.consumer.assignment() if tp.topic == self.topics.usage}

    def health(self) -> Health:
        """``GET /healthz``: ready once the worker follows the policy topic and is assigned partitions."""
        ready = self.follower.ready.is_set() and bool(self.app.consumer.assignment())
        return Health(ready, self.engine.policy_version, self.states.services(), sorted(self.usage_partitions()))

    def explain(self, service: str) -> dict[str, Any] | None:
        """``GET /services/<id>``: the service's row and last decisions (None: this worker does not hold it)."""
        raw = self.states.get(service.encode())
        return None if raw is None else service_view(self.engine, service, raw, self.observer.recent_of(service))

    def _adopt(self, policy: PolicyNetwork, version: int) -> None:
        self.engine.set_policy(policy, version)
        self.metrics.adopted(version)

    async def _decide(self, stream: faust.StreamT) -> None:
        """The agent: decide each batch as it comes and queue it for :meth:`_send_decided`, so that batches keep
        being decided while a commit runs or deliveries are awaited (their ``decided_at`` does not wait)."""
        async for events in take_ready(stream, self.settings.batch_max, self.settings.batch_within):
            await self.follower.ready.wait()
            consumer = cast(HoldingConsumer, self.app.consumer)
            if consumer.failed is not None:  # a failed transaction's events, decided again after a rebalance
                acknowledge(events)  # (and forgotten then: HoldingConsumer.recover)
                continue
            try:
                batch = await self.prepare(events)
            except Exception as exc:  # the output topics' metadata could not be read, or a bug
                if not isinstance(exc, TRANSACTION_ERRORS):
                    log.exception(
                        "preparing a batch of %d events failed; deciding again from the committed offsets", len(events)
                    )
                acknowledge(events)  # forgotten after the rebalance, and the rows this batch set are read again
                consumer.transaction_failed(exc)
                continue
            while self._ahead >= SEND_AHEAD * self.settings.batch_max:
                self._room.clear()
                await self._room.wait()
            self._ahead += len(events)
            self._outgoing.put_nowait(batch)

    async def _send_decided(self) -> None:
        """Send the decided batches in the order they were decided, each between two commits, and acknowledge
        their events (a commit covers acknowledged events only, and a revocation waits for them).

        Under ``exactly_once`` the events are acknowledged once their batch is handed to the producers: the
        commit of the transaction waits for the deliveries and fails with them. Under ``at_least_once`` they
        are acknowledged once the batch is delivered (:meth:`_acknowledge_delivered`), without holding up the
        next batch meanwhile. After a failed send the batches still queued are dropped, and so is a batch of events
        fetched before a rebalance that has completed since (its partitions may be another worker's now): the
        rows they set are read again from the changelog (:meth:`RebalanceGuard.check_restored_state`, their
        watermarks being ahead of the committed offsets) and their events are decided again from the committed
        offsets."""
        consumer = cast(HoldingConsumer, self.app.consumer)
        while True:
            batch = await self._outgoing.get()
            self._ahead -= len(batch.events)
            self._room.set()
            if any(e.message.generation_id != self.app.consumer_generation_id for e in batch.events):
                forget(consumer, batch.events)  # fetched before a rebalance: decided again from the committed offsets
                continue
            deliveries: list[asyncio.Future] = []
            try:
                async with self.commits.batch:  # no commit while the batch is handed to the producers
                    if consumer.failed is None:
                        deliveries = await self.send(batch)
            except TRANSACTION_ERRORS as exc:
                consumer.transaction_failed(exc)
            if self.app.in_transaction:
                acknowledge(batch.events)
                self.commits.handled()
            else:
                self._acknowledged = asyncio.ensure_future(
                    self._acknowledge_delivered(batch.events, deliveries, self._acknowledged)
                )

    async def _acknowledge_delivered(
        self, events: Sequence[EventT], deliveries: list[asyncio.Future], previous: asyncio.Future | None
    ) -> None:
        """``at_least_once``: acknowledge a batch's events once every record it sent is delivered and the batch
        before it is acknowledged (in order: Faust commits past a lone unacknowledged offset at the head of a
        partition). A failed delivery makes the worker rejoin its group first, so nothing commits before the
        events are decided again from the committed offsets."""
        try:
            await asyncio.gather(*deliveries)
        except Exception as exc:
            cast(HoldingConsumer, self.app.consumer).transaction_failed(exc)
        if previous is not None:
            await previous
        acknowledge(events)
        self.commits.handled()

    async def send(self, batch: PreparedBatch) -> list[asyncio.Future]:
        """Hand a prepared batch's records to the producer of each source partition, one record batch per topic
        partition (stream/outbox.py); returns their deliveries. Under ``exactly_once`` the transaction commit
        (between batches) waits for them and makes them atomic with the input offsets; under ``at_least_once``
        the batch's events are acknowledged once they are done (:meth:`_send_decided`)."""
        deliveries = await send_outbox(batch.outbox, self._producer_for)
        self.observer.observe(
            batch.events,
            batch.incoming,
            batch.outcome,
            batch.letters,
            self.states.services(),
            self.app.consumer.highwater,
        )
        return deliveries

    async def prepare(self, events: Sequence[EventT]) -> PreparedBatch:
        """Decode and decide one batch of usage events, set its rows and watermarks in memory and encode every
        record it sends (rows included) into an :class:`Outbox`. Nothing is sent: :meth:`send` does, between
        commits, and the rows in memory that a batch never sent are read again from the changelog after the
        rebalance that follows a failed transaction (their watermark is then ahead of the committed offset)."""
        now = time.time()
        incoming, letters = decode_batch(
            [
                Raw(e.message.topic, e.message.partition, e.message.offset, e.message.key, e.message.value)
                for e in events
            ],
            now,
        )
        partition_of = {item.service: item.partition for item in incoming}
        states = self.states
        stored = {service: states.row(service.encode()) for service in partition_of}
        if self.engine.resources:  # a service's resources' transitions are keyed by their rows
            partition_of |= {
                key: p for service, p in list(partition_of.items()) for key in self.engine.row_keys(service)
            }
        outcome, refused = decide(self.engine, incoming, stored, states.services(), self.topics.usage, now)
        letters += refused
        outbox = Outbox()
        changelog = states.changelog_topic.get_topic_name()
        partitions = await self._partition_counts(changelog)
        for service, row in outcome.rows.items():
            key = service.encode()
            states.put(key, row)
            outbox.add(partition_of[service], changelog, key_partition(key, partitions[changelog]), key, row)
        for partition in sorted({e.message.partition for e in events}):
            mark = states.advance_watermark(
                partition, 1 + max(e.message.offset for e in events if e.message.partition == partition)
            )
            if mark is not None:
                outbox.add(partition, changelog, partition, *mark)
        topics = self.topics
        for a, value in zip(outcome.actions, encode_all(outcome.actions)):
            key = a.service.encode()
            outbox.add(
                partition_of[a.service], topics.actions, key_partition(key, partitions[topics.actions]), key, value
            )
        for t, value in zip(outcome.transitions, encode_all(outcome.transitions)):
            key = t.service.encode()
            outbox.add(
                partition_of[t.service], topics.replay, key_partition(key, partitions[topics.replay]), key, value
            )
        for letter in letters:
            outbox.add(
                letter.partition,
                topics.deadletter,
                key_partition(letter.key, partitions[topics.deadletter]),
                letter.key,
                letter.record.to_bytes(),
            )
        return PreparedBatch(events, incoming, outcome, letters, outbox)

    async def _partition_counts(self, changelog: str) -> dict[str, int]:
        """How many partitions each output topic has (from the broker's metadata, once)."""
        if not self._partitions:
            # cast: Faust's ProducerT lacks the aiokafka driver's _ensure_producer (the app's producer is one)
            producer = cast(driver.Producer, self.app.producer)._ensure_producer()
            for topic in (self.topics.actions, self.topics.replay, self.topics.deadletter, changelog):
                await producer.client._wait_on_metadata(topic)
                self._partitions[topic] = len(producer.client.cluster.partitions_for_topic(topic))
        return self._partitions
