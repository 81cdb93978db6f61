"""What keeps a worker from deciding on the wrong rows or offsets across rebalances, and from staying stalled.

After a rebalance the agent gets no record before Faust has seeked to the committed offsets (faust-streaming
issue #596), and none of a partition whose restored rows fall short of its committed offsets (a watermark row
per partition says how far they go). Between rebalances a watch reads the rows of the held partitions again and
releases those that are back, and makes the worker rejoin its group when one of its usage partitions has had
records waiting and nothing committed for ``stall_timeout`` seconds (stream/stall_watch.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import cast

import faust
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from faust.types import TP
from mode.types.signals import SignalHandlerT

from stream.metrics import WorkerMetrics
from stream.stall_watch import StallWatch
from stream.state_table import ServiceStateTable
from stream.topics import committed_offsets
from stream.transport import HoldingConsumer, WorkerApp

log = logging.getLogger("picrl.worker")

WATCH_EVERY = 7.5  # seconds between reads of a held partition's rows when the stall watch is off


class RebalanceGuard:
    """Holds the usage partitions of ``app`` (group ``group``, ``partitions`` usage partitions of ``usage``)
    whose rows in ``states`` are not their committed state, and rejoins the group when one has stalled."""

    def __init__(
        self,
        app: WorkerApp,
        states: ServiceStateTable,
        metrics: WorkerMetrics,
        *,
        bootstrap: str,
        group: str,
        usage: str,
        partitions: int,
        stall_timeout: float,
        assigned: Callable[[], set[int]],
    ) -> None:
        self.app, self.states, self.metrics = app, states, metrics
        self.bootstrap, self.group, self.usage, self.partitions = bootstrap, group, usage, partitions
        self.stall_timeout = stall_timeout
        self.assigned = assigned  # the usage partitions assigned to the worker now
        self._stalls = StallWatch(stall_timeout)
        self._admin: AIOKafkaAdminClient | None = None  # for the committed offsets (committed)

    def connect(self) -> None:
        """Run on the app's rebalances, on its watch timer, and close the admin client when the app stops."""
        # cast: mode's SignalHandlerT (mypy_extensions' NamedArg for `signal`) matches no handler, not even one of
        # its own shape; the signal calls each as handler(app, signal=..., **kwargs), which these accept
        for handler in (self.hold_records_until_seeked, self.check_restored_state):
            self.app.on_rebalance_complete.connect(cast(SignalHandlerT, handler))
        watch_every = max(1.0, self.stall_timeout / 4) if self.stall_timeout > 0 else WATCH_EVERY
        self.app.timer(watch_every, name="partition-watch")(self.watch_partitions)
        self.app.on_before_shutdown.connect(cast(SignalHandlerT, self.close_admin))

    async def hold_records_until_seeked(self, app: faust.App, **_: object) -> None:
        """Keep usage records out of the stream until Faust has seeked to the committed offsets.

        After a rebalance Faust resumes the usage partitions, awaits the seek to the committed offsets
        and only then resumes flow control, which clears the stream queues. Flow control was already on
        for the table recovery, so records fetched during the seek went into the queues, were cleared,
        and the seek had reset the read offsets: Faust either committed past them (decisions lost) or
        never committed that partition again (faust-streaming issue #596; seen here in a take-over of
        a backlog, tests/stream/test_reliability.py). This signal comes just before the resume: with flow
        control suspended, the fetcher waits on the first record until the seek is done."""
        app.flow_control.suspend()

    async def check_restored_state(self, app: faust.App, **_: object) -> None:
        """Make sure the rows of every assigned usage partition are its committed state before deciding for it.

        Each batch sets its partitions' watermarks in the transaction that commits their offsets, so once the
        table is restored a partition's watermark must equal the offset the group committed there
        (``exactly_once``; at least reach it under ``at_least_once``, whose rows may be delivered before their
        offsets commit). Where it differs, the rows in memory may not be that state: they hold writes of a
        transaction that was then aborted (a fenced or restarted producer) or of batches that were sent but not
        delivered, or they were not restored at all (Faust skipped whole partitions before stream/transport.py,
        faust-streaming issue #158). Such a partition's rows are read again from the changelog (what it holds
        is what was delivered); if they still do not reach the committed offset the state is missing, and the partition
        is held (nothing fetched, decided or committed; logged and counted in ``picrl_partition_state_missing``)
        until its rows are back (read again every watch round: :meth:`watch_partitions`) or a later rebalance
        restores them, rather than deciding for its services as if they were new."""
        assigned = self.assigned()
        consumer = cast(HoldingConsumer, app.consumer)
        consumer.recover()
        try:
            missing = await self._unrestored(assigned)
        except (KafkaError, OSError, TimeoutError) as exc:
            log.error(
                "could not check the restored state against the committed offsets (%s: %s): holding usage "
                "partitions %s and rejoining the group to check again",
                type(exc).__name__,
                exc,
                sorted(assigned),
            )
            consumer.hold(TP(self.usage, p) for p in assigned)
            consumer.rejoin()
            return
        for p, (mark, done) in missing.items():
            log.error(
                "the state of usage partition %d was not restored (its rows hold events up to offset %d, the "
                "group committed %d): deciding nothing for it until its rows are back",
                p,
                mark,
                done,
                extra={"partition": p},
            )
        for p in range(self.partitions):
            self.metrics.state_missing.labels(str(p)).set(int(p in missing))
        consumer.hold(TP(self.usage, p) for p in missing)

    async def _unrestored(self, assigned: set[int]) -> dict[int, tuple[int, int]]:
        """The partitions among ``assigned`` whose rows fall short of the group's committed offsets, each with
        (watermark, committed), after reading again from the changelog the rows of those that differ."""
        committed = await self.committed()
        for p in sorted(assigned):
            mark, done = self.states.watermark(p), committed.get(p, 0)
            if mark != done:  # behind: not restored; ahead: rows of batches sent but perhaps never delivered
                log.warning(
                    "usage partition %d: rows hold events up to offset %d, the group committed %d; reading "
                    "its rows again from the changelog",
                    p,
                    mark,
                    done,
                    extra={"partition": p},
                )
                await self.states.reload(p)
        return {
            p: (self.states.watermark(p), committed[p])
            for p in assigned
            if self.states.watermark(p) < committed.get(p, 0)
        }

    async def committed(self) -> dict[int, int]:
        """The offsets the worker's group committed on the usage topic (asked of the broker), through one admin
        client kept for the worker's life (a new one costs a bootstrap on every rebalance and watch round); after
        a failure the next call connects afresh."""
        if self._admin is None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
            await admin.start()
            self._admin = admin
        try:
            return await committed_offsets(self._admin, self.group, self.usage)
        except BaseException:
            await self.close_admin()
            raise

    async def close_admin(self, *_: object, **__: object) -> None:
        """Close the admin client of :meth:`committed` (also when the app stops)."""
        admin, self._admin = self._admin, None
        if admin is not None:
            await admin.close()

    async def watch_partitions(self) -> None:
        """Every ``stall_timeout / 4`` seconds (:data:`WATCH_EVERY` with the stall watch off), outside rebalances:
        read the rows of each held partition again from the changelog and release those that now reach the
        group's committed offset (rows written back by an operator, or a read that came back short: a held
        partition waited for the next rebalance before, which a stable group never makes); then rejoin the group
        when a usage partition of this worker, not held, has stalled (stream/stall_watch.py): records waiting
        beyond the committed offset, which has not moved for ``stall_timeout`` seconds."""
        app = self.app
        consumer = cast(HoldingConsumer, app.consumer)
        if app.rebalancing or consumer.failed is not None:  # a rebalance is under way or asked for
            self._stalls.reset()
            return
        generation = app.consumer_generation_id
        held = {tp.partition for tp in consumer.held}
        watched = self.assigned() - held if self.stall_timeout > 0 else set()
        if not held and not watched:
            return
        try:
            committed = await self.committed()
            ends = await consumer.highwaters(*(TP(self.usage, p) for p in watched)) if watched else {}
            for p in sorted(held):
                await self.states.reload(p)
        except (KafkaError, OSError, TimeoutError) as exc:  # the broker away: the next round asks again
            log.debug("partition watch: offsets or rows unavailable (%s: %s)", type(exc).__name__, exc)
            return
        if app.rebalancing or app.consumer_generation_id != generation:  # the partitions may have moved
            self._stalls.reset()
            return
        restored = {p for p in held if self.states.watermark(p) >= committed.get(p, 0)}
        if restored:
            log.warning(
                "the rows of usage partitions %s reach the group's committed offsets now (read again from the "
                "changelog): deciding for them again",
                sorted(restored),
                extra={"partition": min(restored)},
            )
            consumer.hold(TP(self.usage, p) for p in held - restored)
            consumer.resume_partitions(TP(self.usage, p) for p in restored)
            for p in restored:
                self.metrics.state_missing.labels(str(p)).set(0)
        stalled = self._stalls.stalled(
            watched, committed, {tp.partition: end for tp, end in ends.items()}, time.monotonic()
        )
        if stalled:
            log.error(
                "usage partitions %s have had records waiting and nothing committed for %.0f s: rejoining the "
                "group, to decide them again from the committed offsets",
                stalled,
                self.stall_timeout,
                extra={"partition": stalled[0]},
            )
            self.metrics.stall_rejoins.inc()
            self._stalls.reset()
            consumer.rejoin()
