"""``picrl topics create``: the five picrl topics with their partitions, replication, retention and compaction."""

from __future__ import annotations

import argparse
import asyncio

from picrl.commands.bus import add_bus_arguments, add_replication_arguments, reachable_bootstrap, settings_from_args
from stream.topics import cluster_brokers, ensure_topics, topic_specs


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "topics",
        help="create picrl's Kafka topics (usage, actions, replay, policy, deadletter)",
        description="Create the topics a picrl deployment uses, with the partition counts and retention or "
        "compaction each needs (replay is bounded, policy is compacted), min(3, live brokers) replicas "
        "and min.insync.replicas one less (1 on a single broker) unless set. Existing topics are kept; "
        "one with fewer partitions than asked is an error. Without --bootstrap the local broker "
        "(`picrl kafka start`) is used.",
    )
    parser.add_argument("action", choices=["create"], help="what to do")
    add_bus_arguments(parser)
    add_replication_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    bootstrap = reachable_bootstrap(settings, "topics")
    specs = topic_specs(settings["prefix"], settings["partitions"])

    async def create() -> tuple[dict[str, str], str]:
        replication = settings.replication(await cluster_brokers(bootstrap))
        outcome = await ensure_topics(bootstrap, specs, replication)
        return outcome, f"replicas={replication.factor}  min.insync.replicas={replication.min_insync}"

    outcome, replicas = asyncio.run(create())
    for spec in specs:
        configs = ", ".join(f"{k}={v}" for k, v in spec.config.items())
        shown = f"{replicas}  " if outcome[spec.name] == "created" else ""
        print(f"{outcome[spec.name]:>7}  {spec.name}  partitions={spec.partitions}  {shown}{configs}")
    return 0
