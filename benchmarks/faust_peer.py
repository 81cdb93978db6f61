"""The stream worker's peer in benchmarks/stream_throughput.py: a bare Faust app that decides nothing.

    python benchmarks/faust_peer.py --bootstrap HOST:PORT --prefix P --app-id ID --partitions N \\
        --batch-max N --batch-within S --commit-interval S --action-bytes N --transition-bytes N

The same topics, partitions, processing guarantee (``exactly_once``), batches and commits as ``picrl worker``
with those settings: Faust's ``take_events(batch_max, within=batch_within)``, Faust's commit every
``commit_interval`` seconds, ``acks=all``. It reads each usage event (its tick and ``produced_at``) and writes an
action-sized record (``decided_at``, ``source_produced_at``, ``tick``: the next one, as an action's) to
``<prefix>.actions`` and a transition-sized one to ``<prefix>.replay``, both keyed by the service, in the
partition of the event and in the transaction of its source partition (Faust's ``topic.send`` would send outside
any transaction: faust-streaming issue #177). What the worker adds on top of this is its own latency.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import AsyncIterator

import faust
import orjson
from faust.types import StreamT

from stream.topics import TopicNames


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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


def peer_app(args: argparse.Namespace) -> faust.App:
    app = faust.App(
        args.app_id,
        broker=f"kafka://{args.bootstrap}",
        store="memory://",
        processing_guarantee="exactly_once",
        topic_partitions=args.partitions,
        topic_disable_leader=True,
        producer_acks="all",
        broker_commit_interval=args.commit_interval,
        web_enabled=False,
    )
    names = TopicNames(args.prefix)
    usage = app.topic(names.usage, key_serializer="raw", value_serializer="raw", partitions=args.partitions)
    transition = b"t" * args.transition_bytes

    async def relay(stream: StreamT) -> AsyncIterator[None]:
        async for events in stream.take_events(args.batch_max, within=args.batch_within):
            group = app.assignor.group_for_topic(names.usage)  # known once partitions are assigned
            for event in events:
                source = event.message.partition
                transaction = f"{app.conf.id}-{group}-{source}"
                value = orjson.loads(event.message.value)
                action = action_record(value["tick"], value.get("produced_at", 0.0), args.action_bytes)
                key = event.message.key
                await app.producer.send(names.actions, key, action, source, None, None, transactional_id=transaction)
                await app.producer.send(names.replay, key, transition, source, None, None, transactional_id=transaction)
            yield None

    app.agent(usage, name="relay")(relay)
    return app


def main() -> None:
    args = _arguments()
    worker = faust.Worker(peer_app(args), loglevel="WARNING", quiet=True, redirect_stdouts=False)
    worker.spinner = None
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
