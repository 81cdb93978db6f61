"""``picrl kafka start|stop|status``: the project-provisioned single-node Kafka broker."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from picrl.kafka import KAFKA_VERSION, LocalKafka
from picrl.kafka.local_broker import default_cache, default_home
from picrl.kafka.probe import answers_metadata


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "kafka", help="run a local single-node Apache Kafka broker (KRaft) for picrl",
        description=f"Run Apache Kafka {KAFKA_VERSION} in KRaft mode on a free loopback port, without Docker. "
                    "On first use its jars are fetched from Maven Central with `mvn` into a cache folder "
                    f"(default {default_cache()}); the broker's config, data, log and pid/port file live in "
                    f"its home folder (default {default_home()}).",
    )
    parser.add_argument("action", choices=["start", "stop", "status"], help="what to do with the broker")
    parser.add_argument("--home", type=Path, default=None, help="folder the broker owns (env PICRL_KAFKA_HOME)")
    parser.add_argument("--cache", type=Path, default=None, help="folder for the Kafka jars (env PICRL_CACHE)")
    parser.add_argument("--port", type=int, default=None, help="client port (default: a free one, kept afterwards)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the broker to answer")
    parser.add_argument("--json", action="store_true", help="print the broker's state as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    broker = LocalKafka(args.home, args.cache, port=args.port)
    if args.action == "start":
        started = time.monotonic()
        info = broker.start(timeout=args.timeout)
        _print(args, info.__dict__ | {"bootstrap": info.bootstrap},
               f"Kafka {info.version} is up at {info.bootstrap} (pid {info.pid}, home {info.home}, "
               f"{time.monotonic() - started:.1f} s)")
        return 0
    if args.action == "stop":
        stopped = broker.stop()
        _print(args, {"stopped": stopped}, "broker stopped" if stopped else f"no broker running in {broker.home}")
        return 0
    info = broker.status()
    if info is None:
        _print(args, {"running": False}, f"no broker running in {broker.home}")
        return 1
    healthy = answers_metadata(info.bootstrap)
    _print(args, info.__dict__ | {"bootstrap": info.bootstrap, "running": True, "answers": healthy},
           f"running: pid {info.pid}, bootstrap {info.bootstrap}, "
           f"{'answering metadata requests' if healthy else 'NOT answering metadata requests'}")
    return 0 if healthy else 1


def _print(args: argparse.Namespace, data: dict, text: str) -> None:
    print(json.dumps(data) if args.json else text)
