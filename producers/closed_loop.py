"""The counterfactual environment of Sec. 4.1.2 played over Kafka.

Each tick ``t`` it reveals, for every service, ``y_t = min(d_t, a_t)`` and ``c_t = 1[d_t > a_t]`` on the
usage topic, where ``a_t`` is the capacity the workers decided for tick ``t`` (read from the actions
topic with ``read_committed``); then it waits for the decisions for tick ``t + 1``. Demand comes
from a :class:`~producers.workload.Workload` and never leaves this process. Before picrl's first
decision each service runs on a static allocation of ``initial_headroom`` times its peak demand
(a cluster over-provisioned before autoscaling).

A workload of services provisioned several resources (``Workload.resources``) is observed by the coupled
rule of :func:`picrl_core.resources.observe`: a memory shortage fails requests, so every resource of that tick
is measured on the load served. Each tick's record then carries a ``resources`` map (schema 2) with each
resource's usage, capacity and its own monitor's flag, and the actions put one capacity per resource in force.

A run that stopped (the workers did not answer in time, or the process was stopped) can be resumed:
``start_tick`` T rebuilds ticks 0 .. T from the actions already on the actions topic and goes on by
revealing tick T; ``start_tick=None`` starts at the last tick for which every service has its action. Usage
of tick T that had already been delivered is refused by the workers as a duplicate tick (dead-lettered),
never decided twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from picrl_core.resources import observe
from producers.workload import Workload
from stream.records import (
    Action,
    DecodeError,
    ResourceAction,
    ResourceUsage,
    ResourceUsageEvent,
    UsageEvent,
    decode_action,
)
from stream.topics import TopicNames

Pending = dict[int, dict[int, Action | ResourceAction]]  # tick -> service index -> its action
_BREAKDOWN = ("capacity_norm", "mu", "sigma", "k", "eta", "margin", "bias")
TOPIC_WAIT_SECONDS = 10.0  # how long a topic missing from the metadata is looked up again before the error
TOPIC_POLL_SECONDS = 0.25


class NoActionError(RuntimeError):
    """The workers did not decide for some services in time (``tick``: the tick whose actions were awaited)."""

    def __init__(self, message: str, tick: int | None = None) -> None:
        super().__init__(message)
        self.tick = tick


@dataclass
class ClosedLoopRecord:
    """Everything that happened, each array ``(T, N)`` (``(T, R * N)`` for R resources, resource-major, as the
    workload's demand): tick ``t`` ran with ``capacity[t]``; ``censored`` holds the flags reported."""

    workload: Workload
    capacity: np.ndarray
    usage: np.ndarray
    censored: np.ndarray
    control: np.ndarray  # bool: capacity[t] was a PIC-RL decision (not warm-up or the initial allocation)
    policy_version: np.ndarray  # int, -1 where there was no action
    breakdown: dict[str, np.ndarray] = field(default_factory=dict)
    duplicate_actions: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class TickSummary:
    """Progress after one tick (what ``picrl up`` shows)."""

    tick: int
    ticks: int
    censoring_rate: float  # over the control ticks so far
    policy_version: int
    control_services: int


async def topic_partitions(
    consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, topic: str, wait: float = TOPIC_WAIT_SECONDS
) -> list[TopicPartition]:
    """Every partition of ``topic``. A topic created a moment ago may not have reached the metadata of the node that
    answers yet (each node of a cluster learns it from the controller on its own): it is looked up again for up to
    ``wait`` seconds before a clear error says it does not exist."""
    deadline = time.monotonic() + wait
    while topic not in await consumer.topics():
        if time.monotonic() >= deadline:
            raise NoActionError(f"topic {topic} does not exist: create the topics first (`picrl topics create`)")
        await asyncio.sleep(TOPIC_POLL_SECONDS)
    return [TopicPartition(topic, p) for p in sorted(await producer.partitions_for(topic))]


class ClosedLoopEnvironment:
    """Plays ``workload`` against the workers listening on ``topics``."""

    def __init__(
        self,
        bootstrap: str,
        topics: TopicNames,
        workload: Workload,
        *,
        initial_headroom: float = 1.1,
        interval: float = 0.0,
        action_timeout: float = 60.0,
        start_tick: int | None = 0,
        on_tick: Callable[[TickSummary], None] | None = None,
    ) -> None:
        if initial_headroom < 1.0:
            raise ValueError(
                f"initial headroom must be >= 1 (a static allocation above the peak); got {initial_headroom}"
            )
        self.bootstrap = bootstrap
        self.topics = topics
        self.workload = workload
        self.initial_headroom = initial_headroom
        self.interval = interval
        self.action_timeout = action_timeout
        self.start_tick = start_tick
        self.on_tick = on_tick

    async def run(self) -> ClosedLoopRecord:
        w = self.workload
        ticks, n = w.demand.shape
        index = {service: j for j, service in enumerate(w.services)}
        record = ClosedLoopRecord(
            w,
            capacity=np.zeros((ticks, n)),
            usage=np.zeros((ticks, n)),
            censored=np.zeros((ticks, n), bool),
            control=np.zeros((ticks, n), bool),
            policy_version=np.full((ticks, n), -1, np.int64),
            breakdown={name: np.full((ticks, n), np.nan) for name in _BREAKDOWN},
        )
        record.capacity[0] = w.demand.max(axis=0) * self.initial_headroom
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True, linger_ms=1)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, enable_auto_commit=False, isolation_level="read_committed"
        )
        await producer.start()
        await consumer.start()
        started = time.monotonic()
        try:
            partitions = await topic_partitions(consumer, producer, self.topics.actions)
            consumer.assign(partitions)
            pending: Pending = {}
            start = 0
            if self.start_tick == 0:
                await consumer.seek_to_end(*partitions)
                for p in partitions:  # resolve the end offsets now, before any usage is sent
                    await consumer.position(p)
            else:
                start = await self._resume(consumer, partitions, record, pending, index)
            for t in range(start, ticks):
                await self._reveal(producer, record, t)
                if t + 1 < ticks:
                    await self._collect(consumer, record, pending, index, t + 1)
                if self.interval:
                    await asyncio.sleep(self.interval)
        finally:
            record.seconds = time.monotonic() - started
            await consumer.stop()
            await producer.stop()
        return record

    async def _resume(
        self,
        consumer: AIOKafkaConsumer,
        partitions: list[TopicPartition],
        record: ClosedLoopRecord,
        pending: Pending,
        index: dict[str, int],
    ) -> int:
        """Read the actions topic from its start, put the actions of ticks 1 .. start in force and return start
        (``start_tick``, or the last tick every service has an action for)."""
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        deadline = time.monotonic() + self.action_timeout
        while [p for p in partitions if await consumer.position(p) < ends[p]] and time.monotonic() < deadline:
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                self._take(messages, record, pending, index, 1)
        ticks, n = self.workload.demand.shape
        done = 0
        while done + 1 < ticks and len(pending.get(done + 1, {})) == n:
            done += 1
        start = done if self.start_tick is None else self.start_tick
        if not 0 <= start <= done:
            raise NoActionError(
                f"cannot resume at tick {start}: {self.topics.actions} holds every service's action "
                f"up to tick {done} only (resume at {done} or before)"
            )
        for t in range(1, start + 1):
            self._put_in_force(record, pending.pop(t), t)
        for t in range(start):
            self._observe(record, t)
        return start

    def _observe(self, record: ClosedLoopRecord, t: int) -> tuple[np.ndarray, np.ndarray]:
        """What tick ``t`` reveals under the capacity in force: usage ``min(d, a)`` and the censored flags."""
        w = self.workload
        demand, capacity = w.demand[t], record.capacity[t]
        if w.resources:
            shape = (len(w.resources), len(w.services))
            usage, _, own, _ = observe(demand.reshape(shape), capacity.reshape(shape), w.resources)
            record.usage[t], record.censored[t] = usage.ravel(), own.ravel()
        else:
            record.usage[t], record.censored[t] = np.minimum(demand, capacity), demand > capacity
        return record.usage[t], record.censored[t]

    async def _reveal(self, producer: AIOKafkaProducer, record: ClosedLoopRecord, t: int) -> None:
        w = self.workload
        capacity = record.capacity[t]
        usage, censored = self._observe(record, t)
        now = time.time()
        futures = []
        n = len(w.services)
        for j, service in enumerate(w.services):
            context = None if w.context is None else dict(zip(w.context_names, w.context[t, j].tolist()))
            event: UsageEvent | ResourceUsageEvent
            if w.resources:
                event = ResourceUsageEvent(
                    service,
                    t,
                    {
                        r.name: ResourceUsage(
                            float(usage[i * n + j]), float(capacity[i * n + j]), bool(censored[i * n + j])
                        )
                        for i, r in enumerate(w.resources)
                    },
                    context,
                    now,
                )
            else:
                event = UsageEvent(service, t, float(usage[j]), bool(censored[j]), float(capacity[j]), context, now)
            futures.append(await producer.send(self.topics.usage, event.to_bytes(), key=service.encode()))
        await asyncio.gather(*futures)
        if self.on_tick is not None:
            control = record.control[: t + 1]
            seen = record.policy_version[: t + 1]
            self.on_tick(
                TickSummary(
                    t,
                    w.ticks,
                    float(record.censored[: t + 1][control].mean()) if control.any() else 0.0,
                    int(seen.max()),
                    int(record.control[t].reshape(-1, n).all(axis=0).sum()),
                )
            )

    async def _collect(
        self, consumer: AIOKafkaConsumer, record: ClosedLoopRecord, pending: Pending, index: dict[str, int], tick: int
    ) -> None:
        """Wait for every service's action for ``tick`` and put it in force."""
        deadline = time.monotonic() + self.action_timeout
        wanted = len(index)
        while len(pending.get(tick, {})) < wanted:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(index) - {self.workload.services[j] for j in pending.get(tick, {})})
                raise NoActionError(
                    f"no action for tick {tick} from {len(missing)} service(s) (e.g. {missing[:3]}) within "
                    f"{self.action_timeout:.0f} s: is a picrl worker consuming {self.topics.usage}?",
                    tick,
                )
            batches = await consumer.getmany(timeout_ms=int(min(remaining, 0.5) * 1000))
            for messages in batches.values():
                self._take(messages, record, pending, index, tick)
        self._put_in_force(record, pending.pop(tick), tick)

    @staticmethod
    def _take(
        messages: list[ConsumerRecord], record: ClosedLoopRecord, pending: Pending, index: dict[str, int], tick: int
    ) -> None:
        """File the actions for ``tick`` and later by tick and service (a second one for the same pair is
        counted as a duplicate)."""
        for message in messages:
            try:
                action = decode_action(message.value)
            except DecodeError:
                continue
            j = index.get(action.service)
            if j is None or action.tick < tick:
                continue
            slot = pending.setdefault(action.tick, {})
            if j in slot:
                record.duplicate_actions += 1
                continue
            slot[j] = action

    def _put_in_force(self, record: ClosedLoopRecord, slot: dict[int, Action | ResourceAction], tick: int) -> None:
        n = len(self.workload.services)
        for j, action in slot.items():
            parts = (
                [(j, action)]
                if isinstance(action, Action)
                else [(i * n + j, action.resources[r.name]) for i, r in enumerate(self.workload.resources)]
            )
            for column, decision in parts:
                record.capacity[tick, column] = decision.capacity
                record.control[tick, column] = action.phase == "control"
                record.policy_version[tick, column] = action.policy_version
                for name in _BREAKDOWN:
                    record.breakdown[name][tick, column] = getattr(decision, name)
