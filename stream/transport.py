"""The worker's Faust app: Faust's aiokafka transport, with what it takes to survive worker and broker kills
(docs/guide/reliability.md).

1. Changelog highwaters asked of the broker. Under ``exactly_once`` Faust 0.15 takes a changelog
   partition's highwater from the consumer's cached *last stable offset*, which is empty for a partition
   not fetched since it was (re)assigned: exactly when table recovery asks, right after a rebalance. Faust
   turns the missing value into -1 (faust-streaming issue #158, open upstream): a worker that had read the
   partition before fails the consistency check (``... (highwater) (93 > -1)``, its recovery crashes the
   worker), one that had not restores nothing (its services' state lost without a word). The
   read_committed consumer's ``end_offsets`` asks the broker for the same value.
2. Failed transactions do not crash the worker. A zombie (its session expired, the group went on) finds
   its producers fenced; Faust crashed on that in the agent, its commit timer, its commit on revocation
   and its producer buffer. Every rebalance starts fresh producers, a failed send or commit makes the
   consumer skip and rejoin, and decisions resume from the committed offsets (:class:`HoldingConsumer`).
3. Table recovery ends as soon as the changelog has been read. Under ``exactly_once`` a changelog partition ends
   with a transaction marker (after an abort, with records no reader sees), so the last record read stays below
   the highwater Faust waits for; Faust then declares the partition done only after its recovery queue has been
   empty for two 5-second rounds, and a take-over waited 10 s for nothing. The queue here ends a round after
   :data:`RECOVERY_IDLE` seconds (:class:`_TableManager`), so Faust's own check (the consumer's position has
   passed the highwater) comes within a second.
4. A recovery seek to an offset that is not a position (None, seen after broker kills) reads the changelog
   partition from its start instead of crashing the worker (``ValueError('Offset must be a positive
   integer')``).
5. Fetches wait at most :data:`FETCH_MAX_WAIT_MS` for records. A broker answers the requests of one connection
   in order, and Faust's fetches wait up to 1.5 s when no record comes: right after a rebalance, the recovery's
   offset look-ups (ListOffsets for the highwaters and the offset resets) queued behind such a fetch, and a
   take-over waited 0.5-1.5 s for nothing twice over (seen in a worker's debug log: a ListOffsets answered
   1.3 s after it was sent, as the fetch before it expired).
6. A worker starts without Faust's table manager pausing one second for tables still being declared; every
   (re)started worker waited it before it joined its group.

The consumer can also hold partitions paused, for the worker to refuse a partition whose rows it could
not restore (``RebalanceGuard.check_restored_state``).

For throughput (issue 17): the partitions' transactions commit concurrently (:class:`_Producer`), and a
fetched record reaches the stream without the four tasks Faust made per record when its delivery does not
have to wait (:meth:`HoldingConsumer.wait_first`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from types import CoroutineType
from typing import Any, cast

import faust
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import IllegalOperation, KafkaConnectionError, KafkaError, NodeNotReadyError, ProducerFenced
from faust.exceptions import ProducerSendError
from faust.tables import TableManager
from faust.transport.consumer import TransactionManager
from faust.transport.drivers import aiokafka as driver
from faust.types import TP, AppT, EventT, HeadersArg, Message, RecordMetadata, TransportT
from faust.types.transports import TPorTopicSet
from mode.services import WaitResults
from mode.utils.queues import ThrowableQueue

from stream.membership import leave_group

TRANSACTION_ERRORS = (KafkaError, IllegalOperation, ProducerSendError)  # a transactional send or commit failed
logger = logging.getLogger("picrl.worker")
RECOVERY_IDLE = 0.25  # seconds without a changelog record that end one of the recovery loop's waiting rounds
# A broker answers a connection's requests in order, so a fetch waiting for records holds back the consumer's
# offset look-ups behind it on that connection (item 5 of the module)
FETCH_MAX_WAIT_MS = 100
TOPIC_DECLARE_WAIT = 60.0  # seconds a topic declaration is asked again while its node cannot be reached


class _ConsumerThread(driver.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: driver.Transport) -> AIOKafkaConsumer:
        """Faust's consumer, whose fetches wait at most :data:`FETCH_MAX_WAIT_MS` for records (Faust sets 1.5 s)."""
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # read when the consumer starts its fetcher
        return consumer

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        """The partitions' end offsets from the broker (their last stable offsets: the consumer reads
        committed records only under exactly_once), never the cache of a fetch that has not happened."""
        return cast(Mapping[TP, int], await self._ensure_consumer().end_offsets(partitions))

    async def _seek_wait(self, consumer: AIOKafkaConsumer, partitions: Mapping[TP, int]) -> None:
        """Faust's seek of changelog partitions for recovery, where an offset that is not a position (None or
        below -1, seen for a standby partition after broker kills) means "from the start", as -1 does:
        aiokafka refuses it (``ValueError('Offset must be a positive integer')``) and the recovery service
        crashed the worker."""
        valid = {tp: offset if isinstance(offset, int) and offset >= 0 else 0 for tp, offset in partitions.items()}
        for tp in (tp for tp in partitions if valid[tp] != partitions[tp] and partitions[tp] != -1):
            logger.warning(
                "changelog %s[%d]: recovery asked to seek to %r; reading it from the start",
                tp.topic,
                tp.partition,
                partitions[tp],
            )
        await super()._seek_wait(consumer, valid)

    async def on_thread_stop(self) -> None:
        """Stop the consumer; a static member then leaves its group (:func:`stream.membership.leave_group`), as a
        dynamic one does when its consumer stops, so a worker stopped for good hands its partitions over at once."""
        await super().on_thread_stop()
        member = self.app.conf.consumer_group_instance_id
        if member:
            transport = cast(driver.Transport, self.transport)
            await leave_group(
                ",".join(driver.server_list(transport.url, transport.default_port)), self.app.conf.id, member
            )


_EVENT_WAIT = asyncio.Event.wait.__code__


async def _settled(future: asyncio.Future) -> None:
    """Wait until ``future`` is done, without taking its result or exception."""
    if future.done():
        return
    waiter = asyncio.get_running_loop().create_future()

    def wake(_: asyncio.Future) -> None:
        if not waiter.done():
            waiter.set_result(None)

    future.add_done_callback(wake)
    try:
        await waiter
    finally:
        future.remove_done_callback(wake)


async def _resume(coro: Coroutine[Any, Any, Any], yielded: Any) -> Any:
    """Run to its end a coroutine that already ran its first step and yielded ``yielded``, as a task would:
    resume it when what it waits on is done; when cancelled, cancel that (or throw into the coroutine)."""
    while True:
        try:
            if yielded is None:
                await asyncio.sleep(0)
            else:
                yielded._asyncio_future_blocking = False
                await _settled(yielded)
        except asyncio.CancelledError as exc:
            if yielded is None or not yielded.cancel():
                try:
                    yielded = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
                continue
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            return stop.value


class HoldingConsumer(driver.Consumer):
    """Faust's aiokafka consumer, which can keep partitions paused through Faust's own resumes, and which
    rejoins its group when a transaction fails instead of crashing the app (:meth:`transaction_failed`)."""

    held: frozenset[TP] = frozenset()
    #: the error of a transaction that could not send or commit; until the next rebalance has completed nothing
    #: is decided or committed (:meth:`recover`)
    failed: BaseException | None = None

    def _new_consumer_thread(self) -> driver.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def wait_first(self, *coros: Any, timeout: Any = None) -> WaitResults:
        """Faust's wait, with a fast path for the one its fetcher makes per record.

        Faust's fetch loop hands each record to the conductor as ``wait_first(on_message(record),
        suspend_flow.wait())``, so that a rebalance can interrupt a delivery that blocks (flow control, a full
        stream queue). That made four tasks per record (the delivery, the suspend flag, and the service's stopped
        and crashed flags) and cancelled three: about a tenth of the worker's CPU. Here the delivery runs its
        first step at once; when it finishes there (it does unless it has to wait) nothing else is made; when it
        waits, the rest of it runs under Faust's wait as before, so a rebalance still interrupts it."""
        if (
            len(coros) == 2
            and timeout is None
            and isinstance(coros[0], CoroutineType)
            and isinstance(coros[1], CoroutineType)
            and coros[1].cr_code is _EVENT_WAIT
            and coros[0].cr_code.co_name == "on_message"
        ):
            delivery, suspended = coros
            try:
                yielded = delivery.send(None)
            except StopIteration as stop:
                suspended.close()
                return WaitResults([delivery], [stop.value], False)
            except BaseException:
                suspended.close()
                raise
            return await super().wait_first(_resume(delivery, yielded), suspended)
        return await super().wait_first(*coros, timeout=timeout)

    def hold(self, tps: Iterable[TP]) -> None:
        """Fetch nothing from ``tps`` (and only from them) until the next call, whatever Faust resumes."""
        self.held = frozenset(tps)
        self.pause_partitions(self.held)

    def resume_partitions(self, tps: Iterable[TP]) -> None:
        super().resume_partitions(set(tps) - self.held)

    def transaction_failed(self, exc: BaseException) -> None:
        """A send or a commit failed in a transaction: fenced by a newer producer with its transactional id
        (the group went on without this worker while its session was expired, e.g. during a broker outage),
        aborted by the broker, or the broker away too long. That transaction is aborted, so the events
        acknowledged since the last commit must be decided again. Faust would crash the app (an exception in
        an agent, a timer, or its own commit when partitions are revoked); instead nothing more is decided or
        committed, and the consumer rejoins its group; once the rebalance has completed, new producers have
        started (:class:`_FreshTransactions`), the worker has checked the restored rows against the committed
        offsets and calls :meth:`recover`."""
        if self.failed is None:
            logger.warning(
                "a transaction failed (%s: %s): deciding again from the committed offsets after a "
                "rebalance; rejoining the group",
                type(exc).__name__,
                exc,
            )
            self.rejoin()
        self.failed = exc

    def rejoin(self) -> None:
        """Have the consumer rejoin its group: a rebalance, every partition revoked and assigned again."""
        self._thread._ensure_consumer()._coordinator.request_rejoin()

    async def commit(self, topics: TPorTopicSet | None = None, start_new_transaction: bool = True) -> bool:
        if self.failed is not None:
            return False
        try:
            return await super().commit(topics, start_new_transaction=start_new_transaction)
        except TRANSACTION_ERRORS as exc:
            self.transaction_failed(exc)
            return False

    def recover(self) -> None:
        """After a failed transaction, once a rebalance has completed: forget the acknowledgements of the
        events skipped meanwhile (as a revocation does; a failure can also come after the revocation, from a
        commit during the rebalance) and decide again, from the committed offsets Faust seeks to next."""
        if self.failed is None:
            return
        for tp in self.assignment():
            self._acked.pop(tp, None)
            self._acked_index.pop(tp, None)
            self._gap.pop(tp, None)
        self.failed = None


class _FreshTransactions(TransactionManager):
    async def on_rebalance(self, assigned: set[TP], revoked: set[TP], newly_assigned: set[TP]) -> None:
        """Start a new transactional producer for every assigned partition, kept ones included.

        Faust starts producers for the newly assigned partitions only and keeps the others' producers, in
        the middle of their transactions ("Invalid state transition IN_TRANSACTION -> IN_TRANSACTION" at
        every rebalance). A kept producer may be dead: when a broker outage outlasts the session, the group
        goes on without this worker, another member's producer for the same transactional id fences this
        one, and the partition comes back to a worker that can no longer send or commit in it (its agent
        crashed on ``ProducerFenced``, its commit timer on ``Not in the middle of a transaction``). A new
        producer aborts what the old one left open; the worker then checks the restored rows against the
        committed offsets (``RebalanceGuard.check_restored_state``)."""
        await super().on_rebalance(assigned, revoked | assigned, newly_assigned)

    async def _stop_transactions(self, tids: Iterable[str]) -> None:
        """Stop the producers of ``tids`` side by side (Faust stops them one after the other)."""
        await asyncio.gather(*(self.producer.stop_transaction(tid) for tid in tids))

    async def _start_transactions(self, tids: Iterable[str]) -> None:
        """Start the producers of ``tids`` side by side: each start is a connection, a coordinator look-up and an
        ``InitProducerId`` that aborts what its predecessor left open, and Faust made them one after the other,
        a take-over's largest wait once recovery is prompt (0.4-0.5 s each on a loaded host)."""
        await asyncio.gather(*(self.producer.maybe_begin_transaction(tid) for tid in tids))

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        timestamp: float | None,
        headers: HeadersArg | None,
        *,
        transactional_id: str | None = None,
    ) -> Awaitable[RecordMetadata]:
        """Faust's send, except that a send its producer refuses at once (fenced, or no longer in a transaction)
        returns a failed future instead of raising: Faust's producer buffer, which drains the sends made through
        Faust (a table write with ``table[key] = value``), crashed the app on that exception; the future now
        carries the failure to whoever awaits it."""
        try:
            return await super().send(
                topic, key, value, partition, timestamp, headers, transactional_id=transactional_id
            )
        except TRANSACTION_ERRORS as exc:
            failed: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed


class _Producer(driver.Producer):
    async def create_topic(self, topic: str, partitions: int, replication: int, **options: Any) -> None:
        """Faust's topic declaration, asked again while the node it picked cannot be reached.

        Faust sends the request to the first node of its client's metadata; a Kafka node killed a moment ago, or
        starting again, is listed there until the controller fences it, and the request failed at once with
        ``NodeNotReadyError``: the worker exited (a worker process forked again while a node was away, in the
        soak). Each retry refreshes the metadata first, so a fenced node is no longer picked."""
        deadline = asyncio.get_running_loop().time() + TOPIC_DECLARE_WAIT
        while True:
            try:
                return await super().create_topic(topic, partitions, replication, **options)
            except (NodeNotReadyError, KafkaConnectionError) as exc:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                logger.info("declaring topic %s: %s; asking again", topic, exc)
                await self._ensure_producer().client.force_metadata_update()
                await asyncio.sleep(0.5)

    async def commit_transactions(
        self, tid_to_offset_map: Mapping[str, Mapping[TP, int]], group_id: str, start_new_transaction: bool = True
    ) -> None:
        """Faust's commit of every partition's transaction, the partitions at once instead of one after the other.

        Each usage partition has its own transactional producer; a commit sends its offsets, ends its
        transaction and begins the next, three round trips to the transaction coordinator. Faust does that for
        one partition after the other, so with 8 partitions a commit (every ``commit_interval``, decisions
        waiting meanwhile) took 8 times as long as one. The first failure (in partition order) is raised, as
        before, after every other partition's commit has ended; a fenced producer's (``ProducerFenced``, a zombie
        whose session expired) as a ``ProducerSendError``: Faust's ``TransactionManager.commit`` crashes the app
        on ``ProducerFenced`` (seen once in the chaos test: a frozen worker exited), while the worker's consumer
        takes any other failed commit as a failed transaction and rejoins its group
        (``HoldingConsumer.transaction_failed``)."""

        async def commit(transactional_id: str, offsets: Mapping[TP, int]) -> None:
            async with self._trn_locks[transactional_id]:
                producer = self._transaction_producers.get(transactional_id)
                if producer is None:
                    logger.warning("Commit invoked for unknown transaction %s", transactional_id)
                    return
                await producer.send_offsets_to_transaction(offsets, group_id)
                await producer.commit_transaction()
                if start_new_transaction:
                    await producer.begin_transaction()

        results = await asyncio.gather(
            *(commit(tid, offsets) for tid, offsets in tid_to_offset_map.items()), return_exceptions=True
        )
        for result in results:
            if isinstance(result, ProducerFenced):  # Faust's transaction manager crashes the app on this one
                raise ProducerSendError(f"a transaction commit was fenced: {result}") from result
            if isinstance(result, BaseException):
                raise result


class _Transport(driver.Transport):
    Consumer = HoldingConsumer
    Producer = _Producer
    TransactionManager = _FreshTransactions


class RawRecords(faust.Schema):
    """A topic whose records reach the agent as they came: key and value bytes, each record wrapped in a Faust
    event. Faust's ``raw`` serializer returns the same bytes, after two registry lookups, a codec call and a
    settings lookup per record (~7% of the worker's CPU); this decodes nothing and makes the same event."""

    def __init__(self) -> None:
        super().__init__(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")

    def compile(
        self,
        app: AppT,
        *,
        on_key_decode_error: Any = None,
        on_value_decode_error: Any = None,
        default_propagate: bool = False,
    ) -> Callable[..., Awaitable[EventT]]:
        # cast: Faust declares the setting through a decorator that leaves mypy a special form, not the class
        event = cast(type[EventT], app.conf.Event)

        async def decode(message: Message, *, propagate: bool = default_propagate) -> EventT:
            return event(app, message.key, message.value, message.headers, message)

        return decode


class _RecoveryQueue(ThrowableQueue):
    """The changelog queue, read only by Faust's recovery loop: a wait for the next record ends after
    :data:`RECOVERY_IDLE` seconds (``TimeoutError``), which the loop takes as one empty round (item 3 of the
    module docstring). Records still come in order and none is dropped."""

    async def get(self) -> Any:
        return await asyncio.wait_for(super().get(), RECOVERY_IDLE)


class _TableManager(TableManager):
    """Faust's table manager, with the changelog queue that ends recovery promptly (item 3 of the module), and a
    start without Faust's one-second pause for tables still being declared: the worker declares its one table
    before the app starts (item 6)."""

    @property
    def changelog_queue(self) -> ThrowableQueue:
        if self._changelog_queue is None:
            self._changelog_queue = _RecoveryQueue(
                maxsize=self.app.conf.stream_buffer_maxsize, flow_control=self.app.flow_control, clear_on_resume=True
            )
        return self._changelog_queue

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


class WorkerApp(faust.App):
    """A :class:`faust.App` whose consumer takes changelog highwaters from the broker (see the module) and
    can hold partitions (:class:`HoldingConsumer`), whose tables recover promptly (:class:`_TableManager`), and
    that writes nothing to disk."""

    def __init__(self, *args: Any, **settings: Any) -> None:
        settings.setdefault("TableManager", _TableManager)
        super().__init__(*args, **settings)

    def _create_directories(self) -> None:
        """Nothing: the table lives in memory and in its changelog topic (``store="memory://"``), so Faust's
        ``<app id>-data/v1/tables`` would only be an empty folder left in the working directory of every run."""

    def _new_transport(self) -> TransportT:
        return _Transport(self.conf.broker_consumer, self)
