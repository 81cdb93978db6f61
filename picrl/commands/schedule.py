"""``picrl schedule``: an example scheduler printing the ``kubectl patch`` commands that apply the actions."""

from __future__ import annotations

import argparse
import asyncio

from aiokafka import AIOKafkaConsumer

from picrl.commands.bus import add_bus_arguments, reachable_bootstrap, settings_from_args
from picrl.kubernetes import Scheduler
from stream.records import DecodeError, decode_action
from stream.topics import TopicNames


def _mapping(text: str) -> tuple[str, str]:
    name, sep, kubernetes = text.partition("=")
    if not sep or not name or not kubernetes:
        raise argparse.ArgumentTypeError(f"expected PICRL=KUBERNETES, e.g. gpu_mem=memory; got {text!r}")
    return name, kubernetes


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "schedule",
        help="print the kubectl patch commands that would apply the actions to Kubernetes pods (dry run)",
        description="An example scheduler: read <prefix>.actions (read_committed) and print, for each service's "
        "newest decision that changes its capacity, the kubectl patch command applying it: an in-place resize of "
        "the pod's container limit, or the recommendation of a VerticalPodAutoscaler. Service ids are "
        "<namespace>/<pod>/<container> (or <pod>/<container>). Nothing is run: pipe the output to a shell to "
        "apply it.",
    )
    parser.add_argument(
        "--method",
        choices=("resize", "vpa"),
        default="resize",
        help="resize: kubectl patch pod --subresource resize (Kubernetes 1.33+); vpa: write the recommendation "
        "of the VerticalPodAutoscaler named after the pod part of the service id (default resize)",
    )
    parser.add_argument(
        "--resource",
        default="memory",
        help="the Kubernetes resource a single-resource action's capacity sets: memory (bytes) or cpu (cores) "
        "(default memory)",
    )
    parser.add_argument(
        "--map",
        action="append",
        type=_mapping,
        default=[],
        metavar="PICRL=KUBERNETES",
        help="for several-resource actions, the Kubernetes resource of each picrl resource, e.g. "
        "--map gpu_mem=memory (resources not mapped are left alone)",
    )
    parser.add_argument("--namespace", default="default", help="for service ids without one (default default)")
    parser.add_argument(
        "--follow", action="store_true", help="keep printing new actions (default: stop at the topic's end)"
    )
    add_bus_arguments(parser, partitions=False)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    bootstrap = reachable_bootstrap(settings)
    names = {"": args.resource, **dict(args.map)}
    scheduler = Scheduler(names, args.method, args.namespace)
    asyncio.run(_print_commands(bootstrap, TopicNames(settings["prefix"]).actions, scheduler, args.follow))
    return 0


async def _print_commands(bootstrap: str, topic: str, scheduler: Scheduler, follow: bool) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False)
    await consumer.start()
    try:
        if topic not in await consumer.topics():
            raise ValueError(
                f"topic {topic} does not exist: check --prefix, or create the topics (`picrl topics create`)"
            )
        consumer.subscribe([topic])  # without a group: every partition, from the start
        while not consumer.assignment():
            await asyncio.sleep(0.1)
        partitions = sorted(consumer.assignment())
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        while follow or [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                for message in messages:
                    try:
                        action = decode_action(message.value)
                    except DecodeError:
                        continue  # not an action of this schema: a scheduler applies what it understands
                    command = scheduler.command(action)
                    if command is not None:
                        print(command, flush=True)
    finally:
        await consumer.stop()
