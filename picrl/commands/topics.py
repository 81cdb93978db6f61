"""``picrl topics create``: the five picrl topics with their partitions, retention and compaction."""
from __future__ import annotations

import argparse
import asyncio

from picrl.kafka import BrokerError, LocalKafka
from stream.topics import ensure_topics, topic_specs


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "topics", help="create picrl's Kafka topics (usage, actions, replay, policy, deadletter)",
        description="Create the topics a picrl deployment uses, with the partition counts and retention or "
                    "compaction each needs (replay is bounded, policy is compacted). Existing topics are kept; one "
                    "with fewer partitions than asked is an error. Without --bootstrap the local broker "
                    "(`picrl kafka start`) is used.")
    parser.add_argument("action", choices=["create"], help="what to do")
    parser.add_argument("--bootstrap", metavar="HOST:PORT", help="a Kafka cluster (default: the local broker)")
    parser.add_argument("--prefix", default="picrl", help="topic name prefix (default picrl)")
    parser.add_argument("--partitions", type=int, default=8,
                        help="partitions of the keyed topics; scale-out is one worker per few partitions (default 8)")
    parser.set_defaults(handler=run)


def bootstrap_or_local(bootstrap: str | None) -> str:
    """The given bootstrap address, else the running local broker's."""
    if bootstrap:
        return bootstrap
    info = LocalKafka().status()
    if info is None:
        raise BrokerError("no --bootstrap given and no local broker is running: start one with `picrl kafka start`")
    return info.bootstrap


def run(args: argparse.Namespace) -> int:
    bootstrap = bootstrap_or_local(args.bootstrap)
    specs = topic_specs(args.prefix, args.partitions)
    outcome = asyncio.run(ensure_topics(bootstrap, specs))
    for spec in specs:
        settings = ", ".join(f"{k}={v}" for k, v in spec.config.items())
        print(f"{outcome[spec.name]:>7}  {spec.name}  partitions={spec.partitions}  {settings}")
    return 0
