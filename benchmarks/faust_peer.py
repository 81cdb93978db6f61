"""The stream worker's peer in benchmarks/stream_throughput.py: the same Faust app, deciding nothing.

    python benchmarks/faust_peer.py --model MODEL --bootstrap HOST:PORT --prefix P --app-id ID --partitions N \\
        --batch-max N --batch-within S --commit-interval S --action-bytes N --transition-bytes N

It is ``picrl worker``'s Faust app (stream/worker.py) with the same topics, partitions, guarantee
(``exactly_once``), batches (``take_ready``), record batches (stream/outbox.py), commits (stream/commit_clock.py)
and ``acks=all``, with the decision stage taken out: for each usage event it writes an action-sized record
(``decided_at``, ``source_produced_at``, ``tick``: the next one, as an action's) to ``<prefix>.actions`` and a
transition-sized one to ``<prefix>.replay``, keyed by the service, in the transaction of its source partition, and
the worker's watermark row per source partition and batch to the table's changelog (so its transactions span the
same partitions, and its restarts find the rows the worker's rebalance guard asks for). It reads of an event only
its tick and ``produced_at``, keeps no service row, writes no dead letter and keeps no metrics. So the worker's
latency over the peer's is the share of its decisions, their state and their metrics; the rest is Faust and Kafka.

A bare Faust app (one ``send`` per record, Faust's own commits: one transaction per partition on its timer) was
measured in this place first and fell behind at every load (commit 7c7d81c, benchmarks/results/stream-2026-11-28-peer):
a yardstick slower than the worker says nothing about the worker's own share.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import faust
import orjson
from faust.types import EventT

from picrl_core.deployable import load_model
from stream.decisions import BatchOutcome
from stream.outbox import Outbox, key_partition, send_outbox
from stream.worker import PreparedBatch, StreamWorker, WorkerSettings


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="the worker's model folder")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--app-id", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--batch-max", type=int, required=True)
    parser.add_argument("--batch-within", type=float, required=True)
    parser.add_argument("--commit-interval", type=float, required=True)
    parser.add_argument("--action-bytes", type=int, required=True)
    parser.add_argument("--transition-bytes", type=int, required=True)
    return parser.parse_args()


def action_record(tick: int, produced_at: float, size: int) -> bytes:
    """An action-sized JSON record: the fields the benchmark times an action by, padded to ``size`` bytes."""
    record = orjson.dumps({"tick": tick + 1, "decided_at": time.time(), "source_produced_at": produced_at, "pad": ""})
    return record[:-2] + b"x" * max(0, size - len(record)) + b'"}'


class Relay(StreamWorker):
    """The worker's app with :meth:`prepare` writing fixed-size records instead of deciding."""

    def __init__(self, settings: WorkerSettings, args: argparse.Namespace) -> None:
        super().__init__(settings, load_model(args.model))
        self.action_bytes = args.action_bytes
        self.transition = b"t" * args.transition_bytes

    async def prepare(self, events: Sequence[EventT]) -> PreparedBatch:
        topics, outbox = self.topics, Outbox()
        changelog = self.states.changelog_topic.get_topic_name()
        partitions = await self._partition_counts(changelog)
        for partition in sorted({e.message.partition for e in events}):
            end = 1 + max(e.message.offset for e in events if e.message.partition == partition)
            mark = self.states.advance_watermark(partition, end)
            if mark is not None:
                outbox.add(partition, changelog, partition, *mark)
        for event in events:
            message = event.message
            value = orjson.loads(message.value)
            action = action_record(value["tick"], value.get("produced_at", 0.0), self.action_bytes)
            key = message.key
            outbox.add(message.partition, topics.actions, key_partition(key, partitions[topics.actions]), key, action)
            outbox.add(
                message.partition, topics.replay, key_partition(key, partitions[topics.replay]), key, self.transition
            )
        return PreparedBatch(events, [], BatchOutcome(), [], outbox)

    async def send(self, batch: PreparedBatch) -> list[asyncio.Future]:
        return await send_outbox(batch.outbox, self._producer_for)


def main() -> None:
    args = _arguments()
    settings = WorkerSettings(
        args.bootstrap,
        prefix=args.prefix,
        app_id=args.app_id,
        partitions=args.partitions,
        batch_max=args.batch_max,
        batch_within=args.batch_within,
        commit_interval=args.commit_interval,
        instance_id=f"{args.app_id}-0",  # a static member, as picrl worker's default instance id makes the worker
    )
    worker = faust.Worker(Relay(settings, args).app, loglevel="WARNING", quiet=True, redirect_stdouts=False)
    worker.spinner = None
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
