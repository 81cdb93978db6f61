"""``picrl kafka start|stop|status``: the project-provisioned Kafka cluster (one node by default, or N)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from picrl.kafka import KAFKA_VERSION, BrokerInfo, LocalKafka
from picrl.kafka.local_broker import default_cache, default_home


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "kafka",
        help="run a local Apache Kafka cluster (KRaft; one node, or --brokers N) for picrl",
        description=f"Run Apache Kafka {KAFKA_VERSION} in KRaft mode on free loopback ports, without Docker: one "
        "node, or --brokers N nodes, each broker and controller at once (the controller quorum is all "
        "of them). Kafka's internal topics get min(3, N) replicas and min.insync.replicas one less (1 on "
        "one node). On first use the jars are fetched from Maven Central with `mvn` into a cache folder "
        f"(default {default_cache()}); each node's config, data, log and pid file live under the home "
        f"folder (default {default_home()}), in node-<i>/. status and stop handle every node.",
    )
    parser.add_argument("action", choices=["start", "stop", "status"], help="what to do with the cluster")
    parser.add_argument("--home", type=Path, default=None, help="folder the cluster owns (env PICRL_KAFKA_HOME)")
    parser.add_argument("--cache", type=Path, default=None, help="folder for the Kafka jars (env PICRL_CACHE)")
    parser.add_argument(
        "--brokers",
        type=int,
        default=None,
        help="nodes of a new cluster (default 1); a home keeps the count it was first started with",
    )
    parser.add_argument(
        "--port", type=int, default=None, help="client port of node 1 (default: a free one, kept afterwards)"
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the nodes to answer")
    parser.add_argument("--json", action="store_true", help="print the cluster's state as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    cluster = LocalKafka(args.home, args.cache, port=args.port, brokers=args.brokers)
    if args.action == "start":
        started = time.monotonic()
        info = cluster.start(timeout=args.timeout)
        pids = ", ".join(str(node.pid) for node in info.nodes)
        _print(
            args,
            info.as_dict(),
            f"Kafka {info.version} is up at {info.bootstrap} ({_nodes(info)}, pid {pids}, home {info.home}, "
            f"{time.monotonic() - started:.1f} s)",
        )
        return 0
    if args.action == "stop":
        running = cluster.status()
        stopped = cluster.stop()
        count = len(running.running) if running is not None else 0
        _print(
            args,
            {"stopped": stopped, "nodes": count},
            f"stopped {count} node(s)" if stopped else f"no broker running in {cluster.home}",
        )
        return 0
    info = cluster.status()
    if info is None:
        _print(args, {"running": False}, f"no broker running in {cluster.home}")
        return 1
    seen = cluster.brokers_seen(info)
    healthy = len(seen) == len(info.nodes) and all(count == len(info.nodes) for count in seen.values())
    nodes = [{**node, "brokers_seen": seen.get(node["node_id"], 0)} for node in info.as_dict()["nodes"]]
    controller = cluster.active_controller()
    lines = [
        f"{_nodes(info)}, bootstrap {info.bootstrap}, "
        f"{'all answering' if healthy else 'NOT all answering'}, active controller "
        f"{'unknown' if controller is None else f'node {controller}'} (home {info.home})"
    ]
    lines += [
        f"  node {n.node_id}: "
        + (
            f"pid {n.pid}, {n.bootstrap}, "
            + (
                f"answering, sees {seen[n.node_id]} of {len(info.nodes)} broker(s)"
                if seen[n.node_id]
                else "NOT answering"
            )
            if n.pid is not None
            else f"not running ({n.bootstrap})"
        )
        for n in info.nodes
    ]
    data = {**info.as_dict(), "nodes": nodes, "running": True, "answers": healthy, "active_controller": controller}
    _print(args, data, "\n".join(lines))
    return 0 if healthy else 1


def _nodes(info: BrokerInfo) -> str:
    return f"{len(info.running)} of {len(info.nodes)} node(s) running"


def _print(args: argparse.Namespace, data: dict, text: str) -> None:
    print(json.dumps(data) if args.json else text)
