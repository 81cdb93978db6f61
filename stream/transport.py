"""The worker's Faust app: Faust's aiokafka transport with the changelog highwaters asked of the broker.

Under ``exactly_once`` Faust 0.15 takes a changelog partition's highwater from the consumer's cached
*last stable offset* instead of asking the broker, and that cache is empty for a partition that has not
been fetched since it was (re)assigned: exactly the moment table recovery asks, right after a rebalance,
with the partitions paused. Faust turns the missing value into highwater -1 (faust-streaming issue #158,
open upstream), and then:

- a worker that had already read the partition (as active or standby) before the rebalance fails the
  consistency check, ``persisted offset ... higher than the last offset in that topic (highwater)
  (93 > -1)``; its recovery service crashes and the worker exits (every take-over, and a lone worker
  after a broker restart, since its session expires while the broker is away);
- a worker that had not read it finds nothing left to restore (-1 - -1 = 0) and starts with no rows for
  that partition's services: they are treated as new (state lost without a word).

The read_committed consumer's ``end_offsets`` asks the broker for the same value (the last stable offset),
so this transport always asks. Its consumer can also hold partitions paused, for the worker to refuse a
partition whose rows it could not restore (``StreamWorker._refuse_unrestored``)."""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import cast

import faust
from faust.transport.drivers import aiokafka as driver
from aiokafka.errors import IllegalOperation, KafkaError
from faust.exceptions import ProducerSendError
from faust.transport.consumer import TransactionManager
from faust.types import TP, TransportT
from faust.types.transports import TPorTopicSet


TRANSACTION_ERRORS = (KafkaError, IllegalOperation, ProducerSendError)  # a transactional send or commit failed
logger = logging.getLogger("picrl.worker")


class _ConsumerThread(driver.AIOKafkaConsumerThread):
    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        """The partitions' end offsets from the broker (their last stable offsets: the consumer reads
        committed records only under exactly_once), never the cache of a fetch that has not happened."""
        return cast(Mapping[TP, int], await self._ensure_consumer().end_offsets(partitions))


class HoldingConsumer(driver.Consumer):
    """Faust's aiokafka consumer, which can keep partitions paused through Faust's own resumes, and which
    rejoins its group when a transaction fails instead of crashing the app (:meth:`transaction_failed`)."""

    held: frozenset[TP] = frozenset()
    #: the error of a transaction that could not send or commit; until the next revocation nothing is decided
    #: or committed
    failed: BaseException | None = None

    def _new_consumer_thread(self) -> driver.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

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
        committed, and the consumer rejoins its group: the revocation drops the acknowledgements, new
        producers start (:class:`_FreshTransactions`) and the worker checks the restored rows against the
        committed offsets before deciding again."""
        if self.failed is None:
            logger.warning("a transaction failed (%s: %s): deciding again from the committed offsets after a "
                           "rebalance; rejoining the group", type(exc).__name__, exc)
            self._thread._ensure_consumer()._coordinator.request_rejoin()
        self.failed = exc

    async def commit(self, topics: TPorTopicSet | None = None, start_new_transaction: bool = True) -> bool:
        if self.failed is not None:
            return False
        try:
            return await super().commit(topics, start_new_transaction=start_new_transaction)
        except TRANSACTION_ERRORS as exc:
            self.transaction_failed(exc)
            return False

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        await super().on_partitions_revoked(revoked)
        self.failed = None  # every partition is revoked (eager rebalancing), their acknowledgements dropped


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
        committed offsets (``StreamWorker._check_restored_state``)."""
        await super().on_rebalance(assigned, revoked | assigned, newly_assigned)


class _Transport(driver.Transport):
    Consumer = HoldingConsumer
    TransactionManager = _FreshTransactions


class WorkerApp(faust.App):
    """A :class:`faust.App` whose consumer takes changelog highwaters from the broker (see the module) and
    can hold partitions (:class:`HoldingConsumer`)."""

    def _new_transport(self) -> TransportT:
        return _Transport(self.conf.broker_consumer, self)
