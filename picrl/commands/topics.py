"""``picrl topics create``: the five picrl topics with their partitions, retention and compaction."""
from __future__ import annotations

import argparse
import asyncio

from picrl.commands.bus import add_bus_arguments, bootstrap_or_local, settings_from_args
from stream.topics import ensure_topics, topic_specs


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "topics", help="create picrl's Kafka topics (usage, actions, replay, policy, deadletter)",
        description="Create the topics a picrl deployment uses, with the partition counts and retention or "
                    "compaction each needs (replay is bounded, policy is compacted). Existing topics are kept; one "
                    "with fewer partitions than asked is an error. Without --bootstrap the local broker "
                    "(`picrl kafka start`) is used.")
    parser.add_argument("action", choices=["create"], help="what to do")
    add_bus_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    bootstrap = bootstrap_or_local(settings["bootstrap"])
    specs = topic_specs(settings["prefix"], settings["partitions"])
    outcome = asyncio.run(ensure_topics(bootstrap, specs))
    for spec in specs:
        settings = ", ".join(f"{k}={v}" for k, v in spec.config.items())
        print(f"{outcome[spec.name]:>7}  {spec.name}  partitions={spec.partitions}  {settings}")
    return 0
