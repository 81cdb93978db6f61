"""The worker's service-state table: a Faust table (changelog-backed, restored by Faust) whose rows the worker
sets in memory and writes to the changelog in its own transactions, with one watermark row per partition that
says which usage offsets its rows already hold."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from typing import Any

import faust
from aiokafka.partitioner import murmur2
from faust.types import TP, EventT

from stream.topics import end_offsets, read_partition

log = logging.getLogger("picrl.worker")

WATERMARK_KEY = b"\x00watermark/"  # + partition number; never a service id (those refuse control characters)


class ServiceStateTable(faust.Table):
    """A :class:`faust.Table` of the services' rows, in memory, whose changelog records the worker sends itself.

    The worker sets a batch's rows in memory (:meth:`put`, :meth:`advance_watermark`) and sends their changelog
    records in the record batches of the transaction that commits the batch's input offsets (stream/outbox.py),
    so a batch's rows and offsets commit together or not at all. Each batch also sets the watermark of every
    usage partition it read: the offset after its last event, on the changelog partition of the same number, in
    the same transaction. So after a restore the watermark of a partition must reach the offset its consumer
    group committed there; when it does not, the rows of that partition were not restored (:meth:`watermark`)."""

    #: the cluster the changelog is read from in bulk (set by the worker; None: Faust restores every partition)
    bootstrap: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._actives: set[TP] = set()  # the changelog partitions active here since the last rebalance
        self._read: dict[TP, int] = {}  # those read in bulk since the last rebalance: the last offset read

    async def on_rebalance(
        self, assigned: set[TP], revoked: set[TP], newly_assigned: set[TP], generation_id: int = 0
    ) -> None:
        """Read the rows of every newly active changelog partition in bulk, before Faust's recovery starts.

        With the in-memory store Faust restores a partition that becomes active (a start, a take-over, a
        standby promoted) from its first record, one record at a time through its recovery loop: about 1,000
        records a second here, 5 minutes for 100,000 services. Read with one consumer per partition in batches
        of up to 10,000 (:func:`stream.topics.read_partition`, ``read_committed``, to the last stable offset),
        the same rows take seconds; :meth:`persisted_offset` then tells Faust where its own reading starts (the
        records written since, usually none). A partition that stays active keeps its rows, which this worker
        wrote itself: Faust would read back every record written since its last recovery, so its reading starts
        at the partition's last stable offset (rows of a transaction that then failed are caught by the worker's
        watermark check, which reads the partition again). The rows of partitions no longer active are dropped,
        as Faust's in-memory store drops them once recovery completes."""
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)
        topic = self.changelog_topic.get_topic_name()
        actives = {tp for tp in self.app.assignor.assigned_actives() if tp.topic == topic}
        fresh, kept = sorted(actives - self._actives), sorted(actives & self._actives)
        self._actives, self._read = actives, {}
        if self.bootstrap is None:
            return
        held = {tp.partition for tp in actives}
        for key in [k for k in self.data.keys() if self.partition_of(k) not in held]:
            del self.data[key]
        ends = await end_offsets(self.bootstrap, topic, self.partitions or 1, "read_committed") if kept else {}
        self._read = {tp: ends[tp.partition] - 1 for tp in kept}
        await asyncio.gather(*(self.reload(tp.partition) for tp in fresh))

    def apply_changelog_batch(self, batch: Iterable[EventT]) -> None:
        """Faust's recovery applies the changelog records it has read, except those of a partition active here at
        or below the offset its rows were read to (:meth:`reload`): the rows already hold them or later values.

        Faust hands such records over after a rebalance. A standby partition's records fetched before it (still
        in Faust's changelog queue, or in its recovery buffer, which it flushes once recovery restarts) reach
        the table after the partition has become active here and its rows were read in bulk; applied, they set
        the rows of some services back to older states. The restore check reads the rows again when those
        records include the partition's watermark row (they usually end with one); when they do not, those
        services would be decided from a state that misses ticks."""
        read, current, older = self._read, [], Counter[int]()
        for event in batch:
            if event.message.offset > read.get(event.message.tp, -1):
                current.append(event)
            else:
                older[event.message.partition] += 1
        for partition, count in sorted(older.items()):
            log.info(
                "changelog partition %d: %d record(s) Faust read before this worker's rows were not applied",
                partition,
                count,
                extra={"partition": partition},
            )
        super().apply_changelog_batch(current)

    def persisted_offset(self, tp: TP) -> int | None:
        """The last offset of ``tp`` read in bulk since this rebalance (:meth:`reload`); None (Faust reads the
        partition from its start) for the others."""
        return self._read.get(tp)

    def row(self, key: bytes) -> bytes | None:
        """The row of ``key`` in memory (None: none)."""
        return self.data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        """Set a row in memory only: its changelog record is the caller's to send, in the transaction of the
        usage partition whose events made it (``StreamWorker.prepare``, stream/outbox.py), on the changelog
        partition :meth:`partition_of` gives it."""
        self.data[key] = value

    def advance_watermark(self, partition: int, next_offset: int) -> tuple[bytes, bytes] | None:
        """Record in memory that the rows hold every usage event of ``partition`` before ``next_offset`` (a
        redelivered event never lowers the watermark): the (key, value) changelog record to send on changelog
        partition ``partition``, or None when ``next_offset`` does not raise the watermark."""
        if next_offset <= self.watermark(partition):
            return None
        record = WATERMARK_KEY + str(partition).encode(), str(next_offset).encode()
        self.data[record[0]] = record[1]
        return record

    def watermark(self, partition: int) -> int:
        """The usage offset up to which the rows of ``partition`` are known to hold the events (0: none)."""
        value = self.data.get(WATERMARK_KEY + str(partition).encode())
        return 0 if value is None else int(value)

    def partition_of(self, key: bytes) -> int:
        """The partition of a row's key: a watermark's own, or Kafka's default partitioner's for a service."""
        if key.startswith(WATERMARK_KEY):
            return int(key[len(WATERMARK_KEY) :])
        return (murmur2(key) & 0x7FFFFFFF) % (self.partitions or 1)

    async def reload(self, partition: int) -> int:
        """Replace the rows of ``partition`` in memory with the committed ones, read again from the changelog
        (no write goes to the changelog); returns the end offset read to. For a partition active here, Faust's
        records up to that offset are no longer applied (:meth:`apply_changelog_batch`)."""
        assert self.bootstrap is not None, "the worker sets the table's bootstrap"
        latest, end = await read_partition(self.bootstrap, self.changelog_topic.get_topic_name(), partition)
        for key in [k for k in self.data.keys() if self.partition_of(k) == partition]:
            del self.data[key]
        self.data.update({key: value for key, value in latest.items() if value is not None})
        tp = TP(self.changelog_topic.get_topic_name(), partition)
        if tp in self._actives:  # in the same step as the rows: no older record applied in between
            self._read[tp] = max(self._read.get(tp, -1), end - 1)
        return end

    def services(self) -> int:
        """How many services have a row (the watermarks are not services)."""
        return len(self) - sum(WATERMARK_KEY + str(p).encode() in self for p in range(self.partitions or 0))
