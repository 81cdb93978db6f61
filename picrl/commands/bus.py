"""Shared CLI options of the commands that talk to Kafka: where the broker is and which topics."""
from __future__ import annotations

import argparse
import logging

from picrl.kafka import BrokerError, LocalKafka


def add_bus_arguments(parser: argparse.ArgumentParser, *, partitions: bool = True) -> None:
    group = parser.add_argument_group("Kafka")
    group.add_argument("--bootstrap", metavar="HOST:PORT",
                       help="a Kafka cluster (default: the local broker of `picrl kafka start`)")
    group.add_argument("--prefix", default="picrl",
                       help="topic name prefix: <prefix>.usage, .actions, .replay, .policy, .deadletter (default picrl)")
    if partitions:
        group.add_argument("--partitions", type=int, default=8,
                           help="partitions of the keyed topics; scale out with one worker per few partitions (default 8)")


def bootstrap_or_local(bootstrap: str | None) -> str:
    """The given bootstrap address, else the running local broker's."""
    if bootstrap:
        return bootstrap
    info = LocalKafka().status()
    if info is None:
        raise BrokerError("no --bootstrap given and no local broker is running: start one with `picrl kafka start`")
    return info.bootstrap


def configure_logging(level: str) -> None:
    """Plain one-line logs on stderr; Kafka clients only above warnings unless debugging."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if level.upper() != "DEBUG":
        for noisy in ("aiokafka", "kafka", "faust", "mode"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        logging.getLogger("mode.timers").setLevel(logging.ERROR)  # "Timer commit is overlapping" at short intervals
